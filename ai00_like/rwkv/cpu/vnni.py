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
(panels_ir.Int16Block), so a row's result is the same to the bit whatever the other rows
of its step, the chunk its prompt was cut into, or the register block that ran it.

The weights are in panels (panels.py), a pair of inputs of 16 rows a load of 32 bytes, as
`vpdpwssd` takes them, and the loop over them is panels.py's. A model multiplies its Int8
matrices this way when the CPU has AVX-512 VNNI and the model is not `exact` (CpuModel):
its matrices are then `RoundedInt8`, a weight form of its own (ROUNDED_INT8) that every
product of every row count goes through.
"""

from __future__ import annotations

import functools

import numpy as np

from . import amx, panels
from .panels import INT8_BLOCK, Int8Panels
from .weight_form import WeightForm

TO_SCALE = np.float32(1.0 / 32767.0)  # 32,767: the largest rounded activation
# From this many rows of x they are rounded on the cores together; fewer, a decoding step's,
# in the calling thread, one launch fewer.
PARALLEL_ROUNDING_ROWS = 48


ON_TILES = amx.available("amx-int8")  # a constant of the compiled product


class RoundedInt8(Int8Panels):
    """An Int8 matrix in panels that a model multiplies with rounded activations: a quad of
    inputs of a row side by side for AMX's tiles, a pair for vpdpwssd."""

    __slots__ = ()

    GROUP = 4 if ON_TILES else 2


# Module-level kernels, compiled below where numba and AVX-512 are (skinny.py says why not nested).
round_rows_here = None


def round_rows(x, xq, x_scale, x_sum):  # pragma: no cover - compiled by numba
    """Each row and 128-input block of x [M, K] as xq [K/128, M, 128] int16 (a block's rows
    side by side, as the kernels read them) with its x_scale, and x_sum = x_scale · Σ xq.
    Only multiplications, a maximum and an integer sum: the same bits under any
    reassociation. The largest |x| is found on the bit patterns, which order as the
    values do: an integer maximum is vectorised, a float one (without fast-math) is not
    (512 × 2,048 on two cores 0.72 → 0.21 ms)."""
    M, K = x.shape
    bits = x.view(np.int32)
    for m in prange(M):
        top = np.empty(1, dtype=np.int32)
        for b in range(K // INT8_BLOCK):
            first = b * INT8_BLOCK
            top[0] = 0
            for k in range(first, first + INT8_BLOCK):
                top[0] = max(top[0], bits[m, k] & 0x7FFFFFFF)
            scale = top.view(np.float32)[0] * TO_SCALE
            inverse = np.float32(1.0) / scale if scale > 0 else np.float32(0.0)
            total = 0
            for k in range(first, first + INT8_BLOCK):
                value = np.int32(np.rint(x[m, k] * inverse))
                xq[b, m, k - first] = np.int16(value)
                total += value
            x_scale[m, b] = scale
            x_sum[m, b] = scale * np.float32(total)


def product(W, x, out):  # pragma: no cover - compiled by numba
    """out = x · Wᵀ, x rounded: the kernel for compiled callers (fused7.py) and the entry's."""
    M, K = x.shape
    rows = -(-M // amx.TILE_ROWS) * amx.TILE_ROWS if ON_TILES else M  # the tiles take 16 rows
    xq = np.zeros((K // INT8_BLOCK, rows, INT8_BLOCK), dtype=np.int16)
    x_scale = np.zeros((rows, K // INT8_BLOCK), dtype=np.float32)
    x_sum = np.zeros((rows, K // INT8_BLOCK), dtype=np.float32)
    if M >= PARALLEL_ROUNDING_ROWS:
        round_rows(x, xq, x_scale, x_sum)
    else:
        round_rows_here(x, xq, x_scale, x_sum)
    if ON_TILES:
        amx.tile_product(W.q, W.bounds, amx.byte_parts(xq, x_scale, x_sum), out)
    else:
        panels.panel_product(W.q, W.bounds, (xq.view(np.int32), x_scale, x_sum), out)


def entry(W, x, out):  # pragma: no cover - compiled by numba
    product(W, x, out)


@functools.cache
def available() -> bool:
    """Whether numba compiles for a CPU with AVX-512 VNNI (this one, or NUMBA_CPU_FEATURES')."""
    return _entry is not None and panels.available_with("avx512vnni")


prange = panels.prange
_entry = None
if (_kernels := panels.compile_form(product, entry, round_rows)) is not None:
    product, _entry, round_rows_here, round_rows = _kernels

rounded_int8_matmul = functools.partial(panels.matmul, _entry)  # x [M, K] · Wᵀ → [M, N], x rounded
ROUNDED_INT8 = WeightForm("int8, rounded activations", RoundedInt8, panels.pack_for(RoundedInt8), rounded_int8_matmul, 1 << 30, None,
                          lambda w: w, product, None)
