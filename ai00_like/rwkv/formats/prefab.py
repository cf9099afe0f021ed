"""Quantised matrices in safetensors files (our "prefab", as Ai00 calls its saved GPU model).

A `QuantisedMatrix` named `X.weight` is stored as two U32 tensors, `X.weight.q` (the packed
weights) and `X.weight.scales` (the packed block scales), and the metadata key
`ai00_like_quant` maps each such name to its type and [rows, cols]. Everything else in the
file is an ordinary official-layout tensor. Reading gives the `QuantisedMatrix` back, so the
GPU backend uploads the words as they are (nothing is quantised again) and the numpy
backend computes with the dequantised matrix.
"""

from __future__ import annotations

import json
from collections.abc import Mapping

import numpy as np

from ..errors import ModelFileError
from ..quant import BLOCK, QUANT_TYPES, QuantisedMatrix

QUANT_METADATA_KEY = "ai00_like_quant"
_PACKED, _SCALES = ".q", ".scales"


def split_quantised(tensors: Mapping[str, object]) -> tuple[dict[str, np.ndarray], dict[str, str]]:
    """Tensors with each QuantisedMatrix as its two U32 arrays, and the metadata to add."""
    out: dict[str, np.ndarray] = {}
    described = {}
    for name, arr in tensors.items():
        if isinstance(arr, QuantisedMatrix):
            out[name + _PACKED], out[name + _SCALES] = arr.packed, arr.scales
            described[name] = [arr.kind, *arr.shape]
        else:
            out[name] = arr
    return out, ({QUANT_METADATA_KEY: json.dumps(described)} if described else {})


def join_quantised(tensors: Mapping[str, np.ndarray], metadata: Mapping[str, str], path) -> dict[str, object]:
    """The inverse of `split_quantised`: the file's tensors with the quantised ones rebuilt."""
    if QUANT_METADATA_KEY not in metadata:
        return dict(tensors)
    try:
        described = json.loads(metadata[QUANT_METADATA_KEY])
        entries = {str(name): (str(kind), int(rows), int(cols)) for name, (kind, rows, cols) in described.items()}
    except (ValueError, TypeError, AttributeError):
        raise ModelFileError(path, f"corrupt metadata {QUANT_METADATA_KEY!r}") from None
    out = dict(tensors)
    for name, (kind, rows, cols) in entries.items():
        packed, scales = out.pop(name + _PACKED, None), out.pop(name + _SCALES, None)
        if kind not in QUANT_TYPES or packed is None or scales is None:
            raise ModelFileError(path, f"quantised tensor '{name}' is incomplete or of unknown type {kind!r}")
        padded = -(-rows * cols // BLOCK[kind]) * BLOCK[kind]
        need_w = padded // (4 if kind == "int8" else 8)
        need_s = padded // BLOCK[kind] if kind == "int8" else -(-padded // BLOCK[kind] // 2)
        if (packed.dtype, scales.dtype) != (np.uint32, np.uint32) or (packed.size, scales.size) != (need_w, need_s):
            raise ModelFileError(path, f"quantised tensor '{name}': {packed.size}/{scales.size} words of weights/scales "
                                       f"do not fit its shape [{rows}, {cols}]")
        out[name] = QuantisedMatrix(kind, packed.reshape(-1), scales.reshape(-1), (rows, cols))
    return out


__all__ = ["QUANT_METADATA_KEY", "join_quantised", "split_quantised"]
