"""The dense form: fp32, fp16 or bf16 arrays as the checkpoint stores them, multiplied by
skinny.py's kernels for a decoding step (16-bit weights widened as they are read) and in
tiles widened to fp32 for a prefill's BLAS products. fp32 matrices also go straight to
BLAS where that is faster (ops.linear). Quantised matrices that no packed form takes are
dequantised to fp32 here."""

from __future__ import annotations

import numpy as np

from ..quant import QuantisedMatrix
from .skinny import SKINNY_ROWS, kernel_view, skinny_kernel, skinny_matmul, widen_rows
from .weight_form import WeightForm


def pack(matrix) -> np.ndarray:
    if isinstance(matrix, QuantisedMatrix):
        return np.asarray(matrix, dtype=np.float32)
    return matrix


def widen(weight: np.ndarray, first: int, out: np.ndarray) -> np.ndarray:
    return widen_rows(weight[first : first + len(out)], out)


def compiled(weight: np.ndarray) -> np.ndarray:
    return kernel_view(np.ascontiguousarray(weight))  # read-only, as the packed forms: one compiled type each


# Every decoding step's rows go through skinny's kernel, which reads each weight once.
DENSE = WeightForm("dense", np.ndarray, pack, skinny_matmul, SKINNY_ROWS + 1, widen, compiled, skinny_kernel, None)
