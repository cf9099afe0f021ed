"""Regenerate the golden logits of tests/golden/*.npz with the reference `rwkv` package.

    .venv/bin/pip install torch==2.13.0 rwkv==0.8.32
    .venv/bin/python tests/golden/make_golden.py
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "support"))

from conformance_cases import CASES, GREEDY_STEPS, prompt_for  # noqa: E402
from reference import greedy_run  # noqa: E402

from ai00_like.rwkv.synthetic import make_checkpoint  # noqa: E402


def main() -> None:
    for name, (version, kwargs) in CASES.items():
        tensors = make_checkpoint(version, **kwargs)
        prompt = prompt_for(name, kwargs["vocab"])
        logits, tokens = greedy_run(tensors, version, prompt, GREEDY_STEPS)
        np.savez_compressed(HERE / f"{name}.npz", prompt=np.array(prompt), logits=logits.astype(np.float32),
                            tokens=tokens)
        print(f"{name}: logits {logits.shape}, greedy {tokens[:8].tolist()}…")


if __name__ == "__main__":
    main()
