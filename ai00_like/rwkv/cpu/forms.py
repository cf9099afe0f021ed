"""The table of the CPU backend's weight forms: every way it keeps a projection matrix, each
with its kernels (form.py's WeightForm). ops.linear, batched.py and fused7.py dispatch
through it; a new form is a module of its own with its WeightForm, and its line in FORMS.
"""

from __future__ import annotations

from collections.abc import MutableMapping

from ..quant import QuantisedMatrix
from .dense import DENSE
from .weight_form import WeightForm
from .int8 import INT8, PackedInt8
from .nf4 import NF4
from .vnni import ROUNDED_INT8, PanelledInt8, RoundedInt8

# The packed forms first: a matrix takes the first form that packs it, and the dense form
# takes every array and dequantises what no packed form takes. ROUNDED_INT8 takes the Int8
# matrices that a model which rounds its activations put in panels (`keep_int8_for`), and
# comes before INT8, which would take them too.
FORMS: tuple[WeightForm, ...] = (ROUNDED_INT8, INT8, NF4, DENSE)
_BY_KIND = {form.kind: form for form in FORMS}


def kernel_form(matrix):
    """A checkpoint's projection in the form `ops.linear` multiplies fastest."""
    for form in FORMS:
        packed = form.pack(matrix)
        if packed is not None:
            return packed
    raise TypeError(f"no weight form takes a {type(matrix).__name__}")


def keep_int8_for(tensors: MutableMapping[str, object], rounding: bool) -> bool:
    """Each Int8 matrix of `tensors`, in place, as a model multiplies it: in panels
    (vnni.PanelledInt8) for one that rounds its activations, in rows for one that does not
    (a dict another model rounded). Whether any is in panels."""
    for name, matrix in tensors.items():
        if rounding and type(matrix) is QuantisedMatrix and (rows := PackedInt8.of(matrix)) is not None:
            tensors[name] = PanelledInt8(RoundedInt8.of(rows))
        elif not rounding and isinstance(matrix, PanelledInt8):
            tensors[name] = QuantisedMatrix("int8", matrix.packed, matrix.scales, matrix.shape)
    return rounding and any(isinstance(matrix, PanelledInt8) for matrix in tensors.values())


def form_of(weight) -> WeightForm:
    """The form of a matrix `kernel_form` gave (any array is dense: mapped ones are np.memmap)."""
    return _BY_KIND.get(type(weight), DENSE)


def form_of_type(numba_type) -> WeightForm | None:
    """The form of a matrix that compiled code holds as `numba_type`, at compile time."""
    from numba import types  # only compiled code's overloads ask, with numba loaded

    if isinstance(numba_type, types.Array):
        return DENSE
    return _BY_KIND.get(getattr(numba_type, "instance_class", None))
