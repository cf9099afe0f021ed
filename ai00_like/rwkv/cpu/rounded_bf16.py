"""bf16 products on activations rounded to bf16: AVX-512 BF16's `vdpbf16ps` (`exact = false`).

A prompt's chunk and a batch's step are bound by multiply-adds. Exact, a bf16 model's
panels (panel_bf16.py) split each 32-bit lane of a pair of weights into two fp32 and run
two FMAs: 16 multiply-adds an instruction. `vdpbf16ps` takes the pair as it is stored and
a pair of activations in bf16, and does 32: each product of two bf16 is exact in fp32, the
pair's two are added into the lane's fp32 sum. Only the activations are rounded, each value
to the nearest bf16 (ties to even), by itself: a row's result does not depend on the other
rows of its step or on its prompt's chunking, and every row count runs the same kernel
(panels_ir.Bf16DotBlock), as for the exact panels.

A model multiplies its bf16 panels this way when the CPU has AVX-512 BF16 and the model is
not `exact` (CpuModel): its matrices are then `RoundedBf16`, the weight form ROUNDED_BF16.
Rounding an activation to bf16 keeps 8 bits of it; what that costs in logits is measured by
bench/activation_rounding.py and stated in docs/performance.md.
"""

from __future__ import annotations

import functools

import numpy as np

from ..formats import bf16_to_f32, f32_to_bf16
from . import panels
from .jit import kernels_on
from .panel_bf16 import PanelBf16, numpy_product
from .weight_form import WeightForm

# From this many rows of x they are rounded on the cores together; fewer, a decoding step's,
# in the calling thread, one launch fewer.
PARALLEL_ROUNDING_ROWS = 48


class RoundedBf16(PanelBf16):
    """A bf16 matrix in panels that a model multiplies with activations rounded to bf16."""

    __slots__ = ()


# Module-level kernels, compiled below where numba and AVX-512 are (skinny.py says why not nested).
round_rows_here = None


def _nearest_bf16(bits):  # pragma: no cover - compiled by numba
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
            xb[m, p] = np.uint32(_nearest_bf16(np.int64(bits[m, 2 * p]))
                                 | (_nearest_bf16(np.int64(bits[m, 2 * p + 1])) << 16))


def product(W, x, out):  # pragma: no cover - compiled by numba
    """out = x · Wᵀ, x rounded to bf16: the kernel for compiled callers (fused7.py) and the entry's."""
    M, K = x.shape
    xb = np.empty((M, K // 2), dtype=np.uint32)
    if M >= PARALLEL_ROUNDING_ROWS:
        round_rows(x, xb)
    else:
        round_rows_here(x, xb)
    panels.panel_product(W.q, W.scales, (xb,), out)


def entry(W, x, out):  # pragma: no cover - compiled by numba
    product(W, x, out)


@functools.cache
def available() -> bool:
    """Whether numba compiles for a CPU with AVX-512 BF16 (this one, or NUMBA_CPU_FEATURES')."""
    return _entry is not None and panels.available_with("avx512bf16")


prange = panels.prange
_entry = None
_nearest_bf16 = panels.exact_jit(parallel=False, inline="always")(_nearest_bf16) if panels.exact_jit else _nearest_bf16
if (_kernels := panels.compile_form(product, entry, round_rows)) is not None:
    product, _entry, round_rows_here, round_rows = _kernels


def rounded(x: np.ndarray) -> np.ndarray:
    """x [M, K] with each value rounded to bf16, as float32 (what the kernels multiply)."""
    return bf16_to_f32(f32_to_bf16(x))


def matmul(x: np.ndarray, w: RoundedBf16) -> np.ndarray:
    """x [M, K] · Wᵀ → [M, N], x rounded to bf16: the compiled kernel, or numpy while it is not ready."""
    if _entry is None or not kernels_on():
        return numpy_product(rounded(x), w)
    return panels.matmul(_entry, x, w)


ROUNDED_BF16 = WeightForm("bf16, rounded activations", RoundedBf16, lambda m: m if type(m) is RoundedBf16 else None,
                          matmul, 1 << 30, None, lambda w: w, product, None)
