"""A whole conversation's state as a file other RWKV tools read: `.st` or `.pth`.

State-tuning tools and Ai00 load `blocks.{i}.att.time_state` ([heads, head_size,
head_size] per layer): a `.pth` in the official layout (value-major), a `.st` in web-rwkv's
(key-major, as Ai00's converter writes it). A conversation's state also holds each layer's
two token-shift vectors, which those files have no names for; they go under
`blocks.{i}.att.shift_state` and `blocks.{i}.ffn.shift_state` ([n_embd]), which other tools
ignore. Reading goes through the `[[state]]` reader (loader.read_state_file), so a file
that loads here loads as an initial state too; a plain state-tuning file (no shift
vectors) reads with zero shifts. States are written in fp32: a state read back continues
exactly as the one written.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from .errors import ModelFileError
from .formats import as_float
from .formats.pth import write_pth
from .formats.safetensors import write_safetensors
from .info import ModelInfo
from .loader import read_state_file, read_state_tensors
from .state import State

FORMATS = ("st", "pth")
SHIFTS = ("att.shift_state", "ffn.shift_state")  # our names for the token-shift vectors
_METADATA = {"ai00_like": "saved_state"}


def _value_major(state: State, version: str) -> np.ndarray:
    # v5/v6 keep their WKV state key-major, v7 value-major (rwkv/state.py); files are value-major.
    return state.wkv if version == "7" else state.wkv.swapaxes(-1, -2)


def state_tensors(state: State, version: str) -> dict[str, np.ndarray]:
    """`state` under official names and layout."""
    if version == "4":
        raise ValueError("v4 models have no time_state: their states cannot be written as state files")
    wkv = _value_major(state, version)
    tensors = {}
    for i in range(wkv.shape[0]):
        tensors[f"blocks.{i}.att.time_state"] = np.ascontiguousarray(wkv[i], dtype=np.float32)
        tensors[f"blocks.{i}.{SHIFTS[0]}"] = np.ascontiguousarray(state.att_shift[i], dtype=np.float32)
        tensors[f"blocks.{i}.{SHIFTS[1]}"] = np.ascontiguousarray(state.ffn_shift[i], dtype=np.float32)
    return tensors


def write_state(state: State, version: str, path: str | Path, fmt: str = "st") -> None:
    """Write `state` as a `.st` (web-rwkv layout, as Ai00 reads it) or a `.pth` (official)."""
    tensors = state_tensors(state, version)
    if fmt == "pth":
        write_pth(tensors, path, dtype="fp32")
    elif fmt == "st":
        write_safetensors(tensors, path, layout="web-rwkv", dtype="fp32", metadata=_METADATA)
    else:
        raise ValueError(f"unknown state file format {fmt!r}; expected one of {FORMATS}")


def read_state(path: str | Path, info: ModelInfo) -> State:
    """A state file as a whole State; ModelFileError naming the tensor when it does not fit."""
    layers = read_state_file(path, info)  # value-major [H, N, N] per layer, checked
    state = State.zeros(info)
    state.wkv[:] = np.stack([layer if info.version == "7" else layer.swapaxes(-1, -2) for layer in layers])
    tensors = read_state_tensors(path, info)
    for i in range(info.n_layer):
        for name, part in zip(SHIFTS, (state.att_shift, state.ffn_shift)):
            arr = tensors.get(f"blocks.{i}.{name}")
            if arr is None:
                continue  # a plain state-tuning file: the shifts start at zero
            if tuple(arr.shape) != (info.n_embd,):
                raise ModelFileError(path, f"tensor 'blocks.{i}.{name}' has shape {tuple(arr.shape)} but the model "
                                           f"needs ({info.n_embd},)")
            part[i] = as_float(arr).astype(np.float32)
    if not all(np.isfinite(p).all() for p in state.parts()):
        raise ModelFileError(path, "the state holds values that are not finite numbers")
    return state
