"""Engine benchmark: our numpy backend against the reference `rwkv` package, same run.

A seeded v7 checkpoint of the 0.1B shape (L12, D768, V65536; others with `--shape`) in
fp32, saved once as a `.pth` that both engines load. Each engine runs in its own process with 2 threads:
prefill tokens/s of a 512-token prompt and of its first 128 tokens (a short prompt, where
fixed costs weigh more), decode tokens/s at batch 1, 4 and 16, and the
process's peak memory. Ours also runs on the same weights saved as a bf16 `.pth` (as RWKV
models are released) at the precisions of `--precisions` (default bf16 and fp16, kept
16-bit in memory, and Int8 and NF4 of every layer, with the head 16-bit and with it Int8),
each against our fp32 run. Every engine runs `--rounds` times (default 2), all of them
in turn each round, and keeps its best figures (and its highest peak memory): the shared
machine's speed moves in steps within minutes, so one pass can compare an engine's slow
spell with another's fast one. (Before the rounds each of our configurations runs once
untimed, so that no measured process compiles kernels.) Prints a table, then one JSON line of results and ratios
(each engine's figures per round too). Each lower precision also decodes once beside our
fp32 in one process, a step of each in turn (`--no-paired` skips it): the median ratio of
their step times cancels the machine's changes of speed, which the rounds only reduce.

Each library picks its own CPU kernels, as it does on a user's machine: numpy's OpenBLAS
by its CPU detection, torch's MKL by its own. An environment that pins OpenBLAS to an
older kernel set (OPENBLAS_CORETYPE, which MKL ignores) would handicap only our side, so
the variable is left out of both runs; when it is set, our engine also runs under it and
both rows are printed.

    .venv/bin/python bench/engine.py            # needs torch==2.13.0 and rwkv==0.8.32
    .venv/bin/python bench/engine.py --quick    # a smaller model, for a smoke run
    .venv/bin/python bench/engine.py --shape 1.5B --no-reference    # a released model's size

`--llama-cpp` adds llama.cpp's rows to the same run, as an optional anchor (never in CI):
the same fp32 weights as f16, q8_0 and q4_0 GGUF files, each against our fp32 run. The first
use builds llama-cpp-python into its own venv (minutes); see bench/llama_cpp_runner.py.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import record
from shapes import CACHE, SHAPES, bf16_checkpoint

THREADS = 2
PROMPT, SHORT_PROMPT, DECODE_STEPS, BATCHES = 512, 128, 32, (1, 4, 16)

COMMON = """
import json, resource, sys, time
import numpy as np
path, prompt_len, steps, batches = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), json.loads(sys.argv[4])
short_len = int(sys.argv[5])
prompt = np.random.default_rng(0).integers(1, 65530, prompt_len).tolist()
def peak_mb():
    # VmHWM is this process image's own high-water mark; ru_maxrss would also count the
    # parent's memory inherited at fork, before exec.
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
def best_of(n, fn):
    times = []
    for _ in range(n):
        t = time.perf_counter(); fn(); times.append(time.perf_counter() - t)
    return min(times)
"""

LOAD = COMMON + """
from ai00_like.rwkv import load_model
from ai00_like.rwkv.batch import StepInput
import os
kept = os.environ.get("BENCH_PRECISION", "auto")  # a precision, or int8/nf4: every layer's projections quantised
# int8+head, nf4+head: the head as Int8 blocks too (quant_head); +rounded: exact = false
kind, *options = kept.split("+")
quantised = dict(quant=1000, quant_type=kind, quant_head="head" in options) if kind in ("int8", "nf4") \
    else dict(precision=kind)
quantised["exact"] = "rounded" not in options
"""

OURS = LOAD + """
from threadpoolctl import threadpool_info
t = time.perf_counter()
model = load_model(path, device="cpu", max_batch=max(batches), **quantised)
load_s = time.perf_counter() - t
blas = next((f"{i['internal_api']} {i.get('architecture')}" for i in threadpool_info() if i["user_api"] == "blas"), "?")
model.forward(prompt[:64])  # warm-up
prefill_s = best_of(2, lambda: model.forward(prompt))
short_s = best_of(3, lambda: model.forward(prompt[:short_len]))
decode = {}
for b in batches:
    inputs = [StepInput(slot, [prompt[slot]]) for slot in range(b)]
    model.step(inputs)
    def decode_steps():
        for _ in range(steps):  # each step's logits dropped, as the server does after sampling
            model.step(inputs)
    decode[b] = b * steps / best_of(3, decode_steps)
