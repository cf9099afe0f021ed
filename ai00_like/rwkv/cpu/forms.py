"""The table of the CPU backend's weight forms: every way it keeps a projection matrix, each
with its kernels (form.py's WeightForm). ops.linear, batched.py and fused7.py dispatch
through it; a new form is a module of its own with its WeightForm, and its line in FORMS.
"""

from __future__ import annotations

from .dense import DENSE
from .weight_form import WeightForm
from .int8 import INT8
from .nf4 import NF4
from .vnni import ROUNDED_INT8, RoundedInt8

# The packed forms first: a matrix takes the first form that packs it, and the dense form
# takes every array and dequantises what no packed form takes. ROUNDED_INT8 packs nothing:
# a model turns its Int8 matrices into it (vnni.rounded).
FORMS: tuple[WeightForm, ...] = (INT8, NF4, ROUNDED_INT8, DENSE)
_BY_KIND = {form.kind: form for form in FORMS}


def kernel_form(matrix):
    """A checkpoint's projection in the form `ops.linear` multiplies fastest."""
    for form in FORMS:
        packed = form.pack(matrix)
        if packed is not None:
            return packed
    raise TypeError(f"no weight form takes a {type(matrix).__name__}")


def rounded(matrix):
    """An Int8 matrix as a vnni.RoundedInt8 (its bytes in panels); any other as it is."""
    return RoundedInt8.of(matrix) if form_of(matrix) is INT8 else matrix


def form_of(weight) -> WeightForm:
    """The form of a matrix `kernel_form` gave (any array is dense: mapped ones are np.memmap)."""
    return _BY_KIND.get(type(weight), DENSE)


def form_of_type(numba_type) -> WeightForm | None:
    """The form of a matrix that compiled code holds as `numba_type`, at compile time."""
    from numba import types  # only compiled code's overloads ask, with numba loaded

    if isinstance(numba_type, types.Array):
        return DENSE
    return _BY_KIND.get(getattr(numba_type, "instance_class", None))
