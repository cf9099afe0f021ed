"""x · Wᵀ for a decoding batch (1 to 64 rows of x) without packing the weights, with W in
fp32, fp16 or bf16, widened inside the dot product.

BLAS libraries multiply by first copying ("packing") panels of both operands into a
cache-friendly layout. For a prefill chunk that copy is cheap beside the arithmetic; for a
batch of a few rows the weight matrix is read from memory once per product, and packing it
reads and writes it again: OpenBLAS reaches about 95 GFLOP/s at 16 rows on this machine's two
cores against 150 with the weights in cache. This kernel reads each weight row once, straight
from the checkpoint's [out, in] layout, and multiplies it with 4 rows of x at a time from
registers: 4 weight rows × 4 x rows = 16 running sums per step along the input dimension
(measured 120–150 GFLOP/s at 16 rows). The block is vector_dots' `block`, vector code that
also asks for the lines of the rows AHEAD_ROWS on. AVX2 has 16 vector registers, where 4 × 4
did not fit (LLVM kept 6 sums on the stack) and two 4 × 2 halves read each weight twice: there
the block is 3 weight rows × 4 x rows, and on two Zen 3 cores a bf16 1.5B decoded 1.15–1.18
times as fast at 16 rows and 1.19–1.33 at 3 and 4 (old and new kernels alternating in one
process; 0.1B 1.33 and 1.46). Asking ahead, because a multi-row
product reads its weights in bursts, a block's rows and then a stretch of arithmetic, and
the hardware prefetchers lose the stream in between. From memory (not cache) a bf16 head
of 65,536 × 768 at 16 rows went from 65 to 95–101 GMAC/s, at 4 rows from 34 to 48–56;
the 0.1B shape's bf16 batch 4 decoded 187–189 → 226–237 tokens/s and batch 16
356–362 → 388–396 (alternating runs), with the same sums to the bit.

Decoding reads every weight once per step, so its speed is the memory bandwidth divided by
the weights' bytes: 16-bit weights are widened to fp32 in registers as they are read
(intrinsics.widen: vcvtph2ps for fp16, a shift for bf16; at one row of x bf16 is read in
pairs, `pair_row_times_row`) and decode up to twice as fast as fp32 ones.
numba has no 16-bit float types, so 16-bit weights enter the kernels as integer arrays of
their bit patterns, told apart by signedness: uint16 holds IEEE fp16, int16 holds bf16
(`kernel_view`).

`skinny_matmul` and `widen_rows` are None without numba (jit.py); the callers then use BLAS
on fp32 copies.
"""

from __future__ import annotations

import numpy as np

from ..formats import BF16
from . import intrinsics, vector_dots
from .jit import launch, SKINNY_ROWS, read_only


def kernel_view(weight: np.ndarray) -> np.ndarray:
    """The array the kernels take for `weight`, read-only (jit.read_only): fp32 as it is,
    16-bit as its bit patterns."""
    if weight.dtype == np.float16:
        return read_only(weight.view(np.uint16))
    if weight.dtype == BF16:
        return read_only(weight.view(np.int16))
    return read_only(weight)


# The kernels are module-level functions, compiled below where numba is: numba's on-disk
# cache keys a kernel on its closure's pickled contents, and a compiled function pickles
# differently in every process, so a kernel nested in a builder was compiled anew at every
# start (a few seconds, and tens of MiB of LLVM's memory kept).
prange = range
# intrinsics.py's and vector_dots.py's, where numba is
widen = weight_pair = holds_bf16 = block = block_of_1 = block_of_2 = block_of_3 = None
# Weight rows of a multi-row product's vector block (vector_dots.py: 4 with AVX-512, 3 with
# AVX2), and those a task takes: 4 rows of x at a time, a block's weight rows stay in L1.
BLOCK_ROWS = TASK_ROWS = 4
# Rows ahead of the task being multiplied whose weights a multi-row product asks for.
AHEAD_ROWS = 16
# The longest x, in bytes, that a one-row product reads once for each weight row: a longer
# one does not stay in L1 (32 KiB on Zen 4) beside the streaming weights, and is read once
# for every four rows (measured: K = 5,120 about even, 7,168 four rows well ahead).
ROW_X_BYTES = 24 << 10