print(json.dumps({"load_s": load_s, "prefill_tps": prompt_len / prefill_s, "short_prefill_tps": short_len / short_s,
                  "decode_tps": decode, "peak_mb": peak_mb(), "blas": blas}))
"""

# Each of our configurations once, untimed, before the rounds: numba compiles a kernel the
# first time a process needs it and keeps it on disk for the next, and compiling in a
# measured process added LLVM's memory to its peak (Int8 379 → 540 MiB).
WARM = LOAD + """
model = load_model(path, device="cpu", max_batch=max(batches), **quantised)
model.forward(prompt[:64])
for b in batches:
    model.step([StepInput(slot, [prompt[slot]]) for slot in range(b)])
print("{}")
"""

# Our fp32 and one other precision in one process, a decoding step of each in turn: the
# median of each step's time over the other's cancels the machine's changes of speed, which
# separate processes minutes apart cannot (a batch-1 ratio to fp32 moved 1.5-1.8 with them).
PAIRED = LOAD + """
fp32 = load_model(os.environ["BENCH_FP32_PATH"], device="cpu", max_batch=max(batches))
model = load_model(path, device="cpu", max_batch=max(batches), **quantised)
paired = {}
for b in batches:
    inputs = [StepInput(slot, [prompt[slot]]) for slot in range(b)]
    for m in (fp32, model):
        for _ in range(3):
            m.step(inputs)
    ours, theirs = [], []
    for _ in range(max(32, 4 * steps // b)):
        t = time.perf_counter(); fp32.step(inputs); ours.append(time.perf_counter() - t)
        t = time.perf_counter(); model.step(inputs); theirs.append(time.perf_counter() - t)
    ours, theirs = np.array(ours), np.array(theirs)
    paired[b] = {"fp32_tps": b / float(np.median(ours)), "tps": b / float(np.median(theirs)),
                 "ratio": float(np.median(ours / theirs))}
print(json.dumps(paired))
"""

REFERENCE = COMMON + """
import os, torch
torch.set_num_threads(int(os.environ["BENCH_THREADS"]))
from rwkv.model import RWKV
t = time.perf_counter(); model = RWKV(model=path[:-4], strategy="cpu fp32"); load_s = time.perf_counter() - t
model.forward(prompt[:64], None)
prefill_s = best_of(2, lambda: model.forward(prompt, None))
short_s = best_of(3, lambda: model.forward(prompt[:short_len], None))
_, state = model.forward(prompt[:8], None)
def run():
    s = state
    for i in range(steps):
        _, s = model.forward([prompt[i]], s)
decode = {1: steps / best_of(3, run)}
print(json.dumps({"load_s": load_s, "prefill_tps": prompt_len / prefill_s, "short_prefill_tps": short_len / short_s,
                  "decode_tps": decode, "peak_mb": peak_mb()}))
"""


def checkpoint(shape: str) -> tuple[Path, int]:
    """The seeded checkpoint as an fp32 .pth (made once), and its weight bytes."""
    from ai00_like.rwkv.synthetic import make_checkpoint

    path = CACHE / f"v7-{shape}-seed1.pth"
    tensors = make_checkpoint("7", seed=1, **SHAPES[shape])
    nbytes = sum(a.nbytes for a in tensors.values())
    if not path.exists():
        import torch

        CACHE.mkdir(exist_ok=True)
        torch.save({k: torch.from_numpy(v) for k, v in tensors.items()}, path)
    return path, nbytes


def run(code: str, path: Path, env_extra: dict, batches, blas_coretype: str | None = None) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_CORETYPE"}
    env.update(BENCH_THREADS=str(THREADS), OMP_NUM_THREADS=str(THREADS), OPENBLAS_NUM_THREADS=str(THREADS), **env_extra)
    if blas_coretype:
        env["OPENBLAS_CORETYPE"] = blas_coretype
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code), str(path), str(PROMPT), str(DECODE_STEPS),
                          json.dumps(list(batches)), str(SHORT_PROMPT)], env=env, capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"benchmark process failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def best_of_passes(figures: list[dict | None]) -> dict | None:
    """One engine's figures over the rounds: its fastest of each, its highest peak memory."""
    if figures[0] is None:
        return None
    best = dict(figures[-1])
    best["prefill_tps"] = max(f["prefill_tps"] for f in figures)
    best["short_prefill_tps"] = max(f["short_prefill_tps"] for f in figures)
    best["decode_tps"] = {b: max(f["decode_tps"][b] for f in figures) for b in figures[0]["decode_tps"]}
    best["peak_mb"] = max(f["peak_mb"] for f in figures)
    best["rounds"] = [{"prefill_tps": f["prefill_tps"], "short_prefill_tps": f["short_prefill_tps"],
                       "decode_tps": f["decode_tps"]} for f in figures]
    return best


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", choices=list(SHAPES), default="0.1B",
                        help="the seeded model's shape (default 0.1B; 1.5B takes a 6 GB fp32 file and about "
                             "an hour)")
    parser.add_argument("--quick", action="store_true", help="the same as --shape quick: a 4-layer D256 model")
    parser.add_argument("--no-reference", action="store_true", help="only our engine")
    parser.add_argument("--precisions", default="bf16,fp16,int8,nf4,int8+head,nf4+head",
                        help="ours also on the bf16 .pth at these precisions, int8 and nf4 quantising every "
                             "layer at load, +head the head too (default bf16,fp16,int8,nf4,int8+head,nf4+head; "
                             "'' for none)")
    parser.add_argument("--llama-cpp", action="store_true",
                        help="also llama.cpp on the same weights as f16/q8_0/q4_0 GGUF (builds it once)")
    parser.add_argument("--rounds", type=int, default=2,
                        help="run every engine this many times, one after another in turn, and keep each one's "
                             "best figures (default 2): the shared machine's speed moves in steps within "
                             "minutes, and a single pass can catch one engine in a slow spell and the next in a fast one")
    parser.add_argument("--no-paired", action="store_true",
                        help="skip the decode ratios measured step by step beside our fp32 in one process")
    parser.add_argument("--no-save", action="store_true", help=record.NO_SAVE_HELP)
    return parser.parse_args()


def main() -> None:
    args = parse_args()
    shape = "quick" if args.quick else args.shape
    path, weight_bytes = checkpoint(shape)
    pinned_coretype = os.environ.get("OPENBLAS_CORETYPE")
    precisions = list(filter(None, args.precisions.split(",")))
    run(WARM, path, {}, BATCHES)
    for p in precisions:
        run(WARM, bf16_checkpoint(shape), {"BENCH_PRECISION": p}, BATCHES)
    best = best_of_rounds(args, shape, path, precisions, pinned_coretype)
    paired = {} if args.no_paired else {
        p: run(PAIRED, bf16_checkpoint(shape), {"BENCH_PRECISION": p, "BENCH_FP32_PATH": str(path)}, BATCHES)
        for p in precisions}
    weights_mb = weight_bytes / 2**20

    print(f"v7 {shape}, fp32 weights {weights_mb:.0f} MiB, {THREADS} threads; our BLAS: {best['ours']['blas']}")
    print_against_reference(best)
    print_against_fp32(best, precisions)
    print_paired(paired)
    print_pinned(best, pinned_coretype)
    result = summary(shape, weights_mb, best, precisions, paired)
    print(json.dumps(result))
    record.save("engine", result, args)


def best_of_rounds(args, shape: str, path: Path, precisions: list[str], pinned_coretype: str | None) -> dict:
    """Every engine `args.rounds` times, all of them in turn each round: each one's best figures."""
    passes = []
    for _ in range(max(1, args.rounds)):
        passes.append({
            "ours": run(OURS, path, {}, BATCHES),
            "pinned": run(OURS, path, {}, BATCHES, pinned_coretype) if pinned_coretype else None,
            "ref": None if args.no_reference else run(REFERENCE, path, {"RWKV_V7_ON": "1", "RWKV_JIT_ON": "1"}, (1,)),
            **{p: run(OURS, bf16_checkpoint(shape), {"BENCH_PRECISION": p}, BATCHES) for p in precisions},
        })
        if args.llama_cpp:
            import llama_cpp_runner as llama_cpp_bench

            passes[-1].update({f"llama {t}": figures for t, figures in
                               llama_cpp_bench.measure_all(path, PROMPT, DECODE_STEPS, BATCHES, SHORT_PROMPT).items()})
    return {name: best_of_passes([p[name] for p in passes]) for name in passes[0]}


def row(label: str, a: float, b: float | None) -> None:
    ratio = f"{a / b:8.2f}" if b else ""
    print(f"{label:24}{a:12.1f}{(b or 0):12.1f}{ratio}")


def print_against_reference(best: dict) -> None:
    ours, ref = best["ours"], best["ref"]
    print(f"{'':24}{'ours':>12}{'reference':>12}{'ratio':>8}")
    row(f"prefill {PROMPT} tok/s", ours["prefill_tps"], ref and ref["prefill_tps"])
    row(f"prefill {SHORT_PROMPT} tok/s", ours["short_prefill_tps"], ref and ref["short_prefill_tps"])
    for b in BATCHES:
        row(f"decode batch {b} tok/s", ours["decode_tps"][str(b)], ref and ref["decode_tps"]["1"])
    row("peak memory MiB", ours["peak_mb"], ref and ref["peak_mb"])


def print_against_fp32(best: dict, precisions: list[str]) -> None:
    """Our lower precisions, then llama.cpp's files (if run), each against our fp32."""
    titles = {p: f"ours {p} from the bf16 .pth, against our fp32 ({best[p]['blas']}):" for p in precisions}
    for name, figures in llama_figures(best).items():
        titles[f"llama {name}"] = (f"llama.cpp {name} GGUF of the same weights ({figures['file_mb']:.0f} MiB), "
                                   "against our fp32:")
    ours = best["ours"]
    for name, title in titles.items():
        figures = best[name]
        print(title)
        row(f"prefill {PROMPT} tok/s", figures["prefill_tps"], ours["prefill_tps"])
        row(f"prefill {SHORT_PROMPT} tok/s", figures["short_prefill_tps"], ours["short_prefill_tps"])
        for b in BATCHES:
            row(f"decode batch {b} tok/s", figures["decode_tps"][str(b)], ours["decode_tps"][str(b)])
        row("peak memory MiB", figures["peak_mb"], ours["peak_mb"])


def print_paired(paired: dict) -> None:
    if not paired:
        return
    print("decode beside our fp32 in one process, a step of each in turn: tokens/s (medians), "
          "and the median of fp32's step time over this one's")
    print(f"{'':12}" + "".join(f"{f'batch {b}':>26}" for b in BATCHES))
    for p, figures in paired.items():
        print(f"{p:12}" + "".join(f"{figures[str(b)]['tps']:9.1f} /{figures[str(b)]['fp32_tps']:7.1f} ={figures[str(b)]['ratio']:6.2f}"
                                  for b in BATCHES))


def print_pinned(best: dict, pinned_coretype: str | None) -> None:
    pinned, ref = best["pinned"], best["ref"]
    if not pinned:
        return
    print(f"ours with the environment's OPENBLAS_CORETYPE={pinned_coretype} ({pinned['blas']}):")
    row(f"prefill {PROMPT} tok/s", pinned["prefill_tps"], ref and ref["prefill_tps"])
    for b in BATCHES:
        row(f"decode batch {b} tok/s", pinned["decode_tps"][str(b)], ref and ref["decode_tps"]["1"])


def llama_figures(best: dict) -> dict:
    """llama.cpp's best figures by GGUF type (none unless --llama-cpp)."""
    return {name.split(" ", 1)[1]: figures for name, figures in best.items() if name.startswith("llama ")}


def summary(shape: str, weights_mb: float, best: dict, precisions: list[str], paired: dict) -> dict:
    """The JSON line's (and the saved file's) results."""
    ours, pinned, ref = best["ours"], best["pinned"], best["ref"]
    ref_b1 = ref and ref["decode_tps"]["1"]
    result = {
        "shape": shape,
        "weights_mb": weights_mb,
        "ours": ours,
        "reference": ref,
        "ours_pinned_blas": pinned,
        "ours_lower_precisions": {p: best[p] for p in precisions},
        "paired_with_fp32": paired,
        "ratios": {
            "prefill": ref and ours["prefill_tps"] / ref["prefill_tps"],
            **{f"decode_b{b}_vs_ref_b1": ref and ours["decode_tps"][str(b)] / ref_b1 for b in BATCHES},
            "peak_memory_vs_weights": ours["peak_mb"] / weights_mb,
            "prefill_pinned_blas": ref and pinned and pinned["prefill_tps"] / ref["prefill_tps"],
            "decode_b16_pinned_blas_vs_ref_b1": ref and pinned and pinned["decode_tps"]["16"] / ref_b1,
        },
    }
    llama = llama_figures(best)
    if llama:
        result["llama_cpp"] = llama
    return result


if __name__ == "__main__":
    main()
