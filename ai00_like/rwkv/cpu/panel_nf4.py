"""NF4 products with the weights in panels (panels.py): a model's NF4 products on an
AVX-512 CPU.

A panel's pair of inputs is a byte a row, its two codes in the low and high nibble. 16
rows' bytes are widened to 32-bit lanes, each nibble looked up in the 16 levels held in
a register (one permute for 16 rows), and multiplied with x's two inputs by fp32 FMAs; a
block's sum is scaled by its rows' absmax as it is folded (panels_ir.Nf4Block). Every row
count, from a decoding step's one row to a prompt's chunk, runs the same kernel, so a
row's result does not depend on its batch or chunking; against nf4.py's kernels (lanes
along the inputs) a decoding batch no longer widens each weight row into a scratch.
"""

from __future__ import annotations

import functools
from . import panels
from .panels import Nf4Panels
from .weight_form import WeightForm


class PanelNF4(Nf4Panels):
    """An NF4 matrix in panels."""

    __slots__ = ()


def product(W, x, out):  # pragma: no cover - compiled by numba
    """out = x · Wᵀ: the kernel for compiled callers (fused7.py) and the entry's."""
    panels.panel_product(W.q, W.absmax, (x, W.levels), out)


def entry(W, x, out):  # pragma: no cover - compiled by numba
    product(W, x, out)


_entry = None
if (_kernels := panels.compile_form(product, entry)) is not None:
    product, _entry = _kernels

panel_nf4_matmul = functools.partial(panels.matmul, _entry)  # x [M, K] · Wᵀ → [M, N]
PANEL_NF4 = WeightForm("nf4 in panels", PanelNF4, panels.pack_for(PanelNF4), panel_nf4_matmul, 1 << 30, None,
                       lambda w: w, product, None)
