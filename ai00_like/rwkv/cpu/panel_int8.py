"""Int8 products with fp32 activations, the weights in panels (panels.py): the exact
products of a model on an AVX-512 CPU.

A block's share of a dot product is step · Σ q·x + low · Σ x (int8.py). Here the bytes
of a pair of weights are split out of a widened lane, made float and multiplied with x's
two inputs by fp32 FMAs, 16 outputs a vector (panels_ir.Fp32Block); Σ x is summed once a
row and block, in order. Every row count, from one row of a decoding step to a prompt's
chunk, runs the same kernel, so a row's result does not depend on its batch or chunking.
Against the kernels of int8.py (lanes along the inputs) it multiplies 2,048² by 16 rows of
x in less than half the time on two Zen 5 cores, and prefill runs in it too, with no
widened tiles for BLAS.
"""

from __future__ import annotations

import functools
import numpy as np

from . import panels
from .panels import INT8_BLOCK, Int8Panels
from .weight_form import WeightForm


class PanelInt8(Int8Panels):
    """An Int8 matrix in panels that a model multiplies with fp32 activations."""

    __slots__ = ()


# From this many rows of x their sums are made on the cores together; fewer, a decoding
# step's, in the calling thread, one launch fewer.
PARALLEL_SUM_ROWS = 48

# Module-level kernels, compiled below where numba and AVX-512 are (skinny.py says why not nested).
block_sums_here = None


def block_sums(x, x_sum):  # pragma: no cover - compiled by numba
    """x_sum[m, b] = Σ x[m, k] over block b: 8 running sums, k's residues mod 8, added
    pairwise. Without fast-math every kernel adds in this order: the same bits."""
    M, K = x.shape
    for m in prange(M):
        for b in range(K // INT8_BLOCK):
            s0 = s1 = s2 = s3 = s4 = s5 = s6 = s7 = np.float32(0.0)
            for k in range(b * INT8_BLOCK, (b + 1) * INT8_BLOCK, 8):
                s0, s1, s2, s3 = s0 + x[m, k], s1 + x[m, k + 1], s2 + x[m, k + 2], s3 + x[m, k + 3]
                s4, s5, s6, s7 = s4 + x[m, k + 4], s5 + x[m, k + 5], s6 + x[m, k + 6], s7 + x[m, k + 7]
            x_sum[m, b] = ((s0 + s1) + (s2 + s3)) + ((s4 + s5) + (s6 + s7))


def product(W, x, out):  # pragma: no cover - compiled by numba
    """out = x · Wᵀ: the kernel for compiled callers (fused7.py) and the entry's."""
    M, K = x.shape
    x_sum = np.empty((M, K // INT8_BLOCK), dtype=np.float32)
    if M >= PARALLEL_SUM_ROWS:
        block_sums(x, x_sum)
    else:
        block_sums_here(x, x_sum)
    panels.panel_product(W.q, W.bounds, (x, x_sum), out)


def entry(W, x, out):  # pragma: no cover - compiled by numba
    product(W, x, out)


prange = panels.prange
_entry = None
if (_kernels := panels.compile_form(product, entry, block_sums)) is not None:
    product, _entry, block_sums_here, block_sums = _kernels

panel_int8_matmul = functools.partial(panels.matmul, _entry)  # x [M, K] · Wᵀ → [M, N]
PANEL_INT8 = WeightForm("int8 in panels", PanelInt8, panels.pack_for(PanelInt8), panel_int8_matmul, 1 << 30, None,
                        lambda w: w, product, None)
