"""Compile the CPU backend's and the sampler's numba kernels into numba's on-disk cache, once,
before the suite runs (scripts/test.sh does, ahead of pytest).

On a fresh checkout that cache is empty. Each pytest-xdist worker would then compile the
kernels its first tests need, both of them at once on a 2-core machine, the same kernels
twice; compiled here first, every worker and every server process the tests start loads
them from the cache instead. Only a head start: a kernel this misses is compiled where it
is first used, as it always was. A cache that holds kernels of these sources already is left
as it is (--force compiles anyway). Usage: .venv/bin/python tests/support/warm_kernels.py
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

import numpy as np

VERSIONS = ("4", "5.0", "5.1", "5.2", "6", "7")
# Each file form and load option takes kernels of its own (a read-only mapped weight is a
# type of its own to numba, an fp16 weight another, int8 and nf4 theirs).
FORMS = (("pth", "bf16", {}), ("st", "fp16", {}), ("pth", "fp32", {}),
         ("pth", "bf16", dict(quant=99, quant_type="int8", quant_head=True)),
         ("pth", "bf16", dict(quant=99, quant_type="nf4")))


def main() -> int:
    from ai00_like.rwkv.cpu.skinny import skinny_matmul

    if skinny_matmul is None:
        print("warm_kernels: numba is not installed; nothing to compile")
        return 0
    from numba.core import config  # its CACHE_DIR: the folder named by the kernels' sources (jit.py)

    if any(Path(config.CACHE_DIR).rglob("*.nbi")) and "--force" not in sys.argv:
        print(f"warm_kernels: numba's cache holds kernels of these sources already ({config.CACHE_DIR})")
        return 0
    from ai00_like.rwkv import load_model
    from ai00_like.rwkv.batch import StepInput
    from ai00_like.rwkv.formats.pth import write_pth
    from ai00_like.rwkv.formats.safetensors import write_safetensors
    from ai00_like.rwkv.synthetic import make_checkpoint
    from ai00_like.sampler import fused

    started = time.monotonic()
    with tempfile.TemporaryDirectory(prefix="warm-kernels-") as folder:
        for version in VERSIONS:
            tensors = make_checkpoint(version, n_layer=2, n_embd=128, head_size=32, vocab=8192, seed=3)
            for fmt, dtype, options in FORMS:
                if options and version != "7":
                    continue  # the quantised kernels are the same for every version
                path = Path(folder) / f"v{version}-{dtype}.{fmt}"
                if not path.exists():
                    write_pth(tensors, path, dtype) if fmt == "pth" else write_safetensors(tensors, path, dtype=dtype)
                model = load_model(path, device="cpu", max_batch=6, **options)
                model.forward([5, 17, 300, 42] * 20)
                for rows in (1, 3, 6):
                    model.step([StepInput(slot, [slot + 1]) for slot in range(rows)])
    fused.warm_up()
    fused.sample([np.zeros(fused.MIN_VOCAB, dtype=np.float32)] * 3, [None] * 3, np.full(3, 2),
                 *(np.ones(3) * 0.5,) * 3)
    print(f"warm_kernels: the kernels are in numba's cache ({time.monotonic() - started:.0f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
