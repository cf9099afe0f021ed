"""Activations rounded to bf16: the x side of the rounded bf16 products (rounded_bf16.py).

Each value is rounded by itself to the nearest bf16 (ties to even, NaN kept NaN), as
formats.f32_to_bf16 rounds a checkpoint: a row's result does not depend on the other rows
of its step or on its prompt's chunking. A pair of inputs goes in one 32-bit lane, the
first in the low half, as the panels hold a pair of weights and as `vdpbf16ps` and AMX's
tiles take them (panels_ir.Bf16DotBlock, amx_ir.py).
"""

from __future__ import annotations

import numpy as np

from ..formats import bf16_to_f32, f32_to_bf16
from . import panels

# From this many rows of x they are rounded on the cores together; fewer, a decoding step's,
# in the calling thread, one launch fewer.
PARALLEL_ROUNDING_ROWS = 48

# Module-level kernels, compiled below where numba and AVX-512 are (skinny.py says why not nested).
round_rows_here = None


def nearest_bf16(bits):  # pragma: no cover - compiled by numba
    """An fp32's bit pattern rounded to bf16's (formats.f32_to_bf16's rule, NaN kept NaN)."""
    if bits & 0x7FFFFFFF > 0x7F800000:
        return 0x7FC0
    return (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16


def round_rows(x, xb):  # pragma: no cover - compiled by numba
    """x [M, K] float32 as xb [M, K/2]: each pair of inputs as two bf16 in a 32-bit lane,
    the first in the low half (as the panels hold the weights)."""
    bits = x.view(np.uint32)
    M, K = x.shape
    for m in prange(M):
        for p in range(K // 2):
            xb[m, p] = np.uint32(nearest_bf16(np.int64(bits[m, 2 * p]))
                                 | (nearest_bf16(np.int64(bits[m, 2 * p + 1])) << 16))


def bf16_pairs(x, whole, pairs):  # pragma: no cover - compiled by numba
    """x [M, K] rounded as round_rows rounds it, as `pairs` ≥ K/2 pairs a row (the weights'
    K padded to whole blocks) with zero rows after it up to a multiple of `whole` rows
    (AMX's tiles take 16), the padding zero: in the calling thread for a decoding step's few
    rows (no launch on the cores), on the cores for a prompt's."""
    M, K = x.shape
    xb = np.empty((-(-M // whole) * whole, pairs), dtype=np.uint32)
    xb[M:] = 0
    xb[:M, K // 2:] = 0
    if M >= PARALLEL_ROUNDING_ROWS:
        round_rows(x, xb[:M])
    else:
        round_rows_here(x, xb[:M])
    return xb


prange = panels.prange
if (jit := panels.exact_jit) is not None:
    nearest_bf16 = jit(parallel=False, inline="always")(nearest_bf16)
    round_rows_here, round_rows = jit(parallel=False, inline="always")(round_rows), jit()(round_rows)
    bf16_pairs = jit(parallel=False, inline="always")(bf16_pairs)


def rounded(x: np.ndarray) -> np.ndarray:
    """x [M, K] with each value rounded to bf16, as float32 (what the kernels multiply)."""
    return bf16_to_f32(f32_to_bf16(x))
