"""Memory benchmark: what loading, converting and quantising a released bf16 `.pth` costs.

A seeded RWKV-7 of a real model's shape (default the 1.5B one: L24, D2048, V65536, about
3 GB as bf16), written once to bench/.cache as a bf16 `.pth`, as BlinkDL releases them.
Each operation runs in a process of its own, and its peak resident memory (VmHWM) is
compared with the file's size N (target: at most 1.3 × N for every operation):

* loading it on the CPU at precision `auto` (kept bf16), `fp16` (converted layer by
  layer) and quantised Int8 / NF4 in every layer;
* `ai00-like convert` to fp16 and bf16 `.st`, and to Int8 / NF4 prefab files.

For the loads it also gives the memory resident once loaded beside the bytes the weights
take in the chosen format (target: at most 1.15 × those, plus states and buffers; the
runtime's own share, measured by loading the same shape with 1 layer, is subtracted).

    .venv/bin/python bench/load_memory.py [--shape 1.5B|0.4B]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

import record
from shapes import CACHE, bf16_checkpoint

THREADS = 2
MAX_BATCH = 4

PEAK = """
def memory():
    status = dict(line.split(":", 1) for line in open("/proc/self/status"))
    return {k: int(status[k].split()[0]) * 1024 for k in ("VmHWM", "VmRSS")}
"""

# Loads the model as the server does, steps it once, and reports peak and resident bytes
# with the bytes its weights take in the chosen format.
LOAD = PEAK + """
import json, sys
from ai00_like.rwkv import load_model
from ai00_like.rwkv.batch import StepInput
from ai00_like.rwkv.memory import resident_bytes
path, options = sys.argv[1], json.loads(sys.argv[2])
model = load_model(path, device="cpu", max_batch=%d, **options)
model.step([StepInput(0, [1, 2, 3])])
print(json.dumps({**memory(), "weights": resident_bytes(model.tensors, model.precision)}))
""" % MAX_BATCH

CONVERT = PEAK + """
import json, sys
from ai00_like.cli import main
if main(["convert", *json.loads(sys.argv[2]), sys.argv[1], sys.argv[3]]):
    sys.exit("the conversion failed")
print(json.dumps(memory()))
"""


def run(code: str, *args: str) -> dict:
    env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_CORETYPE"}
    env.update(OMP_NUM_THREADS=str(THREADS), OPENBLAS_NUM_THREADS=str(THREADS), NUMBA_NUM_THREADS=str(THREADS))
    out = subprocess.run([sys.executable, "-c", textwrap.dedent(code), *args], env=env, capture_output=True, text=True)
    if out.returncode != 0:
        raise SystemExit(f"benchmark process failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


LOADS = {
    "load auto (bf16)": {},
    "load fp16": {"precision": "fp16"},
    "load Int8": {"quant": 1000, "quant_type": "int8"},
    "load NF4": {"quant": 1000, "quant_type": "nf4"},
}
CONVERSIONS = {
    "convert to fp16 .st": ["--dtype", "fp16"],
    "convert to bf16 .st": ["--dtype", "bf16"],
    "convert to Int8 prefab": ["--quant", "1000", "--quant-type", "int8"],
    "convert to NF4 prefab": ["--quant", "1000", "--quant-type", "nf4"],
}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", choices=["0.4B", "1.5B"], default="1.5B")
    parser.add_argument("--no-save", action="store_true", help=record.NO_SAVE_HELP)
    args = parser.parse_args()
    path = bf16_checkpoint(args.shape)
    size = path.stat().st_size
    gib = 2**30
    print(f"v7 {args.shape} as a bf16 .pth: N = {size / gib:.2f} GiB")
    results: dict = {"shape": args.shape, "file_bytes": size, "loads": {}, "conversions": {}}

    # What the runtime keeps whatever the model (numba's kernels, libraries, a few states):
    # the same shape with one layer, less that layer's and the head's weights.
    small = run(LOAD, str(bf16_checkpoint(args.shape, n_layer=1)), "{}")
    runtime = small["VmRSS"] - small["weights"]
    print(f"runtime (1-layer model less its weights): {runtime / 2**20:.0f} MiB")
    print(f"{'':26}{'peak GiB':>10}{'peak / N':>10}{'resident GiB':>14}{'weights GiB':>13}{'(res. - runtime) / weights':>28}")
    for label, options in LOADS.items():
        r = run(LOAD, str(path), json.dumps(options))
        above = (r["VmRSS"] - runtime) / r["weights"]
        results["loads"][label] = {**r, "peak_vs_file": r["VmHWM"] / size, "resident_vs_weights": above}
        print(f"{label:26}{r['VmHWM'] / gib:10.2f}{r['VmHWM'] / size:10.2f}{r['VmRSS'] / gib:14.2f}"
              f"{r['weights'] / gib:13.2f}{above:28.2f}")
    with tempfile.TemporaryDirectory(dir=CACHE) as tmp:
        for label, flags in CONVERSIONS.items():
            out = Path(tmp) / "out.st"
            r = run(CONVERT, str(path), json.dumps(flags), str(out))
            results["conversions"][label] = {**r, "peak_vs_file": r["VmHWM"] / size, "out_bytes": out.stat().st_size}
            print(f"{label:26}{r['VmHWM'] / gib:10.2f}{r['VmHWM'] / size:10.2f}")
            out.unlink()
    results["runtime_bytes"] = runtime
    print(json.dumps(results))
    record.save("load_memory", results, args)


if __name__ == "__main__":
    main()
