"""Building synthetic models for the engine tests, on either backend."""

from __future__ import annotations

import functools

import pytest

from ai00_like.rwkv.accuracy import greedy, rel_err  # noqa: F401 — the tests' helpers
from ai00_like.rwkv.cpu.model import CpuModel
from ai00_like.rwkv.info import detect
from ai00_like.rwkv.synthetic import make_checkpoint


@functools.cache
def gpu_adapter() -> int | None:
    """A WebGPU adapter for the GPU variants of the tests (Mesa's lavapipe in CI), or None."""
    try:
        from ai00_like.rwkv.gpu.device import best_adapter
    except ImportError:  # wgpu missing or unable to load its library
        return None
    best = best_adapter(allow_software=True)
    return best.index if best is not None else None


NEEDS_GPU = pytest.mark.skipif(gpu_adapter() is None,
                               reason="no WebGPU adapter (pip install wgpu; apt-get install mesa-vulkan-drivers)")
# The engine tests run on both backends; the GPU one with fp32 weights, to numpy's tolerances.
BACKENDS = ["numpy", pytest.param("gpu", marks=NEEDS_GPU)]


def model_of(tensors, backend: str = "numpy", max_batch: int = 1, **options):
    info = detect({k: a.shape for k, a in tensors.items()})
    if backend == "numpy":
        return CpuModel(tensors, info, max_batch=max_batch)
    from ai00_like.rwkv.gpu.model import GpuModel

    return GpuModel(tensors, info, max_batch=max_batch, adapter=gpu_adapter(), **{"precision": "fp32", **options})


def synthetic_model(version: str, max_batch: int = 1, backend: str = "numpy", **kwargs):
    return model_of(make_checkpoint(version, **kwargs), backend, max_batch)
