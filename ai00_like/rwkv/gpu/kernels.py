"""WGSL compute pipelines (compiled once per device and cached) and recorded dispatches."""

from __future__ import annotations

import struct
from dataclasses import dataclass
from pathlib import Path

import wgpu

SHADERS = Path(__file__).parent / "shaders"


@dataclass
class Dispatch:
    pipeline: object
    bind_group: object
    groups: tuple[int, int, int]


def pack_params(*values) -> bytes:
    """A uniform block of 4-byte fields in order: ints as u32, floats as f32 (padded to 16 bytes)."""
    data = b"".join(struct.pack("<f" if isinstance(v, float) else "<I", v) for v in values)
    return data + b"\0" * (-len(data) % 16)


class Kernels:
    def __init__(self, device):
        self.device = device
        self._modules: dict[tuple, object] = {}
        self._pipelines: dict[tuple, object] = {}

    def pipeline(self, file: str | tuple[str, ...], entry: str = "main", prelude: str | None = None,
                 constants: tuple = ()):
        """The pipeline of `entry` in `file` (or files, concatenated), compiled with the file
        `prelude` before it (how matmul.wgsl gets its weight access per format) and
        `constants`, (name, value) pairs declared as `const name: u32` (its tile shape)."""
        key = (file, entry, prelude, constants)
        if key not in self._pipelines:
            module = (file, prelude, constants)
            if module not in self._modules:
                code = "\n".join((SHADERS / f).read_text() for f in ((file,) if isinstance(file, str) else file))
                if prelude:
                    code = (SHADERS / prelude).read_text() + "\n" + code
                code = "".join(f"const {name}: u32 = {value}u;\n" for name, value in constants) + code
                self._modules[module] = self.device.create_shader_module(label=str(file), code=code)
            self._pipelines[key] = self.device.create_compute_pipeline(
                label=f"{file}:{entry}", layout="auto",
                compute={"module": self._modules[module], "entry_point": entry},
            )
        return self._pipelines[key]

    def dispatch(self, file: str | tuple[str, ...], entry: str, params: tuple, buffers: list, groups, prelude: str | None = None,
                 constants: tuple = ()) -> Dispatch:
        """Record one dispatch: binding 0 is the params block, then `buffers` as bindings 1…
        (None: a binding the kernel does not have)"""
        pipeline = self.pipeline(file, entry, prelude, constants)
        uniform = self.device.create_buffer_with_data(data=pack_params(*params), usage=wgpu.BufferUsage.UNIFORM)
        entries = [{"binding": 0, "resource": {"buffer": uniform, "offset": 0, "size": uniform.size}}]
        entries += [{"binding": i + 1, "resource": {"buffer": b, "offset": 0, "size": b.size}}
                    for i, b in enumerate(buffers) if b is not None]
        bind_group = self.device.create_bind_group(layout=pipeline.get_bind_group_layout(0), entries=entries)
        g = tuple(groups) + (1,) * (3 - len(groups))
        return Dispatch(pipeline, bind_group, g)

    def encode(self, dispatches: list[Dispatch]):
        """One compute pass of `dispatches`, finished into a command buffer to submit."""
        encoder = self.device.create_command_encoder()
        compute = encoder.begin_compute_pass()
        pipeline = None
        for d in dispatches:
            if d.pipeline is not pipeline:  # a pass keeps its pipeline: ~40% of a step's dispatches reuse it
                compute.set_pipeline(d.pipeline)
                pipeline = d.pipeline
            compute.set_bind_group(0, d.bind_group)
            compute.dispatch_workgroups(*d.groups)
        compute.end()
        return encoder.finish()

    def run(self, dispatches: list[Dispatch]) -> None:
        self.device.queue.submit([self.encode(dispatches)])


class EncodedAhead:
    """A decoding step's command buffer, encoded while the GPU runs the step before it.

    The host takes about 10 µs to encode each of a step's hundreds of dispatches: 3.2-6.3 ms
    of a 5.5-16.5 ms batch-1 step on an NVIDIA H200's host (bench/gpu_reference.py). A step's
    dispatches do not depend on its tokens, which reach the GPU through buffers, so the next
    step of the same recorded program can be encoded during this one's wait for its logits."""

    def __init__(self, kernels: Kernels):
        self.kernels = kernels
        self.program: list[Dispatch] | None = None
        self.buffer = None

    def submit(self, program: list[Dispatch]) -> None:
        """Run `program`: its buffer encoded ahead if that was for this very program."""
        buffer = self.buffer if program is self.program else self.kernels.encode(program)
        self.program = self.buffer = None
        self.kernels.device.queue.submit([buffer])

    def prepare(self, program: list[Dispatch]) -> None:
        """Encode `program` for a next step (dropped if that step runs another)."""
        self.program, self.buffer = program, self.kernels.encode(program)
