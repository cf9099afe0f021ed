"""WebGPU adapters: what the machine offers, which one to use, and a device on it.

Software adapters (Mesa's lavapipe/llvmpipe, SwiftShader, WARP) are listed and usable
(that is how the tests run without a GPU) but `device="auto"` does not pick them.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass

SOFTWARE_NAMES = ("llvmpipe", "lavapipe", "swiftshader", "microsoft basic render")
COMPUTE_BACKENDS = ("Vulkan", "Metal", "D3D12")  # the OpenGL backend's compute is too limited
KIND_RANK = {"DiscreteGPU": 0, "IntegratedGPU": 1, "VirtualGPU": 2, "Other": 3, "Unknown": 3, "CPU": 4}


@dataclass(frozen=True)
class AdapterInfo:
    index: int  # position in `list_adapters()`: what `device=<index>` selects
    name: str
    backend: str  # Vulkan, Metal, D3D12, OpenGL
    kind: str  # DiscreteGPU, IntegratedGPU, CPU, ...
    software: bool
    f16: bool  # shader-f16
    subgroups: bool
    vendor_id: int = 0  # PCI vendor: 0x10DE NVIDIA, 0x1002 AMD, 0x8086 Intel

    @property
    def own_memory(self) -> bool:
        """Whether its buffers live in memory of its own, not in the system's (a discrete GPU)."""
        return not self.software and self.kind in ("DiscreteGPU", "VirtualGPU")

    def describe(self) -> str:
        extras = [x for x, on in (("software", self.software), ("f16", self.f16), ("subgroups", self.subgroups)) if on]
        return f"[{self.index}] {self.name} ({self.backend}, {self.kind}{', ' if extras else ''}{', '.join(extras)})"


def available() -> bool:
    try:
        import wgpu  # noqa: F401
    except ImportError:
        return False
    return True


def _adapters():
    import wgpu

    return list(wgpu.gpu.enumerate_adapters_sync())


def _info(index: int, adapter) -> AdapterInfo:
    info = adapter.info
    name = info.get("device", "") or info.get("description", "")
    kind = info.get("adapter_type", "Unknown")
    features = adapter.features
    software = kind == "CPU" or any(s in name.lower() for s in SOFTWARE_NAMES)
    return AdapterInfo(index, name, info.get("backend_type", ""), kind, software,
                       "shader-f16" in features, "subgroup" in features, int(info.get("vendor_id", 0) or 0))


def list_adapters() -> list[AdapterInfo]:
    """Every adapter wgpu finds (empty when wgpu is not installed); enumerated once per process
    (it takes ~0.3 s with Mesa's drivers, and every `load_model(device="auto")` asks)."""
    return list(_list_adapters())


@functools.cache
def _list_adapters() -> tuple[AdapterInfo, ...]:
    if not available():
        return ()
    try:
        return tuple(_info(i, a) for i, a in enumerate(_adapters()))
    except Exception:  # noqa: BLE001 — a broken driver install must not stop the numpy backend from loading
        return ()


def best_adapter(allow_software: bool) -> AdapterInfo | None:
    """A real GPU first (discrete before integrated); software only if allowed."""
    usable = [a for a in list_adapters() if a.backend in COMPUTE_BACKENDS and (allow_software or not a.software)]
    if not usable:
        return None
    return min(usable, key=lambda a: (a.software, KIND_RANK.get(a.kind, 3), a.index))


class Device:
    """A wgpu device on one adapter, with the buffer limits raised to what the adapter allows
    (rwkv-spec §7.2: the defaults — 128 MiB bindings, 256 MiB buffers — are far below a model's
    matrices on real GPUs)."""

    def __init__(self, index: int):
        adapters = _adapters()
        if not 0 <= index < len(adapters):
            raise ValueError(f"no GPU adapter {index}; found {len(adapters)}")
        adapter = adapters[index]
        self.adapter = _info(index, adapter)
        limits = adapter.limits
        wanted = ("max-storage-buffer-binding-size", "max-buffer-size", "max-storage-buffers-per-shader-stage",
                  "max-compute-workgroup-storage-size", "max-compute-invocations-per-workgroup")
        # subgroups: the matrix–vector kernel's reductions (shaders/matvec_subgroup.wgsl)
        self.subgroups = "subgroup" in adapter.features
        self.device = adapter.request_device_sync(
            required_features=["subgroup"] if self.subgroups else [],
            required_limits={k: limits[k] for k in wanted if k in limits},
        )
        self.limits = self.device.limits
        self.subgroup_width = self._subgroup_width() if self.subgroups else 0

    def _subgroup_width(self) -> int:
        """The subgroup size a 64-invocation compute pipeline gets (drivers may choose per
        pipeline, so kernels must not depend on it for their results, only for their speed)."""
        import numpy as np
        import wgpu

        code = """@group(0) @binding(0) var<storage, read_write> out: array<u32>;
@compute @workgroup_size(64)
fn main(@builtin(subgroup_size) width: u32, @builtin(local_invocation_index) i: u32) {
    if (i == 0u) { out[0] = width; }
}"""
        device = self.device
        pipeline = device.create_compute_pipeline(layout="auto", compute={
            "module": device.create_shader_module(code=code), "entry_point": "main"})
        out = device.create_buffer(size=16, usage=wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_SRC)
        group = device.create_bind_group(layout=pipeline.get_bind_group_layout(0),
                                         entries=[{"binding": 0, "resource": {"buffer": out, "offset": 0, "size": 16}}])
        encoder = device.create_command_encoder()
        compute = encoder.begin_compute_pass()
        compute.set_pipeline(pipeline)
        compute.set_bind_group(0, group)
        compute.dispatch_workgroups(1)
        compute.end()
        device.queue.submit([encoder.finish()])
        width = int(np.frombuffer(device.queue.read_buffer(out), np.uint32)[0])
        return width if 1 <= width <= 128 else 32
