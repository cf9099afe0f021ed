"""A GPU-only process never loads the CPU backend: importing the GPU model and the loading
path that leads to it must not import numba or llvmlite (the CPU kernels' compiler), which
would also take the CPU backend's process-wide settings (malloc's thresholds, numba's CPU
features and cache folder) with it."""

from __future__ import annotations

import json
import subprocess
import sys

CHECK = """
import json, sys
import ai00_like.rwkv
import ai00_like.rwkv.loader
import ai00_like.rwkv.gpu.model
import ai00_like.rwkv.gpu.device
print(json.dumps(sorted(name for name in sys.modules if name.split(".")[0] in ("numba", "llvmlite")
                        or name.startswith("ai00_like.rwkv.cpu"))))
"""


def test_the_gpu_backend_imports_nothing_of_the_cpu_one():
    done = subprocess.run([sys.executable, "-c", CHECK], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == []


SERVER = """
import json, sys
import ai00_like.api.app
import ai00_like.middleware
print(json.dumps(sorted(name for name in sys.modules if name.startswith("ai00_like.rwkv.cpu"))))
"""


def test_the_server_builds_no_cpu_kernel_before_a_cpu_model_is_made():
    # The sampler's own kernel shares jit.py's settings (it samples on the CPU whatever the
    # backend); the engine's kernels, and the LLVM intrinsics they are built on, wait for
    # the first CPU model.
    done = subprocess.run([sys.executable, "-c", SERVER], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == ["ai00_like.rwkv.cpu", "ai00_like.rwkv.cpu.jit"]
