"""Did a refactoring change any number? Logits and states of every RWKV version, bit for bit.

    python scripts/same_logits.py capture before.npz   # on the old code (e.g. a `git archive` of it)
    python scripts/same_logits.py capture after.npz    # on the new
    python scripts/same_logits.py compare before.npz after.npz

Runs small seeded synthetic models (v4, v5.0–5.2, v6, v7) through `forward` (every token's
logits, the state), a mixed batched `step` and a decode step, and `forward_hidden`: on numpy,
and on the first WebGPU adapter (software ones too) in fp32, fp16 and Int8 when wgpu has one.
The tests compare backends within tolerances; this compares one backend with itself exactly,
so it needs the same machine for both captures.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

# The checkout this script is in, before any installed copy of the package.
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ai00_like.rwkv.batch import StepInput
from ai00_like.rwkv.cpu.model import CpuModel
from ai00_like.rwkv.info import VERSIONS, detect
from ai00_like.rwkv.synthetic import make_checkpoint


def backends(tensors, info):
    """(name, model) pairs: numpy, then the GPU's storage formats where an adapter is there."""
    yield "cpu", CpuModel(tensors, info, max_batch=3)
    try:
        from ai00_like.rwkv.gpu.device import best_adapter
        from ai00_like.rwkv.gpu.model import GpuModel
    except ImportError:
        return
    adapter = best_adapter(allow_software=True)
    if adapter is None:
        return
    yield "gpu-fp32", GpuModel(tensors, info, max_batch=3, adapter=adapter.index, precision="fp32")
    yield "gpu-fp16", GpuModel(tensors, info, max_batch=3, adapter=adapter.index, precision="fp16")
    if info.version in ("6", "7"):
        yield "gpu-int8", GpuModel(tensors, info, max_batch=3, adapter=adapter.index, quant=1, quant_type="int8")


def capture(path: str) -> None:
    out = {}
    prompt = np.random.default_rng(1).integers(0, 300, 20).tolist()
    for version in VERSIONS:
        shape = {"n_layer": 2, "n_embd": 64, "vocab": 300, **({"head_size": 32} if version != "4" else {})}
        tensors = make_checkpoint(version, seed=3, **shape)
        info = detect({k: a.shape for k, a in tensors.items()})
        for name, model in backends(tensors, info):
            key = f"{version}/{name}"
            logits, state = model.forward(prompt, full_output=True)
            out.update({f"{key}/forward": logits, **{f"{key}/state.{n}": a for n, a in vars(state).items()}})
            mixed = model.step([StepInput(0, prompt[:7], "all"), StepInput(1, prompt[7:8], "last"),
                                StepInput(2, prompt[8:13], "none")])
            decode = model.step([StepInput(slot, [5 + slot], "last") for slot in range(3)])
            out.update({f"{key}/step{n}": x for n, x in enumerate(mixed + decode) if x is not None})
            out[f"{key}/slot2.wkv"] = model.read_state(2).wkv
            out[f"{key}/hidden"] = model.forward_hidden(prompt[:5])[0]
            print(key, flush=True)
    np.savez(path, **out)


def compare(before: str, after: str) -> int:
    a, b = np.load(before), np.load(after)
    missing = sorted(set(a.files) ^ set(b.files))
    changed = [k for k in sorted(set(a.files) & set(b.files)) if not np.array_equal(a[k], b[k])]
    print(f"{len(a.files)} arrays; missing on one side: {missing or 'none'}; changed: {changed or 'none'}")
    return 1 if missing or changed else 0


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "capture":
        capture(sys.argv[2])
    elif len(sys.argv) == 4 and sys.argv[1] == "compare":
        sys.exit(compare(sys.argv[2], sys.argv[3]))
    else:
        sys.exit(__doc__)
