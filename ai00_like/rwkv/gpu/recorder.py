"""Recording a step's compute dispatches: the activation buffer's regions, the plan table the
kernels read, and a `Recorder` whose methods are the kernels a block is written in (layer
norm, token shift, mix, matrix product, element-wise product, WKV)."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ..batch import StepLayout
from ..norms import LN_EPS
from .buffers import Matrix, Uploader
from .device import Device
from .kernels import Kernels
from .states import GpuStates

# Regions of the activation buffer, each `capacity` rows of the widest vector. The six
# mixed inputs of the v7 time mix are consecutive, in the order of its coefficients (rwkvag).
REGIONS = ("x", "z", "prev", "xr", "xw", "xk", "xv", "xa", "xg",
           "r", "w", "k", "v", "a", "b", "g", "y", "t", "vfirst", "h")
# The plan table, in multiples of the capacity: per row (slot, first of its segment?) from 0,
# per segment (slot, first row, rows) from SEGMENTS, the rows whose logits are wanted from WANTED.
SEGMENTS, WANTED, PLAN_SIZE = 2, 5, 6
MATVEC_ROWS = 16  # up to this many rows go through the matrix–vector kernels (a decoding batch)
TILE_N = 4  # weight rows per thread of the tiled kernel; bench/gpu.py compares tile shapes
WEIGHT_ACCESS = {  # matmul.wgsl's weight reads per storage format
    "fp32": "weights_f32.wgsl", "fp16": "weights_f16.wgsl", "int8": "weights_int8.wgsl", "nf4": "weights_nf4.wgsl"}
NONE, TANH, SIGMOID, RELU2, SILU = 0, 1, 2, 3, 4  # activations fused into the products


def matmul_tile(rows: int, software: bool = True) -> tuple:
    """The tiled kernel's constants: TM × TILE_N outputs per thread, a block of 16·TM rows.
    A software adapter (lavapipe) runs fastest with the tallest block the rows need (up to 4);
    a GPU with one row per thread (TM 1): on an NVIDIA H200 it prefilled 1.5× faster than with
    TM 4 at the 0.1B shape and as fast at 1.5B (bench/gpu_reference.py --tiles)."""
    tm = min(4, 1 << max(0, (rows - 1) // 16).bit_length()) if software else 1
    return (("TM", tm), ("TN", TILE_N), ("ROWS", 8 if rows <= 8 else MATVEC_ROWS))


class PrefillKernel(NamedTuple):
    """A matrix–matrix kernel for many rows: its shader files, entry, constants and the rows
    and outputs one workgroup computes."""
    shader: str | tuple[str, ...]
    entry: str
    constants: tuple
    block_rows: int
    block_outputs: int = 64


# The blocked kernel's shape: 16 × WG_Y threads of RT rows × 4 outputs each (bench/gpu.py and
# bench/gpu_reference.py --tiles compare shapes).
BLOCK_SHAPE = {"WG_Y": 16, "RT": 4}
STAGED_K = 32  # matmul_blocked.wgsl's BK: the steps of K staged at a time
NF4_TABLE_BYTES = 64  # weights_nf4.wgsl's levels in workgroup memory


def blocked_workgroup_bytes(shape: dict) -> int:
    """Workgroup memory the blocked kernel needs: its staged x (RT·WG_Y rows) and W (64
    outputs) for STAGED_K steps of K, and NF4's table of levels."""
    return 4 * STAGED_K * (shape["RT"] * shape["WG_Y"] + 64) + NF4_TABLE_BYTES


def prefill_kernel(rows: int, k: int, software: bool, workgroup_bytes: int) -> PrefillKernel:
    """The blocked kernel (shaders/matmul_blocked.wgsl) where K allows 8-weight loads, which
    is every projection of a released model, and the device's workgroup memory (WebGPU
    promises 16 KiB, most GPUs give 32 or more) holds its blocks; else the tiled kernel."""
    tile = matmul_tile(rows, software)
    if k % 8 == 0 and blocked_workgroup_bytes(BLOCK_SHAPE) <= workgroup_bytes:
        shape = (*BLOCK_SHAPE.items(), ("BK", STAGED_K))
        return PrefillKernel(("matmul.wgsl", "matmul_blocked.wgsl"), "matmul_blocked", (*tile, *shape),
                             BLOCK_SHAPE["WG_Y"] * BLOCK_SHAPE["RT"])
    return PrefillKernel("matmul.wgsl", "matmul_tiled", tile, 16 * tile[0][1], 16 * TILE_N)


