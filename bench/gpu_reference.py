"""Our WebGPU backend against the reference `rwkv` package on CUDA, on the same GPU (issue 37).

The seeded bf16 `.pth` checkpoints of bench/shapes.py (0.1B and 1.5B by default), loaded by
both engines as fp16: ours with `load_model(..., device=<adapter>, precision="fp16")` through
Vulkan, the reference with strategy "cuda fp16" (RWKV_V7_ON=1, and its own CUDA kernel for
the WKV only with `--cuda-kernel`: the package's default is plain torch). Per shape and
engine, in one process, one engine after the other:

* prefill tokens/s of a 512-token prompt (the best of 3, after a warm-up);
* decoding tokens/s at batch 1 and 16 (the reference has no batched state: its batch of 16
  is 16 sequences stepped one after another, as a server built on it would);
* ours again with the other kind of matrix–vector kernel (subgroups or not), and at batch 1
  without encoding a step ahead (kernels.py);
* greedy agreement: the reference decodes 64 greedy tokens after a 64-token prompt; ours is
  fed the same tokens (rwkv/accuracy.py), giving the worst |Δlogits|/std and the share of
  steps where both pick the same token.

Each token's result reaches the host, as a server's sampler needs it: our step reads its
logits back; the reference's greedy pick is read with `.item()`.

    PYTHONPATH=. python3 bench/gpu_reference.py [--shapes 0.1B,1.5B] [--adapter N] [--cuda-kernel]

Needs a GPU that both CUDA and Vulkan see, torch with CUDA, and rwkv==0.8.32.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import record
from shapes import SHAPES, bf16_checkpoint

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from ai00_like.rwkv import load_model
from ai00_like.rwkv.accuracy import against_reference
from ai00_like.rwkv.batch import StepInput
from ai00_like.rwkv.gpu.device import best_adapter, list_adapters

PROMPT, STEPS, BATCHES, AGREE_PROMPT, AGREE_STEPS = 512, 32, (1, 16), 64, 64


def best_of(n: int, fn) -> float:
    times = []
    for _ in range(n):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return min(times)


def our_figures(path: Path, adapter: int, prompt: list[int]) -> tuple[dict, object]:
    start = time.perf_counter()
    model = load_model(path, device=str(adapter), precision="fp16", max_batch=max(BATCHES))
    figures = {"load_s": time.perf_counter() - start}
    model.forward(prompt[:64])
    figures["prefill_tps"] = PROMPT / best_of(3, lambda: model.forward(prompt))
    figures.update(decode_figures(model, prompt))
    figures.update(encode_cost(model))
    figures["subgroups"] = used = model.subgroups_used
    model.use_subgroups = not used  # the other kind of matrix–vector kernel, to compare
    model.programs.clear()
    other = "without" if used else "with"
    figures.update({f"{k}_{other}_subgroups": v for k, v in decode_figures(model, prompt).items()})
    model.use_subgroups = None
    model.programs.clear()
    return figures, model


def decode_figures(model, prompt: list[int]) -> dict:
    figures = {}
    for batch in BATCHES:
        inputs = [StepInput(slot, [prompt[slot]], "last") for slot in range(batch)]
        model.step(inputs)

        def steps():
            for _ in range(STEPS):
                model.step(inputs)
        figures[f"decode_b{batch}_tps"] = batch * STEPS / best_of(3, steps)
    return figures


def encode_cost(model) -> dict:
    """The batch-1 step's dispatches and the CPU's time to encode and submit them, not waiting
    for the GPU: how much of a step is the host's."""
    program = model.programs[(1, 1, 1)]
    sync = lambda: model.gpu.device.queue.read_buffer(model.space.logits, 0, 4)
    sync()
    start = time.perf_counter()
    for _ in range(STEPS):
        model.kernels.run(program)
    encode = (time.perf_counter() - start) / STEPS
    sync()
    return {"b1_dispatches": len(program), "b1_encode_ms": encode * 1e3,
            "decode_b1_tps_not_encoded_ahead": not_encoded_ahead(model)}


