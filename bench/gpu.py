"""GPU backend benchmark (issue 6), on any WebGPU adapter (a real GPU or Mesa's lavapipe).

Everything is compared with a baseline measured in the same run, so the ratios carry over
to other adapters:

* kernels: the matrix–vector kernel's effective bandwidth (weight bytes read per second,
  batch 1) as a fraction of a plain buffer-copy kernel's bandwidth (bytes read + written per
  second) on the same adapter, measured just before it, per weight format; the tiled matrix–matrix kernel's GFLOP/s
  of each shape of the tiled and blocked kernels, at 64, 256 and 1,024 rows;
* a synthetic RWKV-7: prefill and decode tokens/s at batch 1 and 16 on the GPU (fp16, and
  every layer's projections in Int8 and in NF4) beside the numpy backend;
* memory: the layers' weight bytes of Int8 and NF4 (every layer) against fp16;
* precision: fp16/Int8/NF4 against fp32 over 64 greedy steps (rwkv/accuracy.py).

Prints a table, then one JSON line.

    XDG_RUNTIME_DIR=/tmp/x PYTHONPATH=. .venv/bin/python bench/gpu.py [--adapter N] [--quick]
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import numpy as np
import record

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from ai00_like.rwkv.accuracy import against_reference, greedy
from ai00_like.rwkv.batch import StepInput
from ai00_like.rwkv.cpu.model import CpuModel
from ai00_like.rwkv.gpu import recorder
from ai00_like.rwkv.gpu.buffers import STORAGE, Uploader
from ai00_like.rwkv.gpu.device import best_adapter, list_adapters
from ai00_like.rwkv.gpu.kernels import Dispatch
from ai00_like.rwkv.gpu.model import GpuModel
from ai00_like.rwkv.info import detect
from ai00_like.rwkv.synthetic import make_checkpoint

COPY_WGSL = """
@group(0) @binding(0) var<storage, read> a: array<vec4<u32>>;
@group(0) @binding(1) var<storage, read_write> b: array<vec4<u32>>;
@compute @workgroup_size(256)
fn main(@builtin(global_invocation_id) id: vec3<u32>, @builtin(num_workgroups) n: vec3<u32>) {
    let i = id.x + id.y * n.x * 256u;
    if (i < arrayLength(&a)) {
        b[i] = a[i];
    }
}
"""
TILES = [(1, 4), (2, 4), (4, 4)]  # matmul_tiled's TM × TN
BLOCKS = [(8, 4), (16, 4), (8, 8), (16, 8)]  # matmul_blocked's WG_Y × RT (recorder.BLOCK_SHAPE)
SHAPES = {  # "rows": a small prefill, a whole chunk (gpu/model.py's FORWARD_CHUNK) and four
    "full": {"matrix": 4096, "rows": (64, 256, 1024), "model": {"n_layer": 6, "n_embd": 1024, "head_size": 64, "vocab": 16384}},
    "quick": {"matrix": 2048, "rows": (64,), "model": {"n_layer": 2, "n_embd": 256, "head_size": 64, "vocab": 4096}},
}


def timed(kernels, dispatches, repeat: int, sync, tries: int = 5) -> float:
    """Seconds per pass of `dispatches`, `repeat` passes in one submission (best of `tries`:
    the machine may be shared, and a software adapter competes for its cores)."""
    kernels.run(dispatches)
    sync()
    best = float("inf")
    for _ in range(tries):
        start = time.perf_counter()
        kernels.run(dispatches * repeat)
        sync()
        best = min(best, (time.perf_counter() - start) / repeat)
    return best


def grid(groups: int) -> tuple[int, int]:
    """A 2-D grid of `groups` workgroups within the 65535 per dimension limit."""
    return (min(groups, 65535), -(-groups // 65535))


def matmul_figures(kernels, buffers: list, size: int, rows: int, sync) -> dict:
    """GFLOP/s of each matrix–matrix kernel shape on `rows` rows × the first half of the
    `size`² fp16 matrix (a software adapter takes seconds for the whole)."""
    half = size // 2
    params = (rows, half, size, 0, size, 0, 0, half, 0, 0)
    variants = {f"tiled {tm}x{tn}": ("matmul.wgsl", "matmul_tiled", (("TM", tm), ("TN", tn)), 16 * tm, 16 * tn)
                for tm, tn in TILES}
    variants |= {f"blocked {wy}x{rt}": (("matmul.wgsl", "matmul_blocked.wgsl"), "matmul_blocked",
                                        (("TM", 1), ("TN", 4), ("WG_Y", wy), ("RT", rt), ("BK", recorder.STAGED_K)),
                                        wy * rt, 64)
                 for wy, rt in BLOCKS}
    out = {}
    for name, (shader, entry, constants, block_rows, block_outputs) in variants.items():
        groups = (-(-half // block_outputs), -(-rows // block_rows))
        dispatch = kernels.dispatch(shader, entry, params, buffers, groups, prelude=recorder.WEIGHT_ACCESS["fp16"],
                                    constants=(*constants, ("ROWS", 8)))
        seconds = timed(kernels, [dispatch], 1, sync, tries=3)
        out[name] = 2 * rows * half * size / seconds / 1e9
    return out


def kernel_figures(model: GpuModel, size: int, rows: tuple[int, ...]) -> dict:
    """Bandwidths and throughputs on `model`'s device, with `size`×`size` matrices."""
    device, kernels = model.gpu.device, model.kernels
    usage = STORAGE
    sync = lambda: device.queue.read_buffer(scratch, 0, 4)
    scratch = device.create_buffer(size=16, usage=usage)
    copy_bytes = 64 << 20
    a, b = (device.create_buffer(size=copy_bytes, usage=usage) for _ in range(2))
    copy = device.create_compute_pipeline(layout="auto", compute={
        "module": device.create_shader_module(code=COPY_WGSL), "entry_point": "main"})
    group = device.create_bind_group(layout=copy.get_bind_group_layout(0), entries=[
        {"binding": 0, "resource": {"buffer": a, "offset": 0, "size": copy_bytes}},
        {"binding": 1, "resource": {"buffer": b, "offset": 0, "size": copy_bytes}}])
    copy_dispatch = Dispatch(copy, group, (*grid(copy_bytes // 16 // 256), 1))
    copies = []

    def copy_gbs() -> float:
        """The copy's bandwidth now: measured beside each kernel, as the machine's load changes."""
        copies.append(2 * copy_bytes / timed(kernels, [copy_dispatch], 4, sync) / 1e9)
        return copies[-1]

    out = {"matvec": {}, "matmul": {}}

    weights = np.random.default_rng(0).standard_normal((size, size)).astype(np.float32) * 0.02
    x = device.create_buffer_with_data(data=np.ones(max(rows) * size, np.float32), usage=usage)
    y = device.create_buffer(size=4 * max(rows) * size, usage=usage)
    for fmt in ("fp16", "fp32", "int8", "nf4"):
        if fmt in ("int8", "nf4"):
            from ai00_like.rwkv.quant import QuantisedMatrix

            matrix = Uploader(model.gpu).matrix(QuantisedMatrix.of(fmt, weights))
        else:
            matrix = Uploader(model.gpu, fmt).matrix(weights)
        (part,) = matrix.parts
        nbytes = matrix.nbytes
        params = (1, size, size, 0, size, 0, 0, size, 0, 0)
        buffers = [x, part.buffer, y, part.scales]  # (binding 4: the scales of int8 / nf4)
        variants = [("matmul.wgsl", "matvec8")]
        if model.gpu.subgroups:
            variants.append((("matmul.wgsl", "matvec_subgroup.wgsl"), "matvec8_subgroup"))
        for shader, entry in variants:
            groups, constants = ((size + 3) // 4, 1), recorder.matmul_tile(1)
            if "subgroup" in entry:
                rows_per_group = recorder.matvec_group_rows(entry, model.gpu.subgroup_width)
                groups, constants = (-(-size // rows_per_group), 1), (*constants, ("GROUP_ROWS", rows_per_group), ("X4", 1))
            dispatch = kernels.dispatch(shader, entry, params, buffers + [x] * ("subgroup" in entry), groups,
                                        prelude=recorder.WEIGHT_ACCESS[fmt], constants=constants)
            copy = copy_gbs()
            seconds = timed(kernels, [dispatch], 8, sync)
            out["matvec"][fmt + ("+subgroups" if "subgroup" in entry else "")] = {
                "GBps": nbytes / seconds / 1e9, "of_copy": nbytes / seconds / 1e9 / copy, "us": seconds * 1e6}
        if fmt == "fp16":
            for n in rows:
                out["matmul"][f"{n} rows"] = matmul_figures(kernels, buffers, size, n, sync)
    out["copy_GBps"] = max(copies)
    out["matmul_used"] = "blocked {WG_Y}x{RT}".format(**recorder.BLOCK_SHAPE)
    return out


def projection_bytes(model: GpuModel) -> int:
    return sum(m.nbytes for block in model.blocks for mix in (block.time_mix, block.channel_mix)
               for m in mix.W.values())


def throughput(model, prompt: list[int], steps: int) -> dict:
    model.forward(prompt)  # warm-up: records the step and compiles its pipelines, which a timed run would include
    start = time.perf_counter()
    model.forward(prompt)
    result = {"prefill_tps": len(prompt) / (time.perf_counter() - start)}
    for batch in (1, 16):
        inputs = [StepInput(slot, [prompt[slot]], "last") for slot in range(batch)]
        model.step(inputs)
        start = time.perf_counter()
        for _ in range(steps):
            model.step(inputs)
        result[f"decode_b{batch}_tps"] = batch * steps / (time.perf_counter() - start)
    return result


def precision_figures(adapter: int) -> dict:
    """The precision table of docs/models.md; the same measure as tests/engine/test_gpu.py's bounds."""
    from ai00_like.rwkv import load_model
    from ai00_like.rwkv.formats.safetensors import write_safetensors

    synthetic = Path("/tmp") / f"ai00-like-bench-gpu-{adapter}.st"
    write_safetensors(make_checkpoint("7", seed=4, n_layer=3, n_embd=128, head_size=64, vocab=1000), synthetic,
                      dtype="fp32")
    demo = ROOT / "assets" / "models" / "demo.st"
    cases = {"fp16 (synthetic fp32 v7)": (synthetic, {"precision": "fp16"}),
             "int8 (demo model)": (demo, {"quant": 99, "quant_type": "int8"}),
             "nf4 (demo model)": (demo, {"quant": 99, "quant_type": "nf4"})}
    out, references = {}, {}
    for name, (path, options) in cases.items():
        for seed in (0, 1):
            prompt = np.random.default_rng(seed).integers(100, 1000, 24).tolist()
            if (path, seed) not in references:
                references[path, seed] = greedy(load_model(path, device=str(adapter), precision="fp32"), prompt, 64)
            model = load_model(path, device=str(adapter), **{"precision": "fp32", **options})
            error, agreement = against_reference(model, prompt, *references[path, seed])
            worst = out.get(name, (0.0, 1.0))
            out[name] = (max(worst[0], error), min(worst[1], agreement))
    synthetic.unlink()
    return {name: {"max_rel_err": e, "agreement": a} for name, (e, a) in out.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--adapter", type=int, default=None, help="adapter index (default: the best, software too)")
    parser.add_argument("--quick", action="store_true", help="smaller matrices and model")
    parser.add_argument("--no-save", action="store_true", help=record.NO_SAVE_HELP)
    args = parser.parse_args()
    adapter = args.adapter if args.adapter is not None else best_adapter(allow_software=True).index
    info = list_adapters()[adapter]
    shape = SHAPES["quick" if args.quick else "full"]
    tensors = make_checkpoint("7", seed=1, **shape["model"])
    model_info = detect({k: a.shape for k, a in tensors.items()})
    print(f"adapter {info.describe()}")

    gpu = GpuModel(tensors, model_info, max_batch=16, adapter=adapter, precision="fp16")
    kernels = kernel_figures(gpu, shape["matrix"], shape["rows"])
    print(f"copy kernel: {kernels['copy_GBps']:.2f} GB/s (read + write; the best of its runs beside each matvec)")
    for fmt, m in kernels["matvec"].items():
        print(f"matvec {shape['matrix']}² {fmt}, batch 1: {m['GBps']:.2f} GB/s of weights = "
              f"{m['of_copy']:.2f} × copy ({m['us']:.0f} µs)")
    for rows, figures in kernels["matmul"].items():
        shapes = ", ".join(f"{k} {v:.3g}" for k, v in figures.items())
        print(f"matmul {rows} × {shape['matrix'] // 2}×{shape['matrix']} fp16, GFLOP/s: {shapes}; "
              f"the model uses {kernels['matmul_used']}")

    prompt = np.random.default_rng(2).integers(1, shape["model"]["vocab"], 256).tolist()
    steps = 4 if args.quick else 8
    models = {"fp16": gpu} | {kind: GpuModel(tensors, model_info, max_batch=16, adapter=adapter, quant=99, quant_type=kind)
                              for kind in ("int8", "nf4")}
    speed = {f"gpu_{kind}": throughput(model, prompt, steps) for kind, model in models.items()}
    speed["numpy"] = throughput(CpuModel(tensors, model_info, max_batch=16), prompt, steps)
    print(f"v7 {shape['model']}: tokens/s      prefill  decode b1  decode b16")
    for name, s in speed.items():
        print(f"  {name:10} {s['prefill_tps']:24.1f} {s['decode_b1_tps']:10.1f} {s['decode_b16_tps']:11.1f}")

    memory = {}
    for kind in ("int8", "nf4"):
        memory[kind] = projection_bytes(models[kind]) / projection_bytes(gpu)
        memory[kind + "_all_layer_matrices"] = models[kind].weight_bytes / gpu.weight_bytes
    print(f"weight bytes against fp16: int8 {memory['int8']:.3f}, nf4 {memory['nf4']:.3f} (the projections, "
          f"what is quantised); with the LoRAs, which stay fp16: int8 {memory['int8_all_layer_matrices']:.3f}, "
          f"nf4 {memory['nf4_all_layer_matrices']:.3f}")

    precision = precision_figures(adapter)
    for name, p in precision.items():
        print(f"{name}: max |Δlogits|/std {p['max_rel_err']:.2e}, greedy agreement {p['agreement']:.3f} over 64 steps")
    results = {"adapter": info.describe(), "kernels": kernels, "speed": speed, "memory": memory, "precision": precision}
    print(json.dumps(results))
    record.save("gpu", results, args)


if __name__ == "__main__":
    main()
