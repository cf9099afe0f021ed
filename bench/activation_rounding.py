"""What rounding the activations costs (issue 37): the accuracy side of fast products.

Fast CPU products (AVX-512 bf16 `vdpbf16ps`, VNNI `vpdpbusd`, AVX2 `vpmaddubsw`) multiply
activations rounded to bf16 or to int8. Their speed needs those instructions; their accuracy
does not, so this script measures it on any machine: every input of a projection and of
the head is rounded as such a kernel would round it (per row: bf16 per value, or int8 with
one scale per block of 32 or per row), the products themselves stay exact. Against the same
model without rounding, over `--positions` prompt positions of the seeded 0.1B-shape
conformance checkpoints (bf16 weights, v7 and v6), and of the demo model (trained, on the
opening of Genesis), and for Int8 and NF4 weights against their own unrounded selves:

* max |Δlogits| / std(logits) per position: the worst, the 99th percentile and the median
  (the issue's bar: the worst within 2e-2);
* top-1 agreement (the issue's bar: at least 99%).

"int16/128" is what `[model] exact = false` does to Int8 products on a CPU with AVX-512
VNNI (cpu/vnni.py); where the CPU has it, the "VNNI" line measures those kernels themselves.
"bf16" is what it does to bf16 products on a CPU with AVX-512 BF16 (cpu/rounded_bf16.py);
the "BF16" line measures those kernels, against the same model in bf16 with exact products
(the demo's fp16 weights rounded to bf16 for both); its "fp16" line, against the model in
fp16, exact, also rounds the fp16 weights to bf16, as an fp16 model that is not exact does
(the seeded checkpoints' weights are bf16 numbers: only the demo's move). The "NF4 tiles" line measures what it
does to NF4 products where the CPU has AMX's tiles (cpu/rounded_nf4.py: weights widened to
bf16, x rounded to bf16). `--kernels-only` measures just those lines.

    .venv/bin/python bench/activation_rounding.py [--positions 2000] [--versions 7,6] [--kernels-only]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import record
from shapes import SHAPES

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ai00_like.rwkv import load_model
from ai00_like.rwkv.cpu import blocks, rounded_bf16, rounded_nf4, vnni
from ai00_like.rwkv.cpu import model as cpu_model
from ai00_like.rwkv.cpu.model import CpuModel
from ai00_like.rwkv.info import detect
from ai00_like.rwkv.quant import quantise_tensors
from ai00_like.rwkv.synthetic import make_checkpoint
from ai00_like.rwkv.tokenizer import load_tokenizer

MODELS = Path(__file__).resolve().parents[1] / "assets" / "models"
GENESIS = (  # King James Version, public domain
    "In the beginning God created the heaven and the earth. And the earth was without form, and void; "
    "and darkness was upon the face of the deep. And the Spirit of God moved upon the face of the waters. "
    "And God said, Let there be light: and there was light. And God saw the light, that it was good: and God "
    "divided the light from the darkness. And God called the light Day, and the darkness he called Night. "
    "And the evening and the morning were the first day. And God said, Let there be a firmament in the midst "
    "of the waters, and let it divide the waters from the waters. And God made the firmament, and divided the "
    "waters which were under the firmament from the waters which were above the firmament: and it was so. "
    "And God called the firmament Heaven. And the evening and the morning were the second day. And God said, "
    "Let the waters under the heaven be gathered together unto one place, and let the dry land appear: and it "
    "was so. And God called the dry land Earth; and the gathering together of the waters called he Seas: and "
    "God saw that it was good. And God said, Let the earth bring forth grass, the herb yielding seed, and the "
    "fruit tree yielding fruit after his kind, whose seed is in itself, upon the earth: and it was so.")


def to_bf16(x: np.ndarray) -> np.ndarray:
    """Round to the nearest bf16, ties to even (as vcvtne2ps2bf16)."""
    bits = np.ascontiguousarray(x, dtype=np.float32).view(np.uint32)
    bits = (bits + 0x7FFF + ((bits >> 16) & 1)) & 0xFFFF0000
    return bits.view(np.float32)


def to_int(largest: int, block: int | None):
    """Round to integers up to `largest` (127: int8, 32,767: int16) with one scale per run of
    `block` inputs of a row (None: per row)."""
    def rounded(x: np.ndarray) -> np.ndarray:
        rows, k = x.shape
        runs = x.reshape(rows, -1, block or k)
        scale = np.abs(runs).max(axis=-1, keepdims=True) / largest
        scale[scale == 0] = 1
        return (np.rint(runs / scale) * scale).reshape(rows, k).astype(np.float32)
    return rounded


ROUNDINGS = {"bf16": to_bf16, "int8/32": to_int(127, 32), "int8/row": to_int(127, None),
             "int16/128": to_int(32767, 128)}


def logits(model: CpuModel, prompt: list[int], rounding) -> np.ndarray:
    """Every position's logits with each projection's input passed through `rounding` (a
    projection or the head: both sides at least half the model's width, unlike a LoRA)."""
    exact, projection = blocks.linear, model.info.n_embd // 2

    def linear(x, weight):
        if rounding is not None and min(weight.shape) >= projection:
            x = rounding(np.asarray(x, dtype=np.float32))
        return exact(x, weight)

    blocks.linear = cpu_model.linear = linear
    try:
        return model.forward(prompt, full_output=True)[0]
    finally:
        blocks.linear = cpu_model.linear = exact


def compare(got: np.ndarray, want: np.ndarray) -> dict:
    error = np.abs(got - want).max(axis=1) / want.std(axis=1)
    return {"worst": float(error.max()), "p99": float(np.percentile(error, 99)), "median": float(np.median(error)),
            "top1": float(np.mean(got.argmax(axis=1) == want.argmax(axis=1)))}


def checkpoint(version: str) -> dict[str, np.ndarray]:
    """The 0.1B shape of `version`, its weights rounded to bf16 as released files hold them."""
    dims = dict(SHAPES["0.1B"])
    if version != "7":
        dims.pop("lora")
    return {k: to_bf16(v) for k, v in make_checkpoint(version, seed=1, **dims).items()}


def cases(versions: list[str], positions: int):
    """(name, prompt, model maker by weight kind) of each checkpoint measured."""
    for version in versions:
        tensors = checkpoint(version)
        info = detect({k: a.shape for k, a in tensors.items()})
        prompt = np.random.default_rng(0).integers(1, info.vocab, positions).tolist()
        yield f"v{version} 0.1B", prompt, lambda kind, t=tensors, i=info, **kw: CpuModel(
            t if kind == "bf16" else quantise_tensors(t, i.n_layer, kind), i, max_batch=1, **kw)
    demo = MODELS / "demo.st"
    prompt = load_tokenizer(MODELS / "demo_vocab.txt").encode(GENESIS)
    yield "demo", prompt, lambda kind, **kw: load_model(demo, device="cpu", **{"precision": "fp32", **kw}, **(
        {} if kind == "bf16" else {"quant": 99, "quant_type": kind}))


def kernels_line(results: dict, row: tuple[str, str, str], prompt: list[int], want: np.ndarray, model) -> None:
    """The figures of a model whose kernels round the activations (exact = false), against
    `want`; row: (model, weights, kernels) as the table names them."""
    figures = compare(model.forward(prompt, full_output=True)[0], want)
    name, weights, label = row
    results[f"{name}, {weights} weights, {label} kernels ({len(prompt)} positions)"] = figures
    print(f"{name:<9} {weights:<8} {label:<11} {figures['worst']:8.4f} {figures['p99']:8.4f} "
          f"{figures['median']:8.4f} {figures['top1']:7.3f}", flush=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--positions", type=int, default=2000)
    parser.add_argument("--versions", default="7,6")
    parser.add_argument("--kernels-only", action="store_true", help="only the rounding kernels this CPU has")
    parser.add_argument("--no-save", action="store_true", help=record.NO_SAVE_HELP)
    args = parser.parse_args()
    results = {}
    print(f"{'model':<9} {'weights':<8} {'activations':<11} {'worst':>8} {'p99':>8} {'median':>8} {'top-1':>7}")
    for name, prompt, make in cases(args.versions.split(","), args.positions):
        for weights in ("bf16", "int8", "nf4"):  # the demo's "bf16" row is its fp16 weights
            model = make(weights)
            want = logits(model, prompt, None)
            for rounded, rounding in {} if args.kernels_only else ROUNDINGS.items():
                figures = compare(logits(model, prompt, rounding), want)
                results[f"{name}, {weights} weights, {rounded} activations ({len(prompt)} positions)"] = figures
                print(f"{name:<9} {weights:<8} {rounded:<11} {figures['worst']:8.4f} {figures['p99']:8.4f} "
                      f"{figures['median']:8.4f} {figures['top1']:7.3f}", flush=True)
            if weights == "int8" and vnni.available():
                kernels_line(results, (name, weights, "VNNI"), prompt, want, make(weights, exact=False))
            if weights == "nf4" and rounded_nf4.available():  # widened to bf16 on AMX's tiles
                kernels_line(results, (name, weights, "NF4 tiles"), prompt, want, make(weights, exact=False))
            if weights == "bf16" and rounded_bf16.available():  # against the same weights in bf16, exact
                want = make(weights, precision="bf16").forward(prompt, full_output=True)[0]
                kernels_line(results, (name, weights, "BF16"), prompt, want, make(weights, precision="bf16", exact=False))
                # fp16 weights, rounded to bf16 at load: against the same weights in fp16, exact
                want = make(weights, precision="fp16").forward(prompt, full_output=True)[0]
                kernels_line(results, (name, "fp16", "BF16"), prompt, want, make(weights, precision="fp16", exact=False))
            del model, want
    print(json.dumps(results))
    record.save("activation_rounding", results, args)


if __name__ == "__main__":
    main()