def not_encoded_ahead(model) -> float:
    """Batch-1 decoding tokens/s with each step encoded only when it runs (kernels.EncodedAhead off)."""
    from ai00_like.rwkv.gpu import kernels

    prepare = kernels.EncodedAhead.prepare
    kernels.EncodedAhead.prepare = lambda self, program: None
    try:
        inputs = [StepInput(0, [1], "last")]

        def steps():
            for _ in range(STEPS):
                model.step(inputs)
        return STEPS / best_of(3, steps)
    finally:
        kernels.EncodedAhead.prepare = prepare


def kernel_sweep(model, prompt: list[int]) -> dict:
    """Our prefill tokens/s with each matrix–matrix kernel forced: the tiled one (one row per
    thread, what a GPU ran before the blocked kernel) and each shape of the blocked one (bench
    only: which suits this adapter; `recorder.prefill_kernel` chooses); then the chosen one
    with the whole prompt in one step, not chunks of gpu/model.py's FORWARD_CHUNK (a server's
    token_chunk_size)."""
    from ai00_like.rwkv.gpu import model as gpu_model
    from ai00_like.rwkv.gpu import recorder

    chosen, shape, chunk = recorder.prefill_kernel, dict(recorder.BLOCK_SHAPE), gpu_model.FORWARD_CHUNK
    tiled = lambda rows, k, software, workgroup_bytes: chosen(rows, 1, False, 0)  # noqa: E731 - the tiled kernel
    variants = {"tiled TM1": (tiled, shape, chunk)} | {
        f"blocked {wy}x{rt}": (chosen, {"WG_Y": wy, "RT": rt}, chunk) for wy, rt in ((8, 4), (16, 4), (8, 8), (16, 8))}
    variants[f"chosen, chunks of {PROMPT}"] = (chosen, shape, PROMPT)
    out = {}
    try:
        for name, (kernel, block, rows) in variants.items():
            recorder.prefill_kernel, gpu_model.FORWARD_CHUNK = kernel, rows
            recorder.BLOCK_SHAPE.update(block)
            model.programs.clear()
            model.forward(prompt)
            out[name] = PROMPT / best_of(2, lambda: model.forward(prompt))
    finally:
        recorder.prefill_kernel, gpu_model.FORWARD_CHUNK = chosen, chunk
        recorder.BLOCK_SHAPE.update(shape)
        model.programs.clear()
    return out


class Reference:
    """The `rwkv` package's RWKV-7 on CUDA fp16."""

    def __init__(self, path: Path, strategy: str):
        import torch
        from rwkv.model import RWKV

        self.torch = torch
        self.sync = torch.cuda.synchronize if strategy.startswith("cuda") else lambda: None
        start = time.perf_counter()
        self.model = RWKV(model=str(path)[: -len(".pth")], strategy=strategy)
        self.sync()
        self.load_s = time.perf_counter() - start

    def forward(self, tokens: list[int], state=None):
        logits, state = self.model.forward(tokens, state)
        return logits, state

    def figures(self, prompt: list[int]) -> dict:
        torch = self.torch
        self.forward(prompt[:64])
        figures = {"load_s": self.load_s}

        def prefill():
            self.forward(prompt)
            self.sync()
        figures["prefill_tps"] = PROMPT / best_of(3, prefill)
        for batch in BATCHES:
            states = [self.forward(prompt[slot : slot + 8])[1] for slot in range(batch)]
            tokens = [prompt[slot] for slot in range(batch)]

            def steps():
                for _ in range(STEPS):
                    for slot in range(batch):
                        logits, states[slot] = self.forward([tokens[slot]], states[slot])
                        int(torch.argmax(logits).item())
            steps()
            figures[f"decode_b{batch}_tps"] = batch * STEPS / best_of(3, steps)
        return figures

    def greedy(self, prompt: list[int], steps: int) -> tuple[np.ndarray, list[int]]:
        logits, state = self.forward(prompt)
        rows, tokens = [logits.float().cpu().numpy()], []
        for _ in range(steps):
            tokens.append(int(np.argmax(rows[-1])))
            logits, state = self.forward([tokens[-1]], state)
            rows.append(logits.float().cpu().numpy())
        return np.stack(rows), tokens


