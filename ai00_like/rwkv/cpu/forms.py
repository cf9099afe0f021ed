"""The table of the CPU backend's weight forms: every way it keeps a projection matrix, each
with its kernels (form.py's WeightForm). ops.linear, batched.py and fused7.py dispatch
through it; a new form is a module of its own with its WeightForm, and its line in FORMS.
"""

from __future__ import annotations

from collections.abc import MutableMapping

import numpy as np

from ..quant import QuantisedMatrix
from .dense import DENSE
from .weight_form import WeightForm
from .int8 import INT8, PackedInt8
from .nf4 import NF4, PackedNF4
from .panel_bf16 import PANEL_BF16
from .panel_int8 import PANEL_INT8, PanelInt8
from .panel_nf4 import PANEL_NF4, PanelNF4
from .panels import Bf16Panels, Int8Panels, Nf4Panels
from .panels import available as panels_available
from .rounded_bf16 import ROUNDED_BF16
from .rounded_nf4 import ROUNDED_NF4, RoundedNF4
from .rounded_nf4 import available as nf4_tiles_available
from .vnni import ROUNDED_INT8, RoundedInt8
from .vnni import available as vnni_available

# The packed forms first: a matrix takes the first form that packs it, and the dense form
# takes every array and dequantises what no packed form takes. The panel forms take the
# matrices that a model put in panels (`keep_in_panels`), as it multiplies them, and come
# before INT8 and NF4, which would take them too. A wide model's bf16 matrices are put in
# panels once its layers are built (panel_bf16.in_panels), where the CPU has AVX-512: of the
# form for rounded activations (rounded_bf16.py) or for fp32 ones.
FORMS: tuple[WeightForm, ...] = (ROUNDED_INT8, PANEL_INT8, ROUNDED_NF4, PANEL_NF4, INT8, NF4, ROUNDED_BF16, PANEL_BF16,
                                 DENSE)
# The kinds of matrices in panels.
PANEL_KINDS = (Int8Panels, Nf4Panels, Bf16Panels)
# The kinds multiplied with rounded activations (`exact = false`).
ROUNDED_KINDS = (RoundedInt8, RoundedNF4)
_BY_KIND = {form.kind: form for form in FORMS}


def kernel_form(matrix):
    """A checkpoint's projection in the form `ops.linear` multiplies fastest."""
    for form in FORMS:
        packed = form.pack(matrix)
        if packed is not None:
            return packed
    raise TypeError(f"no weight form takes a {type(matrix).__name__}")


class Panelled(QuantisedMatrix):
    """An Int8 or NF4 QuantisedMatrix whose bytes are kept in panels (a panel form's
    matrix, `panels`), in the model's tensors instead of the rows it was loaded as: the
    model then holds the matrix once. Its packed words and scales are the rows' again, made
    as they are asked for (saving the model, dequantising)."""

    def __init__(self, kind: str, panels):  # the fields are properties here
        self.kind, self.shape, self.panels = kind, panels.shape, panels

    @property
    def packed(self) -> np.ndarray:
        return self.panels.packed()[0].reshape(-1).view(np.uint32)

    @property
    def scales(self) -> np.ndarray:
        halves = self.panels.packed()[1].reshape(-1)
        return np.pad(halves, (0, len(halves) % 2)).view(np.uint32)  # two fp16 a word, as quant.py packs them

    @property
    def nbytes(self) -> int:
        return self.panels.nbytes


def keep_in_panels(tensors: MutableMapping[str, object], exact: bool) -> bool:
    """Each Int8 and NF4 matrix of `tensors`, in place, as a model multiplies it: in panels
    (Panelled) where the CPU has AVX-512, in rows elsewhere (a dict that a model on other
    kernels put in panels). Not `exact`, of the form for rounded activations where the CPU
    has its instructions (Int8: AVX-512 VNNI; NF4: AMX's bf16 tiles), else of the form for
    fp32 ones. Whether any matrix is then multiplied with rounded activations."""
    kinds = {"int8": RoundedInt8 if not exact and vnni_available() else PanelInt8,
             "nf4": RoundedNF4 if not exact and nf4_tiles_available() else PanelNF4}
    in_panels = panels_available()
    for name, matrix in tensors.items():
        if isinstance(matrix, Panelled):
            if not in_panels:
                tensors[name] = QuantisedMatrix(matrix.kind, matrix.packed, matrix.scales, matrix.shape)
            else:
                matrix.panels = kinds[matrix.kind].like(matrix.panels)  # a model built before keeps its own
        elif in_panels and type(matrix) is QuantisedMatrix:
            if (rows := PackedInt8.of(matrix)) is not None:
                tensors[name] = Panelled("int8", kinds["int8"].of(rows))
            elif (rows := PackedNF4.of(matrix)) is not None:
                tensors[name] = Panelled("nf4", kinds["nf4"].of(rows))
    return any(isinstance(m, Panelled) and type(m.panels) in ROUNDED_KINDS for m in tensors.values())


def form_of(weight) -> WeightForm:
    """The form of a matrix `kernel_form` gave (any array is dense: mapped ones are np.memmap)."""
    return _BY_KIND.get(type(weight), DENSE)


def form_of_type(numba_type) -> WeightForm | None:
    """The form of a matrix that compiled code holds as `numba_type`, at compile time."""
    from numba import types  # only compiled code's overloads ask, with numba loaded

    if isinstance(numba_type, types.Array):
        return DENSE
    return _BY_KIND.get(getattr(numba_type, "instance_class", None))
