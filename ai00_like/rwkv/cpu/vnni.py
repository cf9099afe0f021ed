"""Int8 products on activations rounded to 16-bit integers: AVX-512 VNNI's `vpdpwssd`.

A prefill chunk's products are bound by multiply-adds. fp32 FMAs do 16 a vector
instruction; `vpdpwssd` does 32 on 16-bit integers, at about the same rate on a Zen 5
core. Int8 weights are integers already (w = low + step · q, q a byte), so only the
activations are rounded: each row of x, per 128 inputs (the weights' block), to 16-bit
integers with a scale of its own,

    x̂ = x_scale · xq,  |xq| ≤ 32,767,  x_scale = max |x| / 32,767 over the 128,

and the product is W · x̂ computed exactly but for the last fp32 roundings: a block's share
is step · x_scale · Σ q·xq + low · x_scale · Σ xq, with Σ q·xq an exact 32-bit integer
(255 · 32,767 · 128 < 2³¹). Each row is rounded by itself, and every kernel folds a
block's exact sums into the row's total with the same operations in the same order
(vnni_ir.py), so a row's result is the same to the bit whatever the other rows of its
step, the chunk its prompt was cut into, or the kernel that ran it.

The weights are kept for these kernels (RoundedInt8): 48 rows a panel, a pair of inputs of
every row of a panel side by side, so that a load of 32 bytes is a pair of 16 rows, as
`vpdpwssd` takes them; one kernel multiplies them with any number of rows of x, 8 at a
time, a weight block at a time (vnni_ir.py).

A model multiplies its Int8 matrices this way when the CPU has AVX-512 VNNI and the model
is not `exact` (CpuModel): its matrices are then `RoundedInt8`, a weight form of its own
(ROUNDED_INT8) that every product of every row count goes through.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import numpy as np

from ..quant import BLOCK, QuantisedMatrix
from . import intrinsics, vector_dots
from .jit import launch, read_only
from .weight_form import WeightForm

TO_SCALE = np.float32(1.0 / 32767.0)  # 32,767: the largest rounded activation
INT8_BLOCK = BLOCK["int8"]
PANEL = 48  # weight rows a panel: vnni_ir's 3 vectors of 16
# From this many rows of x they are rounded on the cores together; fewer, a decoding step's,
# in the calling thread, one launch fewer.
PARALLEL_ROUNDING_ROWS = 48
# Rows of x the kernel takes through all the weight blocks before the next rows: their
# totals (24 KiB) stay in L1 and their x in L2.
GROUP_ROWS = 128
# A launch's share-outs of the panels, each with its totals: one a panel allocated 1,366 of
# them for a 65,536-row head at every decoding step.
MAX_TASKS = 64


class RoundedInt8(NamedTuple):
    """An Int8 matrix of `rows` × K as the kernels read it: q [panels, K/2, 2 · PANEL]
    bytes, pair p of each of a panel's rows side by side, and bounds [panels, K/128, 2,
    PANEL], each block's low and high (w = low + step · q, step = (high − low) / 255) as
    fp16 bit patterns, a panel's rows side by side. Rows past the last are zero."""

    q: np.ndarray
    bounds: np.ndarray
    rows: int

    @property
    def shape(self) -> tuple[int, int]:
        return self.rows, 2 * self.q.shape[1]

    @property
    def nbytes(self) -> int:
        return self.q.nbytes + self.bounds.nbytes

    @classmethod
    def of(cls, matrix) -> RoundedInt8:
        """An int8.PackedInt8 (q [N, K] bytes, bounds [N, 2·K/128]) in panels."""
        rows, cols = matrix.q.shape
        panels = -(-rows // PANEL)
        q = _in_panels(matrix.q.reshape(rows, cols // 2, 2), panels).transpose(0, 2, 1, 3)
        bounds = _in_panels(matrix.bounds.reshape(rows, -1, 2), panels).transpose(0, 2, 3, 1)
        kept = (q.reshape(panels, cols // 2, 2 * PANEL), bounds)
        return cls(*(read_only(np.ascontiguousarray(a)) for a in kept), rows)

    def packed(self) -> tuple[np.ndarray, np.ndarray]:
        """(q [N, K], bounds [N, 2·K/128]) in rows again, as int8.PackedInt8 holds them."""
        q = self.q.reshape(len(self.q), -1, PANEL, 2).transpose(0, 2, 1, 3).reshape(-1, self.shape[1])
        bounds = self.bounds.transpose(0, 3, 1, 2).reshape(len(self.q) * PANEL, -1)
        return np.ascontiguousarray(q[: self.rows]), np.ascontiguousarray(bounds[: self.rows])


def _in_panels(a: np.ndarray, panels: int) -> np.ndarray:
    """a [N, …] as [panels, PANEL, …], the rows past N zero."""
    whole = np.zeros((panels * PANEL, *a.shape[1:]), a.dtype)
    whole[: len(a)] = a
    return whole.reshape(panels, PANEL, *a.shape[1:])


class PanelledInt8(QuantisedMatrix):
    """An Int8 QuantisedMatrix whose bytes are kept in panels (a RoundedInt8), in the
    model's tensors instead of the rows it was loaded as: the model then holds the matrix
    once. Its packed words and scales are the rows' again, made as they are asked for
    (saving the model, dequantising)."""

    def __init__(self, rounded: RoundedInt8):  # the fields are properties here
        self.kind, self.shape, self.rounded = "int8", rounded.shape, rounded

    @property
    def packed(self) -> np.ndarray:
        return self.rounded.packed()[0].reshape(-1).view(np.uint32)

    @property
    def scales(self) -> np.ndarray:
        return self.rounded.packed()[1].reshape(-1).view(np.uint32)

    @property
    def nbytes(self) -> int:
        return self.rounded.nbytes


# Module-level kernels, compiled below where numba and VNNI are (skinny.py says why not nested).
prange = range
round_rows_here = block8 = block4 = block2 = block1 = None


def round_rows(x, xq, x_scale, x_sum):  # pragma: no cover - compiled by numba
    """Each row and 128-input block of x [M, K] as xq [K/128, M, 128] int16 (a block's rows
    side by side, as the kernels read them) with its x_scale, and x_sum = x_scale · Σ xq.
    Only multiplications, a maximum and an integer sum: the same bits under any
    reassociation."""
    M, K = x.shape
    for m in prange(M):
        for b in range(K // INT8_BLOCK):
            first = b * INT8_BLOCK
            largest = np.float32(0.0)
            for k in range(first, first + INT8_BLOCK):
                largest = max(largest, abs(x[m, k]))
            scale = largest * TO_SCALE
            inverse = np.float32(1.0) / scale if scale > 0 else np.float32(0.0)
            total = 0
            for k in range(first, first + INT8_BLOCK):
                value = np.int32(np.rint(x[m, k] * inverse))
                xq[b, m, k - first] = np.int16(value)
                total += value
            x_scale[m, b] = scale
            x_sum[m, b] = scale * np.float32(total)


def panel_product(q, bounds, xq, x_scale, x_sum, out):  # pragma: no cover - compiled by numba
    panels = q.shape[0]
    M, N = out.shape
    blocks = bounds.shape[1]
    tasks = min(panels, MAX_TASKS)
    for task in prange(tasks):
        totals = np.empty((min(M, GROUP_ROWS), PANEL), dtype=np.float32)
        for p in range(task * panels // tasks, (task + 1) * panels // tasks):
            panel, panel_bounds = q[p], bounds[p]
            first = p * PANEL
            for group in range(0, M, GROUP_ROWS):
                last = min(M, group + GROUP_ROWS)
                totals[:] = 0
                for b in range(blocks):
                    j = group
                    while j + 8 <= last:
                        block8(panel, panel_bounds, xq, x_scale, x_sum, b, j, group, totals)
                        j += 8
                    if j + 4 <= last:
                        block4(panel, panel_bounds, xq, x_scale, x_sum, b, j, group, totals)
                        j += 4
                    if j + 2 <= last:
                        block2(panel, panel_bounds, xq, x_scale, x_sum, b, j, group, totals)
                        j += 2
                    if j < last:
                        block1(panel, panel_bounds, xq, x_scale, x_sum, b, j, group, totals)
                for m in range(group, last):
                    for o in range(min(PANEL, N - first)):
                        out[m, first + o] = totals[m - group, o]


def product(W, x, out):  # pragma: no cover - compiled by numba
    """out = x · Wᵀ, x rounded: the kernel for compiled callers (fused7.py) and the entry's."""
    M, K = x.shape
    xq = np.empty((K // INT8_BLOCK, M, INT8_BLOCK), dtype=np.int16)
    x_scale = np.empty((M, K // INT8_BLOCK), dtype=np.float32)
    x_sum = np.empty((M, K // INT8_BLOCK), dtype=np.float32)
    if M >= PARALLEL_ROUNDING_ROWS:
        round_rows(x, xq, x_scale, x_sum)
    else:
        round_rows_here(x, xq, x_scale, x_sum)
    panel_product(W.q, W.bounds, xq.view(np.int32), x_scale, x_sum, out)


def entry(W, x, out):  # pragma: no cover - compiled by numba
    product(W, x, out)


def rounded_int8_matmul(x: np.ndarray, w: RoundedInt8) -> np.ndarray:
    """x [M, K] · Wᵀ → [M, N], x rounded per row and block to 16-bit integers."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    out = np.empty((x.shape[0], w.shape[0]), dtype=np.float32)
    launch(_entry, w, x, out)
    return out


@functools.cache
def available() -> bool:
    """Whether numba compiles for a CPU with AVX-512 VNNI (this one, or NUMBA_CPU_FEATURES')."""
    features = vector_dots.cpu_features()
    return _entry is not None and bool(features.get("avx512vnni"))


def _build():
    tools = intrinsics.build()
    if tools is None or vector_dots.vector_width() != 16:
        return None
    from numba.extending import intrinsic

    from . import vnni_ir  # needs numba, configured by intrinsics.build() above

    global prange, block8, block4, block2, block1, round_rows, round_rows_here, panel_product, product
    prange = tools.prange
    block8, block4, block2, block1 = (intrinsic(vnni_ir.int16_block(n, INT8_BLOCK // 2)) for n in (8, 4, 2, 1))
    # No fast-math flags: numba would put them on the kernels' IR too, and LLVM then
    # reassociates each kernel's fold its own way (the bits differed between row counts).
    exact = functools.partial(tools.jit, fastmath=False)
    round_rows_here = exact(parallel=False, inline="always")(round_rows)  # the same code, rows in turn: the same bits
    round_rows, panel_product = exact()(round_rows), exact()(panel_product)
    product = exact(parallel=False)(product)
    return exact(parallel=False)(entry)


_entry = _build()

ROUNDED_INT8 = WeightForm("int8, rounded activations", RoundedInt8,
                          lambda matrix: matrix.rounded if isinstance(matrix, PanelledInt8) else None, rounded_int8_matmul,
                          1 << 30, None, lambda w: w, product, None)
