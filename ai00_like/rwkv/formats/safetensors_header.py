"""The safetensors header alone: its length, its JSON, each tensor's entry checked against
the file's size, and `__metadata__`.

Apart from safetensors.py so that what only needs the metadata (tokenizer discovery) does
not import the layouts and the prefab's quantisation with it.
"""

from __future__ import annotations

from pathlib import Path

import msgspec
import numpy as np

from ..errors import ModelFileError
from . import BF16, map_file

# U32: the packed words of quantised matrices (prefab.py)
DTYPES: dict[str, np.dtype] = {"F32": np.dtype("<f4"), "F16": np.dtype("<f2"), "BF16": BF16, "U32": np.dtype("<u4")}
_MAX_HEADER = 100 * 1024 * 1024  # the reference implementation's own limit


class Entry(msgspec.Struct):
    dtype: str
    shape: list[int]
    data_offsets: tuple[int, int]


def read_safetensors_metadata(path: str | Path) -> dict[str, str]:
    """The header's `__metadata__` alone (the header is checked as for a load; no tensor is read)."""
    mapped = map_file(path)
    try:
        return parse_header(path, mapped)[1]
    finally:
        mapped.close()  # the parsed header is a copy: nothing views the mapping


def parse_header(path, mapped) -> tuple[dict[str, Entry], dict[str, str], int]:
    size = len(mapped)
    if size < 8:
        raise ModelFileError(path, f"truncated: {size} bytes is too short for a safetensors header")
    header_len = int.from_bytes(mapped[:8], "little")
    if mapped[8:9] != b"{":
        raise ModelFileError(path, "unknown format: neither a PyTorch zip archive nor safetensors")
    if header_len > size - 8:
        problem = f"truncated: the header says {header_len} bytes but the file has only {size - 8} after it"
        raise ModelFileError(path, problem)
    if header_len > _MAX_HEADER:
        raise ModelFileError(path, f"corrupt safetensors header: {header_len} bytes is implausibly large")
    try:
        header = msgspec.json.decode(mapped[8 : 8 + header_len])
    except (msgspec.DecodeError, UnicodeDecodeError) as e:
        raise ModelFileError(path, f"corrupt safetensors header: {e}") from None
    if not isinstance(header, dict):
        raise ModelFileError(path, "corrupt safetensors header: not a JSON object")
    metadata = header.pop("__metadata__", None) or {}
    if not isinstance(metadata, dict):
        raise ModelFileError(path, "corrupt safetensors header: __metadata__ is not an object")
    data_start = 8 + header_len
    entries = {name: _checked_entry(path, name, value, size - data_start) for name, value in header.items()}
    return entries, {str(k): str(v) for k, v in metadata.items()}, data_start


def _checked_entry(path, name: str, value, data_size: int) -> Entry:
    try:
        entry = msgspec.convert(value, Entry)
    except msgspec.ValidationError as e:
        raise ModelFileError(path, f"corrupt safetensors header: tensor '{name}': {e}") from None
    if entry.dtype not in DTYPES:
        raise ModelFileError(path, f"tensor '{name}' has dtype {entry.dtype}; only F32, F16, BF16 (and U32 in quantised models) are supported")
    begin, end = entry.data_offsets
    if any(d < 0 for d in entry.shape) or not 0 <= begin <= end:
        raise ModelFileError(path, f"corrupt safetensors header: tensor '{name}' has a negative shape or offset")
    need = int(np.prod(entry.shape, dtype=np.int64)) * DTYPES[entry.dtype].itemsize
    if end - begin != need:
        problem = f"tensor '{name}' spans {end - begin} bytes but its shape {entry.shape} needs {need}"
        raise ModelFileError(path, f"corrupt safetensors header: {problem}")
    if end > data_size:
        raise ModelFileError(
            path, f"truncated: tensor '{name}' ends at data byte {end} but the file holds only {data_size}"
        )
    return entry


__all__ = ["DTYPES", "Entry", "parse_header", "read_safetensors_metadata"]
