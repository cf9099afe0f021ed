"""x · Wᵀ for a decoding batch of packed (Int8 or NF4) weights: each weight row widened
once, multiplied with every row of x.

The direct kernels (int8.py, nf4.py) widen every weight again for each 8 rows of x and
multiply it there. From a few rows on it is faster to widen a block's weight rows
(skinny.BLOCK_ROWS: 4, or 3 with AVX2) once into a scratch that stays in L1 (4 rows:
12 KiB at 768 inputs) and run skinny.py's register block over it: one launch for the
whole matrix, each task with its own scratch. On two Zen 4
cores, 3,072 × 768 at 16 rows: Int8 836 µs direct → 439 µs; NF4 823 µs direct (each
form's DIRECT_ROWS says where it starts here).

The arithmetic is that of the dequantised matrix: each weight widened to the fp32 number
quant.py's `dequantise` gives, then fp32 multiply-adds.
"""

from __future__ import annotations

import numpy as np

from . import intrinsics
from .forms import form_of_type
from .jit import launch
from . import skinny
from .skinny import AHEAD_ROWS, blocks_times_x, rows_times_x

prange = range  # numba's where it compiles the kernel below
BLOCK_ROWS = skinny.BLOCK_ROWS
MAX_TASKS = 32  # a launch's share-outs of the blocks (each with its scratch)


def widen_row(W, i, scratch, r):
    """scratch[r] = row i of the packed matrix W, as float32: its form's `widen_row`."""
    raise NotImplementedError("only callable from compiled code")


def block_matmul(W, x, out):  # pragma: no cover - compiled by numba
    N = W.q.shape[0]
    K = x.shape[1]
    blocks = (N + BLOCK_ROWS - 1) // BLOCK_ROWS
    # A task and its scratch for every block or two cost 10% at 768 × 768 and 16 rows, 64
    # tasks 3% (Int8 74 → 83 GMAC/s, NF4 77 → 85 with 32). (A task a thread would need
    # numba's thread count, and a kernel that asks for it cannot be cached.)
    tasks = min(blocks, MAX_TASKS)
    groups = x.shape[0] // 4
    span = max(64, BLOCK_ROWS * W.q.shape[1] // max(1, groups))  # a block call's share of the packed rows
    for task in prange(tasks):
        scratch = np.empty((BLOCK_ROWS, K), dtype=np.float32)
        for block in range(task * blocks // tasks, (task + 1) * blocks // tasks):
            n = block * BLOCK_ROWS
            rows = min(BLOCK_ROWS, N - n)
            for r in range(rows):
                widen_row(W, n + r, scratch, r)
            if K % 16 == 0:  # skinny's vector blocks, asking for the packed rows ahead
                blocks_times_x(scratch, 0, rows, x, out, n, W.q, min(n + AHEAD_ROWS, N - rows), span)
            else:
                rows_times_x(scratch, 0, rows, x, out, n)


def batched_matmul(x: np.ndarray, w) -> np.ndarray:
    """x [M, K] · Wᵀ → [M, N] for a decoding batch, W in a packed form."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    out = np.empty((x.shape[0], w.shape[0]), dtype=np.float32)
    launch(block_kernel, w, x, out)
    return out


_tools = intrinsics.build()
if _tools is not None:
    from numba.extending import overload

    def _widen_row(W, i, scratch, r):  # pragma: no cover - compiled by numba
        form = form_of_type(W)
        if form is None or form.widen_row is None:
            return None
        row = form.widen_row
        return lambda W, i, scratch, r: row(W, i, scratch, r)

    overload(widen_row)(_widen_row)
    prange = _tools.prange
    block_kernel = _tools.jit(block_matmul)
else:
    batched_matmul = block_kernel = None