def skinny(W, x, out):  # pragma: no cover - compiled by numba
    N = W.shape[0]
    M, K = x.shape
    if M == 1:
        x_even, x_odd = x_halves(W, x)
        if K * 4 <= ROW_X_BYTES:
            # A dot product per weight row, each task's rows one sequential stream. Four
            # rows at a time (below) read four rows' streams side by side: on two Zen 4
            # cores 23-26 GB/s, against 31-40 row by row (0.1B's shapes).
            for n in prange(N):
                one_row(W, n, x, x_even, x_odd, out, n)
            return
        # A long x no longer stays in L1 beside the weights streaming through, and each
        # weight row read it again from L2 (bf16: twice the weights' bytes). Four rows a
        # read of x, from memory on two Zen 4 cores: K = 7,168 (1.5B's FFN) bf16 24.6 →
        # 30.3 GB/s, fp32 31.6 → 35.4; K = 14,336 bf16 23.6 → 29.7 (at 4,096 row by row
        # stays ahead: 32.2 against 30.2). (Its variables have names of their own: numba's
        # parallel loops that shared them crashed the process.)
        for quad in prange((N + 3) // 4):
            first = quad * 4
            if first + 4 <= N:
                four_rows_one_row(W, first, x, x_even, x_odd, out, first)
            else:
                for last in range(first, N):
                    one_row(W, last, x, x_even, x_odd, out, last)
        return
    groups = M // 4
    # A block call's share of the rows to ask for ahead. Not for fp32 weights with AVX2: on
    # Zen 3 they decoded faster without (1.5B at 4 and 16 rows 1.19 and 1.17 times as fast),
    # where 16-bit ones gained (0.1B bf16 at 4 rows 1.27 times, 1.5B about even).
    span = 0 if W.itemsize == 4 and BLOCK_ROWS == 3 else max(64, BLOCK_ROWS * K * W.itemsize // max(1, groups))
    for task in prange((N + TASK_ROWS - 1) // TASK_ROWS):
        n = task * TASK_ROWS
        count = min(TASK_ROWS, N - n)
        if K % 16 == 0:
            blocks_times_x(W, n, count, x, out, n, W, min(n + AHEAD_ROWS, N - count), span)
        else:
            rows_times_x(W, n, count, x, out, n)


def blocks_times_x(W, w, count, x, out, n, P, ahead, span):  # pragma: no cover - compiled by numba
    """out[:, n : n + count] = x · W[w : w + count]ᵀ for K a multiple of 16: `block`'s
    BLOCK_ROWS × 4 products in vector registers, each block's weight rows read from L1 for
    every 4 rows of x, and meanwhile `span` bytes a call of P's rows from `ahead` on asked
    for; the rows of x past the last 4 by a block of their own, the weight rows past the
    last whole block by the loops."""
    M = x.shape[0]
    groups = M // 4
    tail = M - 4 * groups
    whole = count // BLOCK_ROWS * BLOCK_ROWS
    for first in range(0, whole, BLOCK_ROWS):
        for g in range(groups):
            lo = (first // BLOCK_ROWS * groups + g) * span
            block(W, w + first, x, 4 * g, out, n + first, P, ahead, lo, span)
        if tail == 1:
            block_of_1(W, w + first, x, 4 * groups, out, n + first, P, ahead, 0, 0)
        elif tail == 2:
            block_of_2(W, w + first, x, 4 * groups, out, n + first, P, ahead, 0, 0)
        elif tail == 3:
            block_of_3(W, w + first, x, 4 * groups, out, n + first, P, ahead, 0, 0)
    for last in range(whole, count):
        row_times_x(W, w + last, x, out, n + last)


def rows_times_x(W, w, count, x, out, n):  # pragma: no cover - compiled by numba
    """out[:, n : n + count] = x · W[w : w + count]ᵀ by LLVM's vectorised loops, for any K."""
    for first in range(0, count - 3, 4):
        four_rows_times_x(W, w + first, x, out, n + first)
    for last in range(count // 4 * 4, count):
        row_times_x(W, w + last, x, out, n + last)


def three_products(W1, x1, out1, W2, x2, out2, W3, x3, out3):  # pragma: no cover - compiled by numba
    """out_i = x_i · W_iᵀ for three matrices and one row each, in one parallel launch: a
    launch costs microseconds to start and to end, and v7's layer has 14 small products."""
    N1, N2, N3 = W1.shape[0], W2.shape[0], W3.shape[0]
    even1, odd1 = x_halves(W1, x1)
    even2, odd2 = x_halves(W2, x2)
    even3, odd3 = x_halves(W3, x3)
    for n in prange(N1 + N2 + N3):
        if n < N1:
            one_row(W1, n, x1, even1, odd1, out1, n)
        elif n < N1 + N2:
            one_row(W2, n - N1, x2, even2, odd2, out2, n - N1)
        else:
            one_row(W3, n - N1 - N2, x3, even3, odd3, out3, n - N1 - N2)


def x_halves(W, x):  # pragma: no cover - compiled by numba
    """x's even and odd inputs (x[0, 0::2], x[0, 1::2]) where `one_row` and
    `four_rows_one_row` multiply W's weights in pairs (bf16); x[0] twice, unused, otherwise."""
    if holds_bf16(W):
        half = x.shape[1] // 2
        x_even, x_odd = np.empty(half, dtype=np.float32), np.empty(half, dtype=np.float32)
        for t in range(half):
            x_even[t], x_odd[t] = x[0, 2 * t], x[0, 2 * t + 1]
        return x_even, x_odd
    return x[0], x[0]


def one_row(W, w, x, x_even, x_odd, out, n):  # pragma: no cover - compiled by numba
    """out[0, n] = x · W[w] for one row of x."""
    if holds_bf16(W):
        pair_row_times_row(W, w, x, x_even, x_odd, out, n)
    else:
        row_times_x(W, w, x, out, n)


def four_rows_one_row(W, w, x, x_even, x_odd, out, n):  # pragma: no cover - compiled by numba
    """out[0, n : n + 4] = x · W[w : w + 4]ᵀ for one row of x."""
    if holds_bf16(W):
        four_pair_rows_times_row(W, w, x, x_even, x_odd, out, n)
    else:
        four_rows_times_row(W, w, x, 0, out, n)


def pair_row_times_row(W, w, x, x_even, x_odd, out, n):  # pragma: no cover - compiled by numba
    """out[0, n] = x · W[w], W's weights read in pairs: for bf16 from one 32-bit word each
    (intrinsics.weight_pair), multiplied with x split into even and odd inputs once a
    product. Widened one by one, 16 bf16 weights take a lane-crossing zero-extension and a
    shift besides their multiply-add, and that work held bf16 at one row of x to about as
    many weights a second as fp32 (12.7 and 15 billion on two cores); in pairs 32 weights
    take a shift and an AND. 0.1B shape at batch 1, old and new processes alternating: bf16
    9.6-12.1 → 8.4-10.2 ms a token, against fp32 in the same process 1.51-1.76 → 1.73-1.90
    times as fast; 1.5B, streaming from memory, 1.68-1.74 → 1.74-1.76."""
    K = W.shape[1]
    s = np.float32(0.0)
    for t in range(K // 2):
        even, odd = weight_pair(W, w, t)
        s += even * x_even[t] + odd * x_odd[t]
    for k in range(K // 2 * 2, K):  # an odd K's last weight
        s += widen(W[w, k]) * x[0, k]
    out[0, n] = s


def four_pair_rows_times_row(W, w, x, x_even, x_odd, out, n):  # pragma: no cover - compiled by numba
    """out[0, n : n + 4] = x · W[w : w + 4]ᵀ, as pair_row_times_row."""
    K = W.shape[1]
    s0 = s1 = s2 = s3 = np.float32(0.0)
    for t in range(K // 2):
        xe, xo = x_even[t], x_odd[t]
        e0, o0 = weight_pair(W, w, t)
        e1, o1 = weight_pair(W, w + 1, t)
        e2, o2 = weight_pair(W, w + 2, t)
        e3, o3 = weight_pair(W, w + 3, t)
        s0 += e0 * xe + o0 * xo
        s1 += e1 * xe + o1 * xo
        s2 += e2 * xe + o2 * xo
        s3 += e3 * xe + o3 * xo
    for k in range(K // 2 * 2, K):
        xk = x[0, k]
        s0 += widen(W[w, k]) * xk
        s1 += widen(W[w + 1, k]) * xk
        s2 += widen(W[w + 2, k]) * xk
        s3 += widen(W[w + 3, k]) * xk
    out[0, n], out[0, n + 1], out[0, n + 2], out[0, n + 3] = s0, s1, s2, s3


def row_times_x(W, w, x, out, n):  # pragma: no cover - compiled by numba
    """out[:, n] = x · W[w] (widened)."""
    K = W.shape[1]
    for j in range(x.shape[0]):
        s = np.float32(0.0)
        for k in range(K):
            s += widen(W[w, k]) * x[j, k]
        out[j, n] = s


def four_rows_times_x(W, w, x, out, n):  # pragma: no cover - compiled by numba
    """out[:, n : n + 4] = x · W[w : w + 4]ᵀ, each weight widened once for 4 rows of x."""
    M = x.shape[0]
    j = 0
    while j + 4 <= M:
        four_rows_times_four(W, w, x, j, out, n, W, w, 0, 64)
        j += 4
    while j < M:  # the last rows of x when M is not a multiple of 4
        four_rows_times_row(W, w, x, j, out, n)
        j += 1


def four_rows_times_four(W, w, x, j, out, n, P, ahead, lo, span):  # pragma: no cover - compiled by numba
    """out[j : j + 4, n : n + 4] = x[j : j + 4] · W[w : w + 4]ᵀ: 16 running sums. vector_dots'
    block4 where the CPU has AVX-512 (which also asks for bytes [lo, lo + span) of P's rows
    from `ahead` on); this loop, vectorised by LLVM, elsewhere."""
    K = W.shape[1]
    s00 = s01 = s02 = s03 = s10 = s11 = s12 = s13 = np.float32(0.0)
    s20 = s21 = s22 = s23 = s30 = s31 = s32 = s33 = np.float32(0.0)
    for k in range(K):
        w0, w1, w2, w3 = widen(W[w, k]), widen(W[w + 1, k]), widen(W[w + 2, k]), widen(W[w + 3, k])
        x0, x1, x2, x3 = x[j, k], x[j + 1, k], x[j + 2, k], x[j + 3, k]
        s00 += w0 * x0
        s01 += w0 * x1
        s02 += w0 * x2
        s03 += w0 * x3
        s10 += w1 * x0
        s11 += w1 * x1
        s12 += w1 * x2
        s13 += w1 * x3
        s20 += w2 * x0
        s21 += w2 * x1
        s22 += w2 * x2
        s23 += w2 * x3
        s30 += w3 * x0
        s31 += w3 * x1
        s32 += w3 * x2
        s33 += w3 * x3
    out[j, n], out[j + 1, n], out[j + 2, n], out[j + 3, n] = s00, s01, s02, s03
    out[j, n + 1], out[j + 1, n + 1], out[j + 2, n + 1], out[j + 3, n + 1] = s10, s11, s12, s13
    out[j, n + 2], out[j + 1, n + 2], out[j + 2, n + 2], out[j + 3, n + 2] = s20, s21, s22, s23
    out[j, n + 3], out[j + 1, n + 3], out[j + 2, n + 3], out[j + 3, n + 3] = s30, s31, s32, s33


def four_rows_times_row(W, w, x, j, out, n):  # pragma: no cover - compiled by numba
    """out[j, n : n + 4] = x[j] · W[w : w + 4]ᵀ."""
    K = W.shape[1]
    s0 = s1 = s2 = s3 = np.float32(0.0)
    for k in range(K):
        xk = x[j, k]
        s0 += widen(W[w, k]) * xk
        s1 += widen(W[w + 1, k]) * xk
        s2 += widen(W[w + 2, k]) * xk
        s3 += widen(W[w + 3, k]) * xk
    out[j, n], out[j, n + 1], out[j, n + 2], out[j, n + 3] = s0, s1, s2, s3


def four_rows_times_rows_from(W, w, x, j, out, n, P, ahead, lo, span):  # pragma: no cover - compiled by numba
    """The blocks of the rows of x from j on, where the CPU has no vector blocks (P unused)."""
    for row in range(j, x.shape[0]):
        four_rows_times_row(W, w, x, row, out, n)


def widen_all(W, out):  # pragma: no cover - compiled by numba
    N, K = W.shape
    for i in prange(N):
        for k in range(K):
            out[i, k] = widen(W[i, k])


def skinny_matmul(x: np.ndarray, weight: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """x [M, K] · weight[N, K]ᵀ → [M, N]; x float32, weight fp32, fp16 or BF16, C-contiguous."""
    if out is None:
        out = np.empty((x.shape[0], weight.shape[0]), dtype=np.float32)
    x = np.ascontiguousarray(x, dtype=np.float32)
    launch(skinny, kernel_view(weight), x, out)
    return out


def widen_rows(weight: np.ndarray, out: np.ndarray) -> np.ndarray:
    """Rows of a 16-bit weight matrix into a float32 array of their shape (`out`)."""
    launch(widen_all, kernel_view(weight), out)
    return out


_tools = intrinsics.build()
if _tools is not None:
    prange, widen, weight_pair, holds_bf16 = _tools.prange, _tools.widen, _tools.weight_pair, _tools.holds_bf16
    inlined = _tools.jit(parallel=False, inline="always")
    row_times_x = inlined(row_times_x)
    pair_row_times_row, four_pair_rows_times_row = inlined(pair_row_times_row), inlined(four_pair_rows_times_row)
    x_halves, one_row, four_rows_one_row = inlined(x_halves), inlined(one_row), inlined(four_rows_one_row)
    four_rows_times_four = inlined(four_rows_times_four)
    four_rows_times_row = inlined(four_rows_times_row)
    four_rows_times_x = inlined(four_rows_times_x)

    _vector = vector_dots.build()
    if _vector is not None:
        block, (block_of_1, block_of_2, block_of_3), BLOCK_ROWS = _vector.block, _vector.block_tails, _vector.block_rows
        TASK_ROWS = 12 if BLOCK_ROWS == 3 else 4  # 4 blocks of 3 on AVX2
    else:
        block = four_rows_times_four
        block_of_1 = block_of_2 = block_of_3 = inlined(four_rows_times_rows_from)
    blocks_times_x, rows_times_x = inlined(blocks_times_x), inlined(rows_times_x)
    skinny = _tools.jit(skinny)
    three_products = _tools.jit(three_products)
    widen_all = _tools.jit(widen_all)
    skinny_kernel = skinny  # the compiled kernel itself, for compiled callers (fused7.py)
else:
    skinny_matmul = widen_rows = skinny_kernel = three_products = None
