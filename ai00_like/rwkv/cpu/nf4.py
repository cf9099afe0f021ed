"""NF4 projections kept packed on the CPU: x · Wᵀ read straight from the 4-bit blocks.

quant.py's NF4 stores 64 consecutive weights of a row as 4-bit indices c into the 16
NormalFloat levels, eight to a u32, low nibble first, with the block's absmax: w = L[c] ·
absmax. Read as bytes, byte t of a row holds weights 2t (low nibble) and 2t + 1 (high
nibble), so with x split into its even and odd columns a block's share of a dot product is

    Σ w·x = absmax · Σ_t (L[lo_t] · x_even[t] + L[hi_t] · x_odd[t])

A weight costs half a byte to read: decoding reads an eighth of fp32's bytes. Where the
CPU has AVX2 or AVX-512, the levels are looked up sixteen or eight at a time in registers
(vector_dots.py), 3 to 4 times faster than the scalar loop's table loads. A decoding
batch of a few rows or more widens each 4 weight rows once instead (`widen_row`,
batched.py), and prefill widens tiles of rows into fp32 for OpenBLAS (ops.linear), as for
Int8 and 16-bit weights.

Rows whose length is not a multiple of 64 (blocks would straddle rows) stay dequantised.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..quant import BLOCK, NF4_LEVELS, QuantisedMatrix
from . import intrinsics, vector_dots
from .jit import LAUNCH, read_only
from .skinny import ROW_X_BYTES

NF4_BLOCK = BLOCK["nf4"]
BLOCK_BYTES = NF4_BLOCK // 2


@dataclass(frozen=True)
class PackedNF4:
    """An NF4 matrix as the kernels read it: q [N, K/2] bytes (two weights each), absmax
    [N, K/64] as the fp16 bit patterns quant.py stored (widened as read: an fp32 copy would
    add 12% to the model); both views of the QuantisedMatrix."""

    q: np.ndarray
    absmax: np.ndarray

    @property
    def shape(self) -> tuple[int, int]:
        return self.q.shape[0], self.q.shape[1] * 2

    @property
    def nbytes(self) -> int:
        return self.q.nbytes + self.absmax.nbytes

    @property
    def form(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """What compiled code takes for this matrix (fused7.py, batched.py)."""
        return self.q, self.absmax, NF4_LEVELS

    @classmethod
    def of(cls, m: QuantisedMatrix) -> PackedNF4 | None:
        """The kernels' form of `m`, or None where they cannot read it (no numba, Int8,
        rows that are not whole blocks)."""
        rows, cols = m.shape
        if nf4_matmul is None or m.kind != "nf4" or cols % NF4_BLOCK:
            return None
        absmax = m.scales.view(np.uint16)[: rows * cols // NF4_BLOCK].reshape(rows, -1)
        return cls(read_only(m.packed.view(np.uint8)[: rows * cols // 2].reshape(rows, cols // 2)), read_only(absmax))


# Module-level kernels, compiled below where numba is (skinny.py says why not nested).
prange = range
widen = dot8 = dot4 = dot3 = dot2 = dot1 = dot1x4 = dot2x4 = dot3x4 = dot4x4 = widen_row = None  # intrinsics.py's and vector_dots.py's, where numba is


def scalar_matmul(Q, absmax, levels, x_even, x_odd, out):  # pragma: no cover - compiled by numba
    N, half = Q.shape
    M = x_even.shape[0]
    for i in prange(N):
        j = 0
        while j + 4 <= M:  # four rows of x per looked-up weight, as int8.py
            s0 = s1 = s2 = s3 = np.float32(0.0)
            for b in range(half // BLOCK_BYTES):
                a0 = a1 = a2 = a3 = np.float32(0.0)
                for t in range(b * BLOCK_BYTES, b * BLOCK_BYTES + BLOCK_BYTES):
                    byte = Q[i, t]
                    lo, hi = levels[byte & 15], levels[byte >> 4]
                    a0 += lo * x_even[j, t] + hi * x_odd[j, t]
                    a1 += lo * x_even[j + 1, t] + hi * x_odd[j + 1, t]
                    a2 += lo * x_even[j + 2, t] + hi * x_odd[j + 2, t]
                    a3 += lo * x_even[j + 3, t] + hi * x_odd[j + 3, t]
                scale = widen(absmax[i, b])
                s0 += scale * a0
                s1 += scale * a1
                s2 += scale * a2
                s3 += scale * a3
            out[j, i], out[j + 1, i], out[j + 2, i], out[j + 3, i] = s0, s1, s2, s3
            j += 4
        while j < M:
            s = np.float32(0.0)
            for b in range(half // BLOCK_BYTES):
                a = np.float32(0.0)
                for t in range(b * BLOCK_BYTES, b * BLOCK_BYTES + BLOCK_BYTES):
                    byte = Q[i, t]
                    a += levels[byte & 15] * x_even[j, t] + levels[byte >> 4] * x_odd[j, t]
                s += widen(absmax[i, b]) * a
            out[j, i] = s
            j += 1


def vector_matmul(Q, absmax, levels, x_even, x_odd, out):  # pragma: no cover - compiled by numba
    N, M = Q.shape[0], x_even.shape[0]
    if M <= 4 and x_even.shape[1] * 8 > ROW_X_BYTES:
        # A long x: read once for 4 weight rows (skinny.py; 2,048 × 7,168 from memory at 1 /
        # 2 / 4 rows, Int8: 18.7 → 23.9 / 10.8 → 19.5 / 8.2 → 14.0 billion weights a second).
        for quad in prange((N + 3) // 4):  # names of its own: see skinny.py
            first = quad * 4
            if first + 4 > N:
                for last in range(first, N):
                    weight_row_times_x(Q, absmax, levels, x_even, x_odd, last, out)
            elif M == 1:
                dot1x4(Q, absmax, levels, x_even, x_odd, first, 0, out)
            elif M == 2:
                dot2x4(Q, absmax, levels, x_even, x_odd, first, 0, out)
            elif M == 3:
                dot3x4(Q, absmax, levels, x_even, x_odd, first, 0, out)
            else:
                dot4x4(Q, absmax, levels, x_even, x_odd, first, 0, out)
        return
    for i in prange(N):
        weight_row_times_x(Q, absmax, levels, x_even, x_odd, i, out)


def weight_row_times_x(Q, absmax, levels, x_even, x_odd, i, out):  # pragma: no cover - compiled by numba
    """out[:, i] for weight row i and every row of x, 8 rows of x a call at most."""
    M = x_even.shape[0]
    j = 0
    while j + 8 <= M:
        dot8(Q, absmax, levels, x_even, x_odd, i, j, out)
        j += 8
    if j + 4 <= M:
        dot4(Q, absmax, levels, x_even, x_odd, i, j, out)
        j += 4
    if j + 3 == M:
        dot3(Q, absmax, levels, x_even, x_odd, i, j, out)
    elif j + 2 == M:
        dot2(Q, absmax, levels, x_even, x_odd, i, j, out)
    elif j + 1 == M:
        dot1(Q, absmax, levels, x_even, x_odd, i, j, out)


def scalar_widen_row(Q, absmax, levels, i, W, r):  # pragma: no cover - compiled by numba
    """W[r] = row i of the matrix as float32. `widen_row` is vector_dots.py's nf4_row where
    the CPU has AVX2 or AVX-512: the same numbers, 5.6 times as fast."""
    for t in range(Q.shape[1]):
        byte, scale = Q[i, t], widen(absmax[i, t // BLOCK_BYTES])
        W[r, 2 * t] = levels[byte & 15] * scale
        W[r, 2 * t + 1] = levels[byte >> 4] * scale


def dequantise(Q, absmax, levels, out):  # pragma: no cover - compiled by numba
    for i in prange(Q.shape[0]):
        widen_row(Q, absmax, levels, i, out, i)


def nf4_matmul(x: np.ndarray, w: PackedNF4) -> np.ndarray:
    """x [M, K] · Wᵀ → [M, N] for a few rows of x (a decoding batch)."""
    x = np.asarray(x, dtype=np.float32)
    x_even, x_odd = np.ascontiguousarray(x[:, 0::2]), np.ascontiguousarray(x[:, 1::2])
    out = np.empty((x.shape[0], w.shape[0]), dtype=np.float32)
    with LAUNCH:
        nf4_kernel(w.q, w.absmax, NF4_LEVELS, x_even, x_odd, out)
    return out


def nf4_rows(w: PackedNF4, first: int, out: np.ndarray) -> np.ndarray:
    """Rows [first, first + len(out)) of W as float32, into `out`."""
    last = first + out.shape[0]
    with LAUNCH:
        dequantise(w.q[first:last], w.absmax[first:last], NF4_LEVELS, out)
    return out


# The compiled kernel itself too, for compiled callers (fused7.py); the scalar one is what
# CPUs without AVX2 run (and what the tests hold the vector one to).
_tools = intrinsics.build()
if _tools is not None:
    prange, widen = _tools.prange, _tools.widen
    nf4_scalar_kernel = _tools.jit(scalar_matmul)
    if (_vector := vector_dots.build()) is not None:
        dot8, dot4, dot3, dot2, dot1 = (_vector.nf4(rows) for rows in (8, 4, 3, 2, 1))
        dot1x4, dot2x4, dot3x4, dot4x4 = (_vector.nf4(rows, weight_rows=4) for rows in (1, 2, 3, 4))
        weight_row_times_x = _tools.jit(parallel=False, inline="always")(weight_row_times_x)
        widen_row = _vector.nf4_row
        nf4_kernel = _tools.jit(vector_matmul)
    else:
        widen_row = _tools.jit(parallel=False, inline="always")(scalar_widen_row)
        nf4_kernel = nf4_scalar_kernel
    dequantise = _tools.jit(dequantise)
else:
    nf4_matmul = nf4_rows = nf4_kernel = nf4_scalar_kernel = None
