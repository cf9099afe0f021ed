"""Run the reference `rwkv` package (0.8.32, torch CPU fp32) on a checkpoint, in a subprocess.

A subprocess because the package picks v4–v6 or v7 code from an environment variable at
import time. Used by the golden-file generator and by the live conformance tests.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

_RUNNER = r"""
import json, sys
import numpy as np, torch
torch.set_num_threads(int(sys.argv[4]))
from rwkv.model import RWKV
spec = json.loads(sys.argv[3])
model = RWKV(model=sys.argv[1], strategy="cpu fp32", **({} if spec["v7"] else {"verbose": False}))
logits, state = model.forward(spec["prompt"], None)
rows, tokens = [logits.float().numpy().copy()], []
for _ in range(spec["steps"]):
    tok = int(torch.argmax(logits))
    tokens.append(tok)
    logits, state = model.forward([tok], state)
    rows.append(logits.float().numpy().copy())
np.savez(sys.argv[2], logits=np.stack(rows), tokens=np.array(tokens))
"""


def available() -> bool:
    return importlib.util.find_spec("torch") is not None and importlib.util.find_spec("rwkv") is not None


def save_pth(tensors: dict[str, np.ndarray], path: Path) -> None:
    import torch

    torch.save({k: torch.from_numpy(np.ascontiguousarray(v, dtype=np.float32)) for k, v in tensors.items()}, path)


def greedy_run(tensors: dict[str, np.ndarray], version: str, prompt: list[int], steps: int,
               threads: int = 2) -> tuple[np.ndarray, np.ndarray]:
    """(logits [1 + steps, V], greedy tokens [steps]) from the reference package."""
    with tempfile.TemporaryDirectory() as tmp:
        ckpt = Path(tmp) / "model.pth"
        save_pth(tensors, ckpt)
        out = Path(tmp) / "out.npz"
        env = dict(os.environ, RWKV_JIT_ON="1", RWKV_CUDA_ON="0", RWKV_V7_ON="1" if version == "7" else "0")
        spec = json.dumps({"prompt": prompt, "steps": steps, "v7": version == "7"})
        # v7's loader appends ".pth" itself; the v4–v6 one accepts the full name.
        name = str(ckpt.with_suffix("")) if version == "7" else str(ckpt)
        subprocess.run([sys.executable, "-c", _RUNNER, name, str(out), spec, str(threads)],
                       env=env, check=True, capture_output=True)
        data = np.load(out)
        return data["logits"], data["tokens"]
