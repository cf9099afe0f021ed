"""NF4 projections kept packed on the CPU: x · Wᵀ read straight from the 4-bit blocks.

quant.py's NF4 stores 64 consecutive weights of a row as 4-bit indices c into the 16
NormalFloat levels, eight to a u32, low nibble first, with the block's absmax: w = L[c] ·
absmax. A vector of LANES such words (`CHUNK` = 8 · LANES weights) holds in each lane the
codes of 8 consecutive weights; code c of every lane is one shift away (`word >> 4c`, the
lookup reads the low four bits). With x rearranged once a product so that its inputs for
code c of the lanes are one vector (`x_by_code`), a chunk's share of a dot product is

    Σ w·x = Σ_c L[word >> 4c] · x_c   (scaled by each block's absmax)

eight lookups and multiply-adds of a vector, with nothing to widen. Read as bytes
(zero-extended to 32-bit lanes, then a lookup for each nibble) the codes took a
lane-crossing zero-extension for every two lookups, and on Zen 4 both go to the shuffle
units: one row of 2,048 × 2,048 in cache on one core 19.0 → 23.2 billion weights a
second; the 1.5B shape with its head Int8 at batch 1 against Int8 in the same process
1.26–1.27 → 1.31–1.33 times as fast (43–48 ms a token), 0.1B at batch 4 1.09–1.10 →
1.12–1.15.

A weight costs half a byte to read: decoding reads an eighth of fp32's bytes. Where the
CPU has AVX-512, the levels are looked up sixteen at a time in registers (vector_dots.py),
3 to 4 times faster than the scalar loop's table loads. With AVX2 a block's 64 codes are
looked up at once by byte shuffles, which leave its levels in another order
(`code_position`): 5.5 → 9–10 billion weights a second on a Zen 3 core. A decoding
batch of a few rows or more widens each 4 weight rows once instead (`widen_row`,
batched.py), and prefill widens tiles of rows into fp32 for OpenBLAS (ops.linear), as for
Int8 and 16-bit weights. `NF4` is this form's entry in the table of weight forms
(forms.py).

Rows whose length is not a multiple of 64 (blocks would straddle rows) stay dequantised.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ..quant import BLOCK, NF4_LEVELS, QuantisedMatrix
from . import intrinsics, vector_dots
from .jit import launch, read_only
from .skinny import ROW_X_BYTES
from .weight_form import WeightForm

NF4_BLOCK = BLOCK["nf4"]
BLOCK_BYTES = NF4_BLOCK // 2
# Words a vector holds (16 with AVX-512, 8 with AVX2; the scalar kernel reads x the same
# way), and the weights their codes cover.
LANES = vector_dots.vector_width() or 16
CHUNK = 8 * LANES
# Below this many rows of x the direct kernel, from it batched.py's (int8.py's DIRECT_ROWS
# says why; 3,072 × 768 on two Zen 4 cores: at 4 rows direct 121-166 µs against 165, at
# 5 rows 192 against 195, at 16 rows 744 against 456).
DIRECT_ROWS = 5


class PackedNF4(NamedTuple):
    """An NF4 matrix as the kernels read it, and as compiled code takes it: q [N, K/2] bytes
    (two weights each), absmax [N, K/64] as the fp16 bit patterns quant.py stored (widened
    as read: an fp32 copy would add 12% to the model), both views of the QuantisedMatrix;
    and the 16 levels."""

    q: np.ndarray
    absmax: np.ndarray
    levels: np.ndarray = NF4_LEVELS

    @property
    def shape(self) -> tuple[int, int]:
        return self.q.shape[0], self.q.shape[1] * 2

    @property
    def nbytes(self) -> int:
        return self.q.nbytes + self.absmax.nbytes

    @classmethod
    def of(cls, m: QuantisedMatrix) -> PackedNF4 | None:
        """The kernels' form of `m`, or None where they cannot read it (no numba, Int8,
        rows that are not whole blocks)."""
        rows, cols = m.shape
        if nf4_matmul is None or m.kind != "nf4" or cols % NF4_BLOCK:
            return None
        absmax = m.scales.view(np.uint16)[: rows * cols // NF4_BLOCK].reshape(rows, -1)
        return cls(read_only(m.packed.view(np.uint8)[: rows * cols // 2].reshape(rows, cols // 2)), read_only(absmax))


def pack(matrix) -> PackedNF4 | None:
    return PackedNF4.of(matrix) if isinstance(matrix, QuantisedMatrix) else None


# Module-level kernels, compiled below where numba is (skinny.py says why not nested).
prange = range
widen = dot8 = dot4 = dot3 = dot2 = dot1 = dot1x4 = dot2x4 = dot3x4 = dot4x4 = widen_row = None  # intrinsics.py's and vector_dots.py's, where numba is


def code_position(k):  # pragma: no cover - compiled by numba
    """Where x_by_code puts input k: with AVX2, as the byte-plane lookup returns a block's
    levels (llvm_ir.py: even weights, then odd; in each, bytes t of 4j… and 16 + 4j… of
    the block's 32); otherwise code c of each lane's word (inputs 8i + c) side by side."""
    if LANES == 8:
        t, odd = k % CHUNK // 2, k % 2
        return k // CHUNK * CHUNK + (odd * 4 + t % 16 // 4) * 8 + t % 4 + t // 16 * 4
    return k // CHUNK * CHUNK + k % 8 * LANES + k % CHUNK // 8


def x_by_code(x):  # pragma: no cover - compiled by numba
    """x [M, K] rearranged for the kernels, each input where code_position puts it; zero
    past K up to a whole chunk."""
    M, K = x.shape
    arranged = np.zeros((M, (K + CHUNK - 1) // CHUNK * CHUNK), dtype=np.float32)
    for m in range(M):
        for k in range(K):
            arranged[m, code_position(k)] = x[m, k]
    return arranged


def scalar_matmul(Q, absmax, levels, x, out):  # pragma: no cover - compiled by numba
    N, half = Q.shape
    M = x.shape[0]
    for i in prange(N):
        for j in range(M):
            s = np.float32(0.0)
            for b in range(half // BLOCK_BYTES):
                a = np.float32(0.0)
                for t in range(b * BLOCK_BYTES, b * BLOCK_BYTES + BLOCK_BYTES):
                    byte = Q[i, t]
                    a += levels[byte & 15] * x[j, code_position(2 * t)] + levels[byte >> 4] * x[j, code_position(2 * t + 1)]
                s += widen(absmax[i, b]) * a
            out[j, i] = s


def vector_matmul(Q, absmax, levels, x, out):  # pragma: no cover - compiled by numba
    N, M = Q.shape[0], x.shape[0]
    if LANES == 16 and M <= 4 and Q.shape[1] * 8 > ROW_X_BYTES:
        # A long x: read once for 4 weight rows (skinny.py; 2,048 × 7,168 from memory at 1 /
        # 2 / 4 rows, Int8: 18.7 → 23.9 / 10.8 → 19.5 / 8.2 → 14.0 billion weights a second).
        # Not with AVX2: four rows' levels, 8 vectors each, do not fit in its 16 registers
        # (2,048 × 8,192 at one row on Zen 3: 13 billion weights a second, 21–24 row by row).
        for quad in prange((N + 3) // 4):  # names of its own: see skinny.py
            first = quad * 4
            if first + 4 > N:
                for last in range(first, N):
                    weight_row_times_x(Q, absmax, levels, x, last, out)
            elif M == 1:
                dot1x4(Q, absmax, levels, x, first, 0, out)
            elif M == 2:
                dot2x4(Q, absmax, levels, x, first, 0, out)
            elif M == 3:
                dot3x4(Q, absmax, levels, x, first, 0, out)
            else:
                dot4x4(Q, absmax, levels, x, first, 0, out)
        return
    for i in prange(N):
        weight_row_times_x(Q, absmax, levels, x, i, out)


def weight_row_times_x(Q, absmax, levels, x, i, out):  # pragma: no cover - compiled by numba
    """out[:, i] for weight row i and every row of x, 8 rows of x a call at most."""
    M = x.shape[0]
    j = 0
    while j + 8 <= M:
        dot8(Q, absmax, levels, x, i, j, out)
        j += 8
    if j + 4 <= M:
        dot4(Q, absmax, levels, x, i, j, out)
        j += 4
    if j + 3 == M:
        dot3(Q, absmax, levels, x, i, j, out)
    elif j + 2 == M:
        dot2(Q, absmax, levels, x, i, j, out)
    elif j + 1 == M:
        dot1(Q, absmax, levels, x, i, j, out)


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


def direct_product(W, x, out):  # pragma: no cover - compiled by numba
    """nf4_matmul inside compiled code (fused7.py)."""
    nf4_kernel(W.q, W.absmax, W.levels, x_by_code(x), out)


def packed_row(W, i, scratch, r):  # pragma: no cover - compiled by numba
    """widen_row for batched.py's kernel, which takes the matrix whole."""
    widen_row(W.q, W.absmax, W.levels, i, scratch, r)


def nf4_matmul(x: np.ndarray, w: PackedNF4) -> np.ndarray:
    """x [M, K] · Wᵀ → [M, N] for a few rows of x (a decoding batch)."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    out = np.empty((x.shape[0], w.shape[0]), dtype=np.float32)
    launch(nf4_kernel, w.q, w.absmax, NF4_LEVELS, x_by_code(x), out)
    return out


def nf4_rows(w: PackedNF4, first: int, out: np.ndarray) -> np.ndarray:
    """Rows [first, first + len(out)) of W as float32, into `out`."""
    last = first + out.shape[0]
    launch(dequantise, w.q[first:last], w.absmax[first:last], NF4_LEVELS, out)
    return out


# The compiled kernel itself too, for compiled callers (fused7.py); the scalar one is what
# CPUs without AVX2 run (and what the tests hold the vector one to).
_tools = intrinsics.build()
if _tools is not None:
    prange, widen = _tools.prange, _tools.widen
    inlined = _tools.jit(parallel=False, inline="always")
    code_position = inlined(code_position)
    x_by_code = _tools.jit(parallel=False)(x_by_code)
    nf4_scalar_kernel = _tools.jit(scalar_matmul)
    if (_vector := vector_dots.build()) is not None:
        dot8, dot4, dot3, dot2, dot1 = (_vector.nf4(rows) for rows in (8, 4, 3, 2, 1))
        dot1x4, dot2x4, dot3x4, dot4x4 = (_vector.nf4(rows, weight_rows=4) for rows in (1, 2, 3, 4))
        weight_row_times_x = inlined(weight_row_times_x)
        widen_row = _vector.nf4_row
        nf4_kernel = _tools.jit(vector_matmul)
    else:
        widen_row = inlined(scalar_widen_row)
        nf4_kernel = nf4_scalar_kernel
    dequantise = _tools.jit(dequantise)
    direct_product, packed_row = inlined(direct_product), inlined(packed_row)
else:
    nf4_matmul = nf4_rows = nf4_kernel = nf4_scalar_kernel = x_by_code = None

NF4 = WeightForm("nf4", PackedNF4, pack, nf4_matmul, DIRECT_ROWS, nf4_rows, lambda w: w, direct_product, packed_row)
