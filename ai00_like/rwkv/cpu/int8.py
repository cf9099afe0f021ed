"""Int8 projections kept packed on the CPU: x · Wᵀ read straight from the quantised blocks.

quant.py's Int8 stores 128 consecutive weights of a row as bytes q with the block's bounds
(low, high): w = low + step · q with step = (high − low) / 255. A block's share of a dot
product is then

    Σ w·x = step · Σ q·x + low · Σ x

so the kernel multiplies bytes widened to float32 by x, and adds each block's `low` times
the block's sum of x, computed once per step for all rows. The bounds stay the fp16 pairs
quant.py stored (widened as read): an fp32 copy of them would add 6% to the model. A
weight costs one byte to read: decoding reads a quarter of fp32's bytes. Where the CPU
has AVX2 or AVX-512, the bytes are widened and multiplied a vector at a time in explicit
vector code (vector_dots.py), about 1.5 times the scalar loop's speed. A decoding batch of
a few rows or more widens each 4 weight rows once instead (`widen_row`, batched.py).
Prefill widens tiles of rows into fp32 for OpenBLAS (ops.linear), as for 16-bit weights.
`INT8` is this form's entry in the table of weight forms (forms.py).

Rows whose length is not a multiple of 128 (blocks would straddle rows) stay dequantised.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ..quant import BLOCK, QuantisedMatrix
from . import intrinsics, vector_dots
from .jit import launch, read_only
from .skinny import ROW_X_BYTES
from .weight_form import WeightForm

INT8_BLOCK = BLOCK["int8"]
# Below this many rows of x the direct kernel (each weight widened again for every 8 rows
# of x), from it batched.py's (each 4 weight rows widened once into an L1 scratch). On two
# Zen 4 cores, 3,072 × 768: at 4 rows direct 128 µs against 167, at 5 rows 233 against
# 198, at 16 rows 789 against 451. Without the vector kernels the direct one is slower still.
DIRECT_ROWS = 5


class PackedInt8(NamedTuple):
    """An Int8 matrix as the kernels read it, and as compiled code takes it: q [N, K] bytes,
    and bounds [N, 2·K/128], each block's (low, high) as fp16 bit patterns; both views of
    the QuantisedMatrix."""

    q: np.ndarray
    bounds: np.ndarray

    @property
    def shape(self) -> tuple[int, int]:
        return self.q.shape

    @property
    def nbytes(self) -> int:
        return self.q.nbytes + self.bounds.nbytes

    @classmethod
    def of(cls, m: QuantisedMatrix) -> PackedInt8 | None:
        """The kernels' form of `m`, or None where they cannot read it (no numba, NF4, rows
        that are not whole blocks)."""
        rows, cols = m.shape
        if int8_matmul is None or m.kind != "int8" or cols % INT8_BLOCK:
            return None
        bounds = m.scales.view(np.uint16)[: 2 * rows * cols // INT8_BLOCK].reshape(rows, -1)
        return cls(read_only(m.packed.view(np.uint8)[: rows * cols].reshape(rows, cols)), read_only(bounds))


def pack(matrix) -> PackedInt8 | None:
    return PackedInt8.of(matrix) if isinstance(matrix, QuantisedMatrix) else None


# Module-level kernels, compiled below where numba is (skinny.py says why not nested).
prange = range
widen = dot8 = dot4 = dot3 = dot2 = dot1 = dot1x4 = dot2x4 = dot3x4 = dot4x4 = None  # intrinsics.py's and vector_dots.py's, where numba is


def low_step(bounds, i, b):  # pragma: no cover - compiled by numba
    """Block b of row i: w = low + step · q."""
    low, high = widen(bounds[i, 2 * b]), widen(bounds[i, 2 * b + 1])
    return low, (high - low) / np.float32(255.0)


def scalar_matmul(Q, bounds, x, xsum, out):  # pragma: no cover - compiled by numba
    N, K = Q.shape
    M = x.shape[0]
    for i in prange(N):
        j = 0
        while j + 4 <= M:  # four rows of x per widened weight (measured: 4×4 tiles and 8 rows were slower)
            s0 = s1 = s2 = s3 = np.float32(0.0)
            for b in range(K // 128):
                a0 = a1 = a2 = a3 = np.float32(0.0)
                for k in range(b * 128, b * 128 + 128):
                    q = np.float32(Q[i, k])
                    a0 += q * x[j, k]
                    a1 += q * x[j + 1, k]
                    a2 += q * x[j + 2, k]
                    a3 += q * x[j + 3, k]
                lo, st = low_step(bounds, i, b)
                s0 += st * a0 + lo * xsum[j, b]
                s1 += st * a1 + lo * xsum[j + 1, b]
                s2 += st * a2 + lo * xsum[j + 2, b]
                s3 += st * a3 + lo * xsum[j + 3, b]
            out[j, i], out[j + 1, i], out[j + 2, i], out[j + 3, i] = s0, s1, s2, s3
            j += 4
        while j < M:
            s = np.float32(0.0)
            for b in range(K // 128):
                a = np.float32(0.0)
                for k in range(b * 128, b * 128 + 128):
                    a += np.float32(Q[i, k]) * x[j, k]
                lo, st = low_step(bounds, i, b)
                s += st * a + lo * xsum[j, b]
            out[j, i] = s
            j += 1


def vector_matmul(Q, bounds, x, xsum, out):  # pragma: no cover - compiled by numba
    N, M = Q.shape[0], x.shape[0]
    if M <= 4 and x.shape[1] * 4 > ROW_X_BYTES:
        # A long x: read once for 4 weight rows (skinny.py; 2,048 × 7,168 from memory at 1 /
        # 2 / 4 rows, Int8: 18.7 → 23.9 / 10.8 → 19.5 / 8.2 → 14.0 billion weights a second).
        for quad in prange((N + 3) // 4):  # names of its own: see skinny.py
            first = quad * 4
            if first + 4 > N:
                for last in range(first, N):
                    weight_row_times_x(Q, bounds, x, xsum, last, out)
            elif M == 1:
                dot1x4(Q, bounds, x, xsum, first, 0, out)
            elif M == 2:
                dot2x4(Q, bounds, x, xsum, first, 0, out)
            elif M == 3:
                dot3x4(Q, bounds, x, xsum, first, 0, out)
            else:
                dot4x4(Q, bounds, x, xsum, first, 0, out)
        return
    for i in prange(N):
        weight_row_times_x(Q, bounds, x, xsum, i, out)


def weight_row_times_x(Q, bounds, x, xsum, i, out):  # pragma: no cover - compiled by numba
    """out[:, i] for weight row i and every row of x, 8 rows of x a call at most."""
    M = x.shape[0]
    j = 0
    while j + 8 <= M:
        dot8(Q, bounds, x, xsum, i, j, out)
        j += 8
    if j + 4 <= M:
        dot4(Q, bounds, x, xsum, i, j, out)
        j += 4
    if j + 3 == M:
        dot3(Q, bounds, x, xsum, i, j, out)
    elif j + 2 == M:
        dot2(Q, bounds, x, xsum, i, j, out)
    elif j + 1 == M:
        dot1(Q, bounds, x, xsum, i, j, out)


def widen_row(Q, bounds, i, W, r):  # pragma: no cover - compiled by numba
    """W[r] = row i of the matrix as float32."""
    K = Q.shape[1]
    for b in range(K // 128):
        lo, st = low_step(bounds, i, b)
        for k in range(b * 128, b * 128 + 128):
            W[r, k] = lo + st * np.float32(Q[i, k])


def dequantise(Q, bounds, out):  # pragma: no cover - compiled by numba
    for i in prange(Q.shape[0]):
        widen_row(Q, bounds, i, out, i)


def direct_product(W, x, out):  # pragma: no cover - compiled by numba
    """int8_matmul inside compiled code (fused7.py)."""
    M, K = x.shape
    xsum = np.zeros((M, K // INT8_BLOCK), dtype=np.float32)
    for m in range(M):
        for i in range(K):
            xsum[m, i // INT8_BLOCK] += x[m, i]
    int8_kernel(W.q, W.bounds, x, xsum, out)


def packed_row(W, i, scratch, r):  # pragma: no cover - compiled by numba
    """widen_row for batched.py's kernel, which takes the matrix whole."""
    widen_row(W.q, W.bounds, i, scratch, r)


