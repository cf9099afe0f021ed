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
torch.set_num_threads(int(sys.argv[2]))
from rwkv.model import RWKV
for job in json.loads(sys.argv[1]):
    model = RWKV(model=job["model"], strategy="cpu fp32", **({} if job["v7"] else {"verbose": False}))
    logits, state = model.forward(job["prompt"], None)
    rows, tokens = [logits.float().numpy().copy()], []
    for _ in range(job["steps"]):
        tok = int(torch.argmax(logits))
        tokens.append(tok)
        logits, state = model.forward([tok], state)
        rows.append(logits.float().numpy().copy())
    np.savez(job["out"], logits=np.stack(rows), tokens=np.array(tokens))
"""


def available() -> bool:
    return importlib.util.find_spec("torch") is not None and importlib.util.find_spec("rwkv") is not None


def save_pth(tensors: dict[str, np.ndarray], path: Path) -> None:
    import torch

    torch.save({k: torch.from_numpy(np.array(v, dtype=np.float32)) for k, v in tensors.items()}, path)


def greedy_run(tensors: dict[str, np.ndarray], version: str, prompt: list[int], steps: int,
               threads: int = 2) -> tuple[np.ndarray, np.ndarray]:
    """(logits [1 + steps, V], greedy tokens [steps]) from the reference package."""
    return greedy_runs([(tensors, prompt)], version == "7", steps, threads)[0]


def greedy_runs(jobs: list[tuple[dict[str, np.ndarray], list[int]]], v7: bool, steps: int,
                threads: int = 2) -> list[tuple[np.ndarray, np.ndarray]]:
    """`greedy_run` for several checkpoints of v7 (or all of v4–v6) in one subprocess: the
    package picks its model code at import time, and importing torch is the slow part."""
    with tempfile.TemporaryDirectory() as tmp:
        specs = []
        for n, (tensors, prompt) in enumerate(jobs):
            ckpt = Path(tmp) / f"model{n}.pth"
            save_pth(tensors, ckpt)
            # v7's loader appends ".pth" itself; the v4–v6 one accepts the full name.
            specs.append({"model": str(ckpt.with_suffix("")) if v7 else str(ckpt), "prompt": prompt, "steps": steps,
                          "v7": v7, "out": str(Path(tmp) / f"out{n}.npz")})
        env = dict(os.environ, RWKV_JIT_ON="1", RWKV_CUDA_ON="0", RWKV_V7_ON="1" if v7 else "0")
        subprocess.run([sys.executable, "-c", _RUNNER, json.dumps(specs), str(threads)],
                       env=env, check=True, capture_output=True)
        return [(data["logits"], data["tokens"]) for data in map(np.load, (spec["out"] for spec in specs))]