def compare(shape: str, adapter: int, strategy: str, tiles: bool) -> dict:
    path = bf16_checkpoint(shape)
    vocab = SHAPES[shape]["vocab"]
    rng = np.random.default_rng(0)
    prompt = rng.integers(1, vocab - 1, PROMPT).tolist()
    agree_prompt = rng.integers(1, vocab - 1, AGREE_PROMPT).tolist()
    reference = Reference(path, strategy)
    theirs = reference.figures(prompt)
    ref_logits, ref_tokens = reference.greedy(agree_prompt, AGREE_STEPS)
    del reference
    reference_memory_cleanup()
    ours, model = our_figures(path, adapter, prompt)
    error, agreement = against_reference(model, agree_prompt, ref_logits, ref_tokens)
    if tiles:
        ours["prefill_tps_by_kernel"] = kernel_sweep(model, prompt)
    return {"ours": ours, "reference": theirs,
            "ratios": {k: ours[k] / theirs[k] for k in ours if k.endswith("_tps")},
            "max_rel_err": error, "greedy_agreement": agreement}


def reference_memory_cleanup() -> None:
    import gc

    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shapes", default="0.1B,1.5B", help="comma-separated shapes of bench/shapes.py")
    parser.add_argument("--adapter", type=int, default=None, help="WebGPU adapter index (default: the best real one)")
    parser.add_argument("--strategy", default="cuda fp16", help="the reference's strategy ('cpu fp32' for a smoke run)")
    parser.add_argument("--cuda-kernel", action="store_true", help="the reference with RWKV_CUDA_ON=1 (compiles with nvcc)")
    parser.add_argument("--tiles", action="store_true", help="also our prefill with each matrix–matrix kernel shape")
    parser.add_argument("--no-save", action="store_true", help=record.NO_SAVE_HELP)
    args = parser.parse_args()
    os.environ["RWKV_V7_ON"] = "1"
    os.environ["RWKV_CUDA_ON"] = "1" if args.cuda_kernel else "0"
    adapter = args.adapter if args.adapter is not None else best_adapter(allow_software=True).index
    import torch

    results = {"adapter": list_adapters()[adapter].describe(), "reference_strategy": args.strategy,
               "cuda_device": torch.cuda.get_device_name(0) if torch.cuda.is_available() else None,
               "torch": torch.__version__, "reference_cuda_kernel": args.cuda_kernel, "shapes": {}}
    print(f"adapter {results['adapter']}; reference {args.strategy} on {results['cuda_device']}, "
          f"torch {results['torch']}", flush=True)
    print("shape  engine      prefill   decode b1  decode b16   load s", flush=True)
    for shape in args.shapes.split(","):
        try:
            out = results["shapes"][shape] = compare(shape, adapter, args.strategy, args.tiles)
        except Exception as error:  # noqa: BLE001 - a shape that fails leaves the others' figures
            results["shapes"][shape] = {"error": repr(error)}
            print(f"{shape}: failed: {error!r}", flush=True)
            continue
        for name in ("ours", "reference"):
            f = out[name]
            print(f"{shape:6} {name:10} {f['prefill_tps']:9.1f} {f['decode_b1_tps']:11.1f} {f['decode_b16_tps']:11.1f}"
                  f" {f['load_s']:8.1f}", flush=True)
        r = out["ratios"]
        print(f"{shape:6} ours/ref   {r['prefill_tps']:9.2f} {r['decode_b1_tps']:11.2f} {r['decode_b16_tps']:11.2f}; "
              f"max |Δlogits|/std {out['max_rel_err']:.2e}, greedy agreement {out['greedy_agreement']:.3f}", flush=True)
        if args.tiles:
            print(f"{shape:6} our prefill by kernel: " + ", ".join(
                f"{k} {v:.1f}" for k, v in out["ours"]["prefill_tps_by_kernel"].items()), flush=True)
        print(f"{shape:6} our batch-1 step: {out['ours']['b1_dispatches']} dispatches, "
              f"{out['ours']['b1_encode_ms']:.2f} ms to encode and submit; "
              f"{out['ours']['decode_b1_tps_not_encoded_ahead']:.1f} tokens/s not encoded ahead", flush=True)
        other = "without" if out["ours"]["subgroups"] else "with"
        print(f"{shape:6} our decoding {other} subgroups: batch 1 {out['ours'][f'decode_b1_tps_{other}_subgroups']:.1f},"
              f" batch 16 {out['ours'][f'decode_b16_tps_{other}_subgroups']:.1f}", flush=True)
    print(json.dumps(results))
    record.save("gpu_reference", results, args)


if __name__ == "__main__":
    main()
