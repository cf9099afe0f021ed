"""bf16 matrices in panels against rows, or rounded activations against exact ones, one
process (cpu/panel_bf16.py, cpu/rounded_bf16.py).

The seeded bf16 `.pth` of a shape is loaded twice, and each step of one is followed by the
same step of the other, so the machine's changes of speed fall on both:

* `--against rows` (the default): its projections and head in panels (as a model at least
  panel_bf16.PANEL_WIDTH wide keeps them on AVX-512), and in rows;
* `--against exact`: in panels with activations rounded to bf16 (`exact = false`, AVX-512
  BF16), and in panels with fp32 activations (`exact = true`); with `--quant int8+head`,
  every projection and the head quantised to Int8 at load, activations rounded to 16-bit
  integers (vnni.py; on AMX's tiles where the CPU has them) against fp32 ones; with
  `--quant nf4+head`, the projections in NF4 widened to bf16 on AMX's tiles
  (rounded_nf4.py) against exact NF4.

Prints tokens/s of each, the median step-time ratio (the second's over the first's) at each
batch, and the logits' largest difference over their spread.

    .venv/bin/python bench/bf16_panels.py --shape 1.5B [--against exact [--quant int8|int8+head|nf4|nf4+head]]
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
from ai00_like.rwkv.cpu import panels, rounded_bf16, rounded_nf4, vnni

BATCHES = (1, 2, 4, 8, 16)


def load_both(path: str, against: str, quant: str | None):
    """(name, model) of the form measured, then of the one it is measured against."""
    in_panels = cpu_model.keeps_bf16_panels
    cpu_model.keeps_bf16_panels = lambda precision, *_: precision == "bf16" and panels.available()
    quantised = {} if quant is None else dict(quant=1000, quant_type=quant.split("+")[0], quant_head=quant.endswith("+head"))
    load = lambda **kw: load_model(path, device="cpu", max_batch=max(BATCHES), **quantised, **kw)
    try:
        if against == "exact":
            return ("rounded", load(exact=False)), ("panels", load(exact=True))
        wide = load()
        cpu_model.keeps_bf16_panels = lambda *_: False
        return ("panels", wide), ("rows", load())
    finally:
        cpu_model.keeps_bf16_panels = in_panels


def paired(a, b, run, count: int) -> tuple[np.ndarray, np.ndarray]:
    ta, tb = [], []
    for _ in range(count):
        t = time.perf_counter(); run(a); ta.append(time.perf_counter() - t)
        t = time.perf_counter(); run(b); tb.append(time.perf_counter() - t)
    return np.array(ta), np.array(tb)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--shape", choices=list(SHAPES), default="0.1B")
    parser.add_argument("--against", choices=("rows", "exact"), default="rows",
                        help="panels against rows, or rounded activations against exact ones")
    parser.add_argument("--quant", choices=("int8", "int8+head", "nf4", "nf4+head"),
                        help="with --against exact: Int8 or NF4 projections (and an Int8 head), rounded against exact")
    parser.add_argument("--no-save", action="store_true", help=record.NO_SAVE_HELP)
    args = parser.parse_args()
    assert args.quant is None or args.against == "exact", "--quant compares rounded against exact"
    (a_name, a), (b_name, b_model) = load_both(str(bf16_checkpoint(args.shape)), args.against, args.quant)
    if args.against == "exact":
        available = {None: rounded_bf16.available, "int8": vnni.available, "nf4": rounded_nf4.available}
        differs = available[args.quant and args.quant.split("+")[0]]() and a.rounds_activations
    else:
        differs = type(a.head) is not type(b_model.head)
    assert panels.available() and differs, "no AVX-512 (BF16, VNNI): nothing to compare"
    prompt = np.random.default_rng(0).integers(0, SHAPES[args.shape]["vocab"], 512).tolist()
    want, _ = b_model.forward(prompt[:64], full_output=True)
    got, _ = a.forward(prompt[:64], full_output=True)
    results = {"shape": args.shape, "against": args.against, "quant": args.quant,
               "logit_error": float((np.abs(got - want).max(axis=1) / want.std(axis=1)).max()),
               "top1_agreement": float(np.mean(got.argmax(axis=1) == want.argmax(axis=1)))}
    for n in (128, 512):
        ta, tb = paired(a, b_model, lambda m: m.forward(prompt[:n]), 3)
        results[f"prefill_{n}"] = {f"{a_name}_tps": n / ta.min(), f"{b_name}_tps": n / tb.min(),
                                   "ratio": float(tb.min() / ta.min())}
    for b in BATCHES:
        inputs = [StepInput(slot, [prompt[slot]]) for slot in range(b)]
        paired(a, b_model, lambda m: m.step(inputs), 3)
        ta, tb = paired(a, b_model, lambda m: m.step(inputs), max(24, 96 // b))
        results[f"batch_{b}"] = {f"{a_name}_tps": b / float(np.median(ta)), f"{b_name}_tps": b / float(np.median(tb)),
                                 "ratio": float(np.median(tb / ta))}
    for name, figures in results.items():
        print(name, figures if not isinstance(figures, dict) else
              ", ".join(f"{k} {v:.2f}" for k, v in figures.items()))
    print(json.dumps(results))
    record.save("bf16_panels", results, args)


if __name__ == "__main__":
    main()
