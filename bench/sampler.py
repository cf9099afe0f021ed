"""Sampler benchmark: one `sample_batch` step at V = 65536 for batch 1, 4, 16 and 64.

Each configuration keeps its samplers across steps (so penalties and Mirostat state are
live, as in serving) and cycles through a few pre-made logit batches shaped like a language
model's (a Zipf-like fall-off over a random token order, plus noise). Reports the median
milliseconds per step. When torch and the reference `rwkv` package are installed, it also
times the reference's `PIPELINE.sample_logits` (top_p 0.5, top_k 128, one row at a time,
as ChatRWKV calls it) and reports our Nucleus against it as a ratio.

    .venv/bin/python bench/sampler.py            # prints a table, then one JSON line
    .venv/bin/python bench/sampler.py --quick    # fewer steps, for a smoke run
"""

from __future__ import annotations

import argparse
import json
import statistics
import time

import numpy as np

import record
from ai00_like.sampler import Mirostat, Nucleus, RequestSampler, SamplingOptions, Typical, sample_batch

VOCAB = 65536
BATCHES = (1, 4, 16, 64)
CONFIGS = {
    "greedy": SamplingOptions(sampler=Nucleus(temperature=0.0)),
    "nucleus": SamplingOptions(),  # Ai00's defaults: top_p 0.5, top_k 128, penalties on
    "nucleus_no_top_k": SamplingOptions(sampler=Nucleus(top_k=0, top_p=0.9)),
    "typical": SamplingOptions(sampler=Typical()),
    "mirostat": SamplingOptions(sampler=Mirostat()),
    "nucleus_logprobs": SamplingOptions(logprobs=True, top_logprobs=5),
}


def lm_like_logits(rng: np.random.Generator, rows: int) -> np.ndarray:
    rank = np.arange(1, VOCAB + 1, dtype=np.float64)
    base = -1.2 * np.log(rank) * 3.0
    out = np.empty((rows, VOCAB), dtype=np.float32)
    for row in range(rows):
        out[row, rng.permutation(VOCAB)] = base + rng.normal(0.0, 0.5, VOCAB)
    return out


def time_steps(options: SamplingOptions, batch: int, logit_sets: list[np.ndarray], steps: int) -> float:
    history = np.random.default_rng(1).integers(0, VOCAB, 300)
    samplers = [RequestSampler(options, VOCAB, history) for _ in range(batch)]
    times = []
    for step in range(steps + 2):
        logits = logit_sets[step % len(logit_sets)][:batch]
        start = time.perf_counter()
        sample_batch(samplers, logits)
        if step >= 2:  # the first steps warm caches and allocators
            times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def time_reference(batch: int, logit_sets: list[np.ndarray], steps: int) -> float | None:
    try:
        import torch
        from rwkv.utils import PIPELINE
    except ImportError:
        return None
    torch.set_num_threads(2)
    tensors = [torch.from_numpy(x) for x in logit_sets]
    times = []
    for step in range(steps + 2):
        logits = tensors[step % len(tensors)][:batch]
        start = time.perf_counter()
        for row in range(batch):
            # sample_logits does not use `self`.
            PIPELINE.sample_logits(None, logits[row], temperature=1.0, top_p=0.5, top_k=128)
        if step >= 2:
            times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer steps")
    parser.add_argument("--no-save", action="store_true", help=record.NO_SAVE_HELP)
    args = parser.parse_args()
    steps = 8 if args.quick else 40

    rng = np.random.default_rng(0)
    logit_sets = [lm_like_logits(rng, max(BATCHES)) for _ in range(3)]
    results: dict[str, dict[str, float]] = {}
    for name, options in CONFIGS.items():
        results[name] = {str(b): round(time_steps(options, b, logit_sets, steps), 3) for b in BATCHES}
    reference = {str(b): time_reference(b, logit_sets, max(4, steps // 4)) for b in BATCHES}

    header = f"{'ms per step':<20}" + "".join(f"{'B=' + str(b):>10}" for b in BATCHES)
    print(header)
    print("-" * len(header))
    for name, row in results.items():
        print(f"{name:<20}" + "".join(f"{row[str(b)]:>10.3f}" for b in BATCHES))
    ratios = {}
    if all(v is not None for v in reference.values()):
        print(f"{'reference nucleus':<20}" + "".join(f"{reference[str(b)]:>10.3f}" for b in BATCHES))
        ratios = {b: round(reference[b] / results["nucleus"][b], 2) for b in reference}
        print(f"{'speedup vs ref':<20}" + "".join(f"{ratios[str(b)]:>9.1f}x" for b in BATCHES))
    else:
        print("(reference rwkv/torch not installed: no comparison)")

    summary = {
        "bench": "sampler",
        "vocab": VOCAB,
        "steps": steps,
        "ms_per_step": results,
        "reference_nucleus_ms": {k: (round(v, 3) if v is not None else None) for k, v in reference.items()},
        "nucleus_speedup_vs_reference": ratios,
    }
    print(json.dumps(summary))
    record.save("sampler", summary, args)


if __name__ == "__main__":
    main()
