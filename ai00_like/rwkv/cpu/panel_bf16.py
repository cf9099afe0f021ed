"""bf16 products with the weights in panels (panels.py): the products of a bf16 model's
projections and head on an AVX-512 CPU.

A panel's pair of inputs is a row's two bf16 in one 32-bit lane; each is an fp32 once
shifted into the lane's high half (the first) or with the low half cleared (the second),
so 16 rows' pair is made ready for two fp32 FMAs in two instructions (panels_ir.Bf16Block).
Every row count, from a decoding step's one row to a prompt's chunk, runs the same
kernel, so a row's result does not depend on its batch or chunking. In rows (skinny.py)
the lanes run along the inputs and a few rows of x end in sums across lanes; a prompt's
chunk went to BLAS through tiles widened to fp32.

A model at least PANEL_WIDTH wide puts its projections and head in panels once its layers
are built (`in_panels`), from the file's mapping or the conversion to bf16, whose pages
are then dropped: the model holds them once, and its tensors (for saving) stay as loaded. While a background warm-up compiles the kernels
(model.py), steps multiply the panels in numpy (`numpy_product`).
"""

from __future__ import annotations


import numpy as np

from ..formats import is_bf16, release_pages
from . import panels
from .jit import kernels_on
from .panels import PANEL, Bf16Panels
from .weight_form import WeightForm


class PanelBf16(Bf16Panels):
    """A bf16 matrix in panels."""

    __slots__ = ()


def product(W, x, out):  # pragma: no cover - compiled by numba
    """out = x · Wᵀ: the kernel for compiled callers (fused7.py) and the entry's."""
    panels.panel_product(W.q, W.scales, (x,), out)


def entry(W, x, out):  # pragma: no cover - compiled by numba
    product(W, x, out)


_entry = None
if (_kernels := panels.compile_form(product, entry)) is not None:
    product, _entry = _kernels

# Panels widened to fp32 at a time by numpy_product: 8 MiB of them for 2,048 inputs.
NUMPY_PANELS = 16


def numpy_product(x: np.ndarray, w: Bf16Panels) -> np.ndarray:
    """x [M, K] · Wᵀ → [M, N] in numpy (no compiled kernels yet)."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    lanes = w.q.view(np.uint32)  # [panels, K/2, PANEL]: a row's pair a lane
    first, second = x[:, 0::2], x[:, 1::2]
    out = np.empty((x.shape[0], len(lanes) * PANEL), dtype=np.float32)
    for start in range(0, len(lanes), NUMPY_PANELS):
        part = lanes[start : start + NUMPY_PANELS]
        sums = first @ (part << 16).view(np.float32) + second @ (part & np.uint32(0xFFFF0000)).view(np.float32)
        out[:, start * PANEL : (start + len(part)) * PANEL] = sums.transpose(1, 0, 2).reshape(x.shape[0], -1)
    return out[:, : w.rows]


def matmul(x: np.ndarray, w: Bf16Panels) -> np.ndarray:
    """x [M, K] · Wᵀ → [M, N]: the compiled kernel, or numpy while it is not ready."""
    if _entry is None or not kernels_on():
        return numpy_product(x, w)
    return panels.matmul(_entry, x, w)


# The narrowest model whose bf16 matrices go in panels. A step's products are launched one
# by one, and a narrow model's are short: the seeded 0.1B shape (768 wide) decoded one row
# at 0.81 of its speed in rows (two Zen 4 cores, one process, alternating), where 1.5B
# (2,048) gained at every batch (1.05 at one row, 1.36 at 4) and in prefill (1.18).
PANEL_WIDTH = 2048


def keeps_bf16_panels(precision: str, width: int, rounding: bool = False) -> bool:
    """Whether a model `width` wide kept in `precision` puts its bf16 matrices in panels:
    at any width where it rounds their activations (rounded_bf16.py: the 0.1B shape
    prefilled 1.45-1.5 times as fast as in rows, and decoded one row at 0.98 of it)."""
    return precision == "bf16" and (width >= PANEL_WIDTH or rounding) and panels.available()


def in_panels(matrix, kind: type[Bf16Panels] = PanelBf16, padded: bool = False):
    """A bf16 matrix [N, K] in panels of `kind` (a bf16 panel form's), its mapped pages
    dropped; anything else as it is, and K not whole blocks too unless `padded`: then with
    zero inputs up to whole blocks (a form whose kernels pad x the same way, rounded_bf16's)."""
    if not (isinstance(matrix, np.ndarray) and matrix.ndim == 2 and is_bf16(matrix)) \
            or (matrix.shape[1] % Bf16Panels.BLOCK and not padded):
        return matrix
    bits = np.ascontiguousarray(matrix).view(np.uint16)
    if (missing := -matrix.shape[1] % Bf16Panels.BLOCK):
        bits = np.pad(bits, ((0, 0), (0, missing)))
    kept = kind.of(bits)
    release_pages(matrix)
    return kept


PANEL_BF16 = WeightForm("bf16 in panels", PanelBf16, lambda m: m if type(m) is PanelBf16 else None, matmul, 1 << 30, None, lambda w: w, product, None)
