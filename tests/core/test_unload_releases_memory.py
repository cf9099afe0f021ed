"""Unloading a model gives its memory back: the GPU's buffers (wgpu's own count of live
objects, on any adapter, lavapipe included) and, on the CPU, the process's resident memory
(tests/system/test_many_models_memory.py)."""

from __future__ import annotations

import gc

import pytest
from serving_helpers import generate, load

from ai00_like.messages import Loaded, ModelSpec, Unload

wgpu = pytest.importorskip("wgpu", reason="the GPU backend needs the wgpu package", exc_type=ImportError)
from ai00_like.rwkv.gpu.device import best_adapter  # noqa: E402

ADAPTER = best_adapter(allow_software=True)


def live_buffers() -> tuple[int, int]:
    """(buffers alive, their bytes) as wgpu counts them."""
    gc.collect()
    counts = wgpu.diagnostics.object_counts.get_dict()
    return counts["Buffer"]["count"], counts["total"]["resource_mem"]


@pytest.mark.skipif(ADAPTER is None, reason="no WebGPU adapter with compute (apt-get install mesa-vulkan-drivers)")
def test_unloading_a_gpu_model_frees_its_buffers(middleware, model_files):
    before = live_buffers()
    spec = ModelSpec(path=model_files[0], device="gpu", precision="fp32", max_batch=2, name="a")
    assert isinstance(load(middleware, spec), Loaded)
    assert generate(middleware, "Hello", max_tokens=3).wait().finish == ["length"]
    loaded = live_buffers()
    assert loaded[0] > before[0] + 10 and loaded[1] > before[1]  # weights, states and workspaces
    done = []
    middleware.send(Unload(done.append, model="a"))
    deadline = 200
    while not done and deadline:
        deadline -= 1
        gc.collect()
        __import__("time").sleep(0.05)
    assert done and live_buffers() == before
