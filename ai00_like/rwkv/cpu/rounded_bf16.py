"""bf16 products on activations rounded to bf16: AVX-512 BF16's `vdpbf16ps` (`exact = false`).

A prompt's chunk and a batch's step are bound by multiply-adds. Exact, a bf16 model's
panels (panel_bf16.py) split each 32-bit lane of a pair of weights into two fp32 and run
two FMAs: 16 multiply-adds an instruction. `vdpbf16ps` takes the pair as it is stored and
a pair of activations in bf16, and does 32: each product of two bf16 is exact in fp32, the
pair's two are added into the lane's fp32 sum. Only the activations are rounded, each value
to the nearest bf16 by itself (bf16_rounding.py): a row's result does not depend on the other
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

from . import amx, panels
from .bf16_rounding import bf16_pairs, rounded
from .jit import kernels_on
from .panel_bf16 import PanelBf16, numpy_product
from .weight_form import WeightForm


class RoundedBf16(PanelBf16):
    """A bf16 matrix in panels that a model multiplies with activations rounded to bf16."""

    __slots__ = ()


def product(W, x, out):  # pragma: no cover - compiled by numba
    """out = x · Wᵀ, x rounded to bf16: the kernel for compiled callers (fused7.py) and the entry's."""
    if ON_TILES:
        amx.tile_product(W.q, W.scales, (bf16_pairs(x, amx.TILE_ROWS, W.q.shape[1]),), out)
    else:
        panels.panel_product(W.q, W.scales, (bf16_pairs(x, 1, W.q.shape[1]),), out)


def entry(W, x, out):  # pragma: no cover - compiled by numba
    product(W, x, out)


@functools.cache
def available() -> bool:
    """Whether numba compiles for a CPU with AVX-512 BF16 (this one, or NUMBA_CPU_FEATURES')."""
    return _entry is not None and panels.available_with("avx512bf16")


ON_TILES = amx.available()  # a constant of the compiled product
_entry = None
if (_kernels := panels.compile_form(product, entry)) is not None:
    product, _entry = _kernels


def matmul(x: np.ndarray, w: RoundedBf16) -> np.ndarray:
    """x [M, K] · Wᵀ → [M, N], x rounded to bf16: the compiled kernel, or numpy while it is not ready."""
    if _entry is None or not kernels_on():
        return numpy_product(np.pad(rounded(x), ((0, 0), (0, w.shape[1] - x.shape[1]))), w)
    return panels.matmul(_entry, x, w)


ROUNDED_BF16 = WeightForm("bf16, rounded activations", RoundedBf16, lambda m: m if type(m) is RoundedBf16 else None,
                          matmul, 1 << 30, None, lambda w: w, product, None)