def int8_matmul(x: np.ndarray, w: PackedInt8) -> np.ndarray:
    """x [M, K] · Wᵀ → [M, N] for a few rows of x, each weight read where it is stored."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    xsum = x.reshape(x.shape[0], -1, INT8_BLOCK).sum(axis=2)
    out = np.empty((x.shape[0], w.shape[0]), dtype=np.float32)
    launch(int8_kernel, w.q, w.bounds, x, xsum, out)
    return out


def int8_rows(w: PackedInt8, first: int, out: np.ndarray) -> np.ndarray:
    """Rows [first, first + len(out)) of W as float32, into `out`."""
    last = first + out.shape[0]
    launch(dequantise, w.q[first:last], w.bounds[first:last], out)
    return out


# The compiled kernel itself too, for compiled callers (fused7.py); the scalar one is what
# CPUs without AVX2 run (and what the tests hold the vector one to).
_tools = intrinsics.build()
if _tools is not None:
    prange, widen = _tools.prange, _tools.widen
    inlined = _tools.jit(parallel=False, inline="always")
    low_step, widen_row, packed_row = inlined(low_step), inlined(widen_row), inlined(packed_row)
    int8_scalar_kernel = _tools.jit(scalar_matmul)
    dequantise = _tools.jit(dequantise)
    if (_vector := vector_dots.build()) is not None:
        dot8, dot4, dot3, dot2, dot1 = (_vector.int8(rows) for rows in (8, 4, 3, 2, 1))
        dot1x4, dot2x4, dot3x4, dot4x4 = (_vector.int8(rows, weight_rows=4) for rows in (1, 2, 3, 4))
        weight_row_times_x = inlined(weight_row_times_x)
        int8_kernel = _tools.jit(vector_matmul)
    else:
        int8_kernel = int8_scalar_kernel
    direct_product = inlined(direct_product)
else:
    int8_matmul = int8_rows = int8_kernel = int8_scalar_kernel = None

INT8 = WeightForm("int8", PackedInt8, pack, int8_matmul, DIRECT_ROWS, int8_rows, lambda w: w, direct_product,
                  packed_row)
