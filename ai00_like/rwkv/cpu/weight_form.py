"""What the CPU backend needs to know of a way of storing a projection matrix (a "weight
form"), as one object: forms.py's FORMS lists them, and ops.linear, batched.py
and fused7.py dispatch through it."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, NamedTuple


class WeightForm(NamedTuple):
    """One weight form. Its matrices are of type `kind` (every other array for the dense
    form), a packed form's a NamedTuple whose first field `q` holds its bytes, a row per
    output (panels.Int8Panels' in panels of rows, with their count `rows`), and which
    compiled code takes as it is."""

    name: str
    kind: type
    # A checkpoint's matrix (an array or a quant.QuantisedMatrix) in this form, or None
    # where this form does not take it.
    pack: Callable[[Any], Any]
    # x [M, K] · Wᵀ → [M, N] read where W is stored: a decoding step below `direct_rows`
    # rows of x; from it up to ops.SKINNY_ROWS, batched.py's kernel over `widen_row`.
    direct: Callable
    direct_rows: int
    # Rows [first, first + len(out)) of W as float32 into out (a prefill tile for BLAS);
    # None where W is fp32 already.
    widen: Callable | None
    # What compiled code (fused7.py) takes for a matrix of this form.
    compiled: Callable
    # Compiled code's: (W, x, out) the direct product; (W, i, scratch, r) row i of W into
    # scratch[r] for batched.py, None for a form that never goes there.
    direct_kernel: Any
    widen_row: Any
