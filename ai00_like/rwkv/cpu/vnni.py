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

Many rows of x (PANEL_ROWS or more) go through the panel kernel: each task packs 48 weight
rows into 16-bit pairs and multiplies them with every row of x, a weight block at a time,
8 rows a register block. Fewer go through the row kernel, which reads the weights where
they are stored.

A model multiplies its Int8 matrices this way when the CPU has AVX-512 VNNI and the model
is not `exact` (CpuModel): its matrices are then `RoundedInt8`, a weight form of its own
(ROUNDED_INT8) that every product of every row count goes through.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import numpy as np

from ..quant import BLOCK
from . import intrinsics, vector_dots
from .jit import launch
from .weight_form import WeightForm

TO_SCALE = np.float32(1.0 / 32767.0)  # 32,767: the largest rounded activation
INT8_BLOCK = BLOCK["int8"]
# From this many rows of x the panel kernel; below, the row kernel. Two Zen 5 cores, µs,
# row / panel kernel at 24 and 64 rows: 768 × 768 97 / 127, 236 / 193; 3,072 × 768 338 /
# 494, 997 / 837; 2,048 × 2,048 643 / 866, 1,694 / 1,477.
PANEL_ROWS = 48
# Up to this many rows of x the row kernel takes the weight rows one at a time, each
# thread's share one stream from memory; from the next, four weight rows together, their
# lane sums reduced at once. 0.1B Int8 + head, exact / rounded step time in one process:
# batch 1 0.83 four together, 1.03-1.05 one at a time; batch 2 0.89 / 1.19; batch 8 1.26
# four together, 0.95 one at a time; batch 16 1.20 / 0.90.
ONE_ROW_AT_A_TIME = 4
# Rows of x the panel kernel takes through all the weight blocks before the next rows: their
# totals (24 KiB) stay in L1 and their x in L2.
GROUP_ROWS = 128


class RoundedInt8(NamedTuple):
    """An Int8 matrix whose products round the activations: int8.PackedInt8's arrays (q [N,
    K] bytes, bounds [N, 2·K/128] fp16 bit patterns), as forms.rounded makes it."""

    q: np.ndarray
    bounds: np.ndarray

    @property
    def shape(self) -> tuple[int, int]:
        return self.q.shape

    @property
    def nbytes(self) -> int:
        return self.q.nbytes + self.bounds.nbytes


# Module-level kernels, compiled below where numba and VNNI are (skinny.py says why not nested).
prange = range
round_rows_here = low_step = block8 = block4 = block2 = block1 = four_rows = one_row = None
PANEL = 0


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


def pack_panel(Q, bounds, first, panel, steps, lows):  # pragma: no cover - compiled by numba
    """Weight rows first … first + PANEL − 1 into the panel: pairs of bytes as int16 halves
    of an int32 in each row's lane, each block's step and low; rows past the last stay zero."""
    N, K = Q.shape
    for o in range(min(PANEL, N - first)):
        row = first + o
        for p in range(K // 2):  # (the panel's order instead: rows 2 KiB apart thrash L1's sets)
            panel[p, o] = np.int32(Q[row, 2 * p]) | (np.int32(Q[row, 2 * p + 1]) << 16)
        for b in range(K // INT8_BLOCK):
            low, step = low_step(bounds, row, b)
            steps[b, o], lows[b, o] = step, low


def panel_product(Q, bounds, xq, x_scale, x_sum, out):  # pragma: no cover - compiled by numba
    N, K = Q.shape
    M = xq.shape[1]
    blocks = K // INT8_BLOCK
    for task in prange((N + PANEL - 1) // PANEL):
        first = task * PANEL
        panel = np.zeros((K // 2, PANEL), dtype=np.int32)
        steps = np.zeros((blocks, PANEL), dtype=np.float32)
        lows = np.zeros((blocks, PANEL), dtype=np.float32)
        totals = np.zeros((M, PANEL), dtype=np.float32)
        pack_panel(Q, bounds, first, panel, steps, lows)
        for group in range(0, M, GROUP_ROWS):
            last = min(M, group + GROUP_ROWS)
            for b in range(blocks):
                j = group
                while j + 8 <= last:
                    block8(panel, steps, lows, xq, x_scale, x_sum, b, j, totals)
                    j += 8
                if j + 4 <= last:
                    block4(panel, steps, lows, xq, x_scale, x_sum, b, j, totals)
                    j += 4
                if j + 2 <= last:
                    block2(panel, steps, lows, xq, x_scale, x_sum, b, j, totals)
                    j += 2
                if j < last:
                    block1(panel, steps, lows, xq, x_scale, x_sum, b, j, totals)
        for m in range(M):
            for o in range(min(PANEL, N - first)):
                out[m, first + o] = totals[m, o]


def row_product(Q, bounds, xq, x_scale, x_sum, out):  # pragma: no cover - compiled by numba
    N = Q.shape[0]
    if xq.shape[1] <= ONE_ROW_AT_A_TIME:
        for i in prange(N):
            one_row(Q, bounds, xq, x_scale, x_sum, i, out)
        return
    for quad in prange((N + 3) // 4):
        first = quad * 4
        if first + 4 <= N:
            four_rows(Q, bounds, xq, x_scale, x_sum, first, out)
        else:
            for i in range(first, N):
                one_row(Q, bounds, xq, x_scale, x_sum, i, out)


def product(W, x, out):  # pragma: no cover - compiled by numba
    """out = x · Wᵀ, x rounded: the kernel for compiled callers (fused7.py) and the entry's."""
    M, K = x.shape
    xq = np.empty((K // INT8_BLOCK, M, INT8_BLOCK), dtype=np.int16)
    x_scale = np.empty((M, K // INT8_BLOCK), dtype=np.float32)
    x_sum = np.empty((M, K // INT8_BLOCK), dtype=np.float32)
    pairs = xq.view(np.int32)
    if M >= PANEL_ROWS:
        round_rows(x, xq, x_scale, x_sum)
        panel_product(W.q, W.bounds, pairs, x_scale, x_sum, out)
    else:  # a decoding step's few rows: rounded in this thread, one launch fewer
        round_rows_here(x, xq, x_scale, x_sum)
        row_product(W.q, W.bounds, pairs, x_scale, x_sum, out)


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

    global prange, low_step, block8, block4, block2, block1, four_rows, one_row, PANEL
    global round_rows, round_rows_here, pack_panel, panel_product, row_product, product
    prange, PANEL = tools.prange, vnni_ir.PANEL
    low_step = intrinsic(vnni_ir.low_step)
    block8, block4, block2, block1 = (intrinsic(vnni_ir.int16_block(n, INT8_BLOCK // 2)) for n in (8, 4, 2, 1))
    four_rows, one_row = intrinsic(vnni_ir.int16_rows(4)), intrinsic(vnni_ir.int16_rows(1))
    # No fast-math flags: numba would put them on the kernels' IR too, and LLVM then
    # reassociates each kernel's fold its own way (the bits differed between row counts).
    exact = functools.partial(tools.jit, fastmath=False)
    inlined = exact(parallel=False, inline="always")
    round_rows_here = inlined(round_rows)  # the same code, rows in turn: the same bits
    round_rows, pack_panel = exact()(round_rows), inlined(pack_panel)
    panel_product, row_product = exact()(panel_product), exact()(row_product)
    product = exact(parallel=False)(product)
    return exact(parallel=False)(entry)


_entry = _build()

ROUNDED_INT8 = WeightForm("int8, rounded activations", RoundedInt8, lambda matrix: None, rounded_int8_matmul,
                          1 << 30, None, lambda w: w, product, None)
