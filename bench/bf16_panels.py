"""bf16 matrices in panels against rows, one process (cpu/panel_bf16.py).

The seeded bf16 `.pth` of a shape is loaded twice, once with its projections and head in
panels (as a model at least panel_bf16.PANEL_WIDTH wide keeps them on AVX-512) and once in
rows, and each step of one is followed by the same step of the other, so the machine's
changes of speed fall on both. Prints tokens/s of each, the median step-time ratio
(rows / panels) at each batch, and the logits' largest difference over their spread.

    .venv/bin/python bench/bf16_panels.py --shape 1.5B
"""

from __future__ import annotations

import argparse
import json
import time

import numpy as np

import record
from shapes import SHAPES, bf16_checkpoint

from ai00_like.rwkv import load_model
from ai00_like.rwkv.batch import StepInput
from ai00_like.rwkv.cpu import model as cpu_model
from ai00_like.rwkv.cpu import panels

BATCHES = (1, 2, 4, 8, 16)


def load_both(path: str):
    in_panels = cpu_model.keeps_bf16_panels
    cpu_model.keeps_bf16_panels = lambda precision, width: precision == "bf16" and panels.available()
    try:
        wide = load_model(path, device="cpu", max_batch=max(BATCHES))
        cpu_model.keeps_bf16_panels = lambda precision, width: False
        rows = load_model(path, device="cpu", max_batch=max(BATCHES))
    finally:
        cpu_model.keeps_bf16_panels = in_panels
    return wide, rows


def paired(a, b, run, count: int) -> tuple[np.ndarray, np.ndarray]:
    ta, tb = [], []
    for _ in range(count):
        t = time.perf_counter(); run(a); ta.append(time.perf_counter() - t)
        t = time.perf_counter(); run(b); tb.append(time.perf_counter() - t)
    return np.array(ta), np.array(tb)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", choices=list(SHAPES), default="0.1B")
    parser.add_argument("--no-save", action="store_true", help=record.NO_SAVE_HELP)
    args = parser.parse_args()
    wide, rows = load_both(str(bf16_checkpoint(args.shape)))
    assert panels.available() and type(wide.head) is not type(rows.head), "no AVX-512: nothing to compare"
    prompt = np.random.default_rng(0).integers(0, SHAPES[args.shape]["vocab"], 512).tolist()
    want, _ = rows.forward(prompt[:64], full_output=True)
    got, _ = wide.forward(prompt[:64], full_output=True)
    results = {"shape": args.shape, "logit_error": float((np.abs(got - want).max(axis=1) / want.std(axis=1)).max())}
    for n in (128, 512):
        ta, tb = paired(wide, rows, lambda m: m.forward(prompt[:n]), 3)
        results[f"prefill_{n}"] = {"panels_tps": n / ta.min(), "rows_tps": n / tb.min()}
    for b in BATCHES:
        inputs = [StepInput(slot, [prompt[slot]]) for slot in range(b)]
        paired(wide, rows, lambda m: m.step(inputs), 3)
        ta, tb = paired(wide, rows, lambda m: m.step(inputs), max(24, 96 // b))
        results[f"batch_{b}"] = {"panels_tps": b / float(np.median(ta)), "rows_tps": b / float(np.median(tb)),
                                 "ratio": float(np.median(tb / ta))}
    for name, figures in results.items():
        print(name, figures if not isinstance(figures, dict) else
              ", ".join(f"{k} {v:.2f}" for k, v in figures.items()))
    print(json.dumps(results))
    record.save("bf16_panels", results, args)


if __name__ == "__main__":
    main()
