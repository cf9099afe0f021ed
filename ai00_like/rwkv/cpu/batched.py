"""x · Wᵀ for a decoding batch of packed (Int8 or NF4) weights: each 4 weight rows widened
once, multiplied with every row of x.

The direct kernels (int8.py, nf4.py) widen every weight again for each 8 rows of x and
multiply it there. From a few rows on it is faster to widen 4 weight rows once into a
scratch that stays in L1 (12 KiB at 768 inputs) and run skinny.py's 4 × 4 register block
over it: one launch for the whole matrix, each task with its own scratch. On two Zen 4
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
from .skinny import AHEAD_ROWS, block4, four_rows_times_row, four_rows_times_x, row_times_x

prange = range  # numba's where it compiles the kernel below
MAX_TASKS = 32  # a launch's share-outs of the blocks (each with its scratch)


def widen_row(W, i, scratch, r):
    """scratch[r] = row i of the packed matrix W, as float32: its form's `widen_row`."""
    raise NotImplementedError("only callable from compiled code")


def block_matmul(W, x, out):  # pragma: no cover - compiled by numba
    N = W.q.shape[0]
    K = x.shape[1]
    blocks = (N + 3) // 4
    # A task and its scratch for every block or two cost 10% at 768 × 768 and 16 rows, 64
    # tasks 3% (Int8 74 → 83 GMAC/s, NF4 77 → 85 with 32). (A task a thread would need
    # numba's thread count, and a kernel that asks for it cannot be cached.)
    tasks = min(blocks, MAX_TASKS)
    M = x.shape[0]
    groups = M // 4
    span = max(64, 4 * W.q.shape[1] // max(1, groups))  # a group's share of a block's packed bytes
    for task in prange(tasks):
        scratch = np.empty((4, K), dtype=np.float32)
        for block in range(task * blocks // tasks, (task + 1) * blocks // tasks):
            n = block * 4
            rows = min(4, N - n)
            for r in range(rows):
                widen_row(W, n + r, scratch, r)
            if rows < 4:
                for r in range(rows):
                    row_times_x(scratch, r, x, out, n + r)
            elif K % 16 == 0:  # skinny's vector block, asking for the packed rows ahead
                ahead = min(n + AHEAD_ROWS, N - 4)
                for g in range(groups):
                    block4(scratch, 0, x, 4 * g, out, n, W.q, ahead, g * span, span)
                for j in range(4 * groups, M):
                    four_rows_times_row(scratch, 0, x, j, out, n)
            else:
                four_rows_times_x(scratch, 0, x, out, n)


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