def matvec_group_rows(entry: str, subgroup_width: int) -> int:
    """Outputs per workgroup of the subgroup matrix–vector kernels: for each subgroup of their
    64 invocations 8 (matvec8_subgroup) or 4 (matvec8_rows_subgroup, for every row of x)."""
    return (8 if entry == "matvec8_subgroup" else 4) * max(1, 64 // max(1, subgroup_width))


class Workspace:
    """The buffers a step works in, for up to `capacity` rows: the activations, the plan
    table and the wanted rows' logits. They grow (to a power of two) and never shrink."""

    def __init__(self, up: Uploader, width: int, vocab: int):
        self.up, self.width, self.vocab = up, width, vocab
        self.capacity = 0

    def reserve(self, rows: int) -> bool:
        """Make room for `rows` rows; True when the buffers were replaced (recorded steps bind
        the old ones)."""
        if rows <= self.capacity:
            return False
        self.capacity = capacity = max(16, 1 << (rows - 1).bit_length())
        self.region = capacity * self.width
        self.act = self.up.buffer(len(REGIONS) * self.region)
        self.plan = self.up.buffer(PLAN_SIZE * capacity)
        self.logits = self.up.buffer(capacity * self.vocab)
        return True

    def off(self, region: str) -> int:
        return REGIONS.index(region) * self.region

    def write_plan(self, layout: StepLayout) -> None:
        plan, cap = layout.plan, self.capacity
        table = np.zeros(PLAN_SIZE * cap, dtype=np.uint32)
        first = np.zeros(plan.n_rows, dtype=np.uint32)
        first[plan.starts] = 1
        table[0 : 2 * plan.n_rows : 2] = np.repeat(plan.slots, plan.stops - plan.starts)
        table[1 : 2 * plan.n_rows : 2] = first
        segments = np.stack([plan.slots, plan.starts, plan.stops - plan.starts], axis=1).reshape(-1)
        table[SEGMENTS * cap : SEGMENTS * cap + len(segments)] = segments
        table[WANTED * cap : WANTED * cap + len(layout.wanted)] = layout.wanted
        self.up.device.queue.write_buffer(self.plan, 0, table)


class Recorder:
    """The dispatches of one step shape (`rows` stacked rows in `segments` slots), in order."""

    def __init__(self, kernels: Kernels, gpu: Device, space: Workspace, states: GpuStates, info, rows: int,
                 segments: int, subgroups: bool):
        self.kernels, self.space, self.states, self.info = kernels, space, states, info
        self.rows, self.segments = rows, segments
        self.subgroups, self.subgroup_width = subgroups, gpu.subgroup_width
        self.software = gpu.adapter.software
        self.workgroup_bytes = gpu.limits["max-compute-workgroup-storage-size"]
        self.act, self.plan, self.off = space.act, space.plan, space.off
        self.C = info.n_embd
        self.groups_c = (self.C + 63) // 64  # workgroups of 64 over a row's channels
        self.segment_table = SEGMENTS * space.capacity  # where the kernels find the segments
        self.out: list = []

    def dispatch(self, shader, entry: str, params: tuple, buffers: list, groups, **options) -> None:
        self.out.append(self.kernels.dispatch(shader, entry, params, buffers, groups, **options))

    @staticmethod
    def mixed(q: int) -> str:
        """The region of the q-th mixed input (mix writes `count` of them from "xr" on)."""
        return REGIONS[REGIONS.index("xr") + q]

    def norm(self, src: str, dst: str, weights, n_rows: int | None = None, groups: int = 1, eps: float = LN_EPS):
        n_rows = self.rows if n_rows is None else n_rows
        self.dispatch("layer_norm.wgsl", "main", (n_rows, self.C, groups, self.off(src), self.off(dst), eps),
                      [self.act, *weights], (groups, n_rows))

    def linear(self, src: str, matrix: Matrix, dst: str | None, activation: int = NONE, accumulate: int = 0,
               target=None, n_rows: int | None = None, src_shift: int = 0, src_stride: int | None = None):
        """dst (+)= activation(src · matrixᵀ), by the kernel that suits the rows: matrix–vector
        for a decoding batch (one subgroup per outputs where the adapter has subgroups), blocked
        for a prefill. `target`: a buffer of its own instead of the activations (the logits)."""
        n_rows = self.rows if n_rows is None else n_rows
        off = self.off
        M, K = matrix.rows, matrix.cols
        tile = matmul_tile(n_rows, self.software)
        dst_off = 0 if target is not None else off(dst)
        for part in matrix.parts:
            params = (n_rows, part.rows, K, off(src) + src_shift, src_stride or K, 0, dst_off + part.first,
                      M, activation, accumulate)
            shader, constants = "matmul.wgsl", tile
            if n_rows > 1 and n_rows <= MATVEC_ROWS and K % 8 == 0:
                entry, groups = "matvec8_rows", ((part.rows + 3) // 4, 1)
            elif n_rows < MATVEC_ROWS:
                entry, groups = "matvec8" if K % 8 == 0 else "matvec", ((part.rows + 3) // 4, n_rows)
            else:
                kernel = prefill_kernel(n_rows, K, self.software, self.workgroup_bytes)
                shader, entry, constants = kernel.shader, kernel.entry, kernel.constants
                groups = (-(-part.rows // kernel.block_outputs), -(-n_rows // kernel.block_rows))
            if entry in ("matvec8", "matvec8_rows") and self.subgroups:
                # each subgroup on its own outputs: no workgroup reduction (shaders/matvec_subgroup.wgsl)
                shader, entry = ("matmul.wgsl", "matvec_subgroup.wgsl"), entry + "_subgroup"
                rows_per_group = matvec_group_rows(entry, self.subgroup_width)
                groups = (-(-part.rows // rows_per_group), groups[1])
                x4 = int((off(src) + src_shift) % 4 == 0 and (src_stride or K) % 4 == 0)
                constants = (*tile, ("GROUP_ROWS", rows_per_group), ("X4", x4))
            buffers = [self.act, part.buffer, target or self.act, part.scales]
            if "subgroup" in entry:
                buffers.append(self.act)  # binding 5: x as vec4
            self.dispatch(shader, entry, params, buffers, groups, prelude=WEIGHT_ACCESS[matrix.format],
                          constants=constants)

    def multiply(self, a: str, b: str, dst: str, accumulate: int = 0) -> None:
        self.dispatch("elementwise.wgsl", "mul", (self.C, self.off(a), self.off(b), self.off(dst), accumulate),
                      [self.act], (self.groups_c, self.rows))

    def shift(self, part: str, layer: int) -> None:
        """"prev" = the row before each row of "z" (the slot's saved row for a segment's first);
        then each slot saves its last row of "z"."""
        params = (self.C, self.segment_table, self.off("z"), self.off("prev"), *self.states.at(part, layer))
        buffers = [self.act, getattr(self.states.buffers, part), self.plan]
        self.dispatch("token_shift.wgsl", "shift", params, buffers, (self.groups_c, self.rows))
        self.dispatch("token_shift.wgsl", "save", params, buffers, (self.groups_c, self.segments))

    def mix(self, mu, count: int, dst: str = "xr", entry: str = "main") -> None:
        """`count` mixes of "z" and "prev" by the rows of `mu`, into consecutive regions from `dst`."""
        self.dispatch("mix.wgsl", entry, (self.C, self.off("z"), self.off("prev"), self.off(dst), self.space.region),
                      [self.act, mu], (self.groups_c, self.rows, count))

    def wkv(self, shader: str, params: tuple, vecs, groups) -> None:
        """The recurrence over each segment, on its slot's WKV state (`params` from the block)."""
        self.dispatch(shader, "main", params, [self.act, self.states.buffers.wkv, self.plan] + ([vecs] if vecs else []),
                      groups)
