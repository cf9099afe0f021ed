"""Checkpoint file formats: what `pth.py` and `safetensors.py` share.

The readers map files into memory instead of reading them: a weight that is stored as
fp16 or fp32 comes back as a read-only numpy view of the file's pages, so a model is
never held twice (once in the page cache, once in our heap). Only bf16 has to be
copied, because numpy has no bf16 arithmetic.

Inside this package a bf16 tensor travels as an array of the structured dtype `BF16`
(the raw 16-bit patterns, still memory-mapped) so that layout fixes (renames,
transposes) and converters that stream tensor by tensor do not have to widen the whole
model to fp32 first. `as_float` widens it; public readers call it before returning
unless asked not to.

This module imports neither submodule, so they can import it without a cycle.
"""

from __future__ import annotations

import mmap
import os
import weakref
from pathlib import Path
from typing import Literal

import numpy as np

from ..errors import ModelFileError

Layout = Literal["official", "web-rwkv"]
LAYOUTS: tuple[str, ...] = ("official", "web-rwkv")

StorageDtype = Literal["fp32", "fp16", "bf16"]
STORAGE_DTYPES: tuple[str, ...] = ("fp32", "fp16", "bf16")

# Raw bfloat16 bit patterns. A structured dtype rather than plain uint16 so that a bf16
# tensor cannot be mistaken for integers, and so it says what it is wherever it goes.
BF16 = np.dtype([("bf16", "<u2")])

_FP16_MAX = 65504.0
GATHER_BLOCK = 16  # rows gathered between two releases of a table's mapped pages
# A table this small is read through its mapping and left mapped: at most its own size stays
# resident. os.preadv releases the GIL, and a serving step's first release is where the
# event loop's thread takes it for its whole turn (the previous token's SSE write) while the
# step waits: 160-270 µs of the demo model's (2 MiB table) 1.6 ms step on 2 busy cores.
SMALL_TABLE_BYTES = 4 << 20


def is_bf16(arr: np.ndarray) -> bool:
    return arr.dtype == BF16


def bf16_to_f32(bits: np.ndarray) -> np.ndarray:
    """Widen bf16 bit patterns (uint16 or BF16) to float32: they are its top 16 bits."""
    if bits.dtype == BF16:
        bits = bits["bf16"]
    wide = bits.astype(np.uint32)
    wide <<= 16
    release_pages(bits)
    return wide.view(np.float32)


def mapped_from_file(arr: np.ndarray) -> bool:
    """Whether `arr` views a model file's mapping (map_file's)."""
    return _mapping_of(arr) is not None


def _mapping_of(arr: np.ndarray) -> tuple[mmap.mmap, int] | None:
    """The file mapping an array views (map_file's), and where in it the array starts."""
    base = arr
    while isinstance(base, (np.ndarray, memoryview)):  # views of views of the mapping
        base = base.base if isinstance(base, np.ndarray) else base.obj
    if not isinstance(base, mmap.mmap):
        return None
    return base, arr.__array_interface__["data"][0] - np.frombuffer(base, np.uint8).__array_interface__["data"][0]


def release_pages(arr: np.ndarray) -> None:
    """Drop a mapped array's pages from this process's memory once it has been converted.

    A converted copy replaces the mapped original, whose pages would otherwise stay
    resident beside it (two copies of the weights). The file stays in the page cache, and
    the mapping stays valid: touching the array again reads it back in.
    """
    mapping = _mapping_of(arr)
    if mapping is None or not hasattr(mapping[0], "madvise") or arr.nbytes < mmap.PAGESIZE:
        return
    base, start = mapping
    first = -(-start // mmap.PAGESIZE) * mmap.PAGESIZE  # only pages wholly inside the array
    stop = (start + arr.nbytes) // mmap.PAGESIZE * mmap.PAGESIZE
    if stop > first:
        base.madvise(mmap.MADV_DONTNEED, first, stop - first)


def gather_rows(table: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """table[ids] for a table read a few rows at a time (the embedding), without mapping
    the table's file pages into this process.

    The page cache hands out mapped files in folios of up to 2 MB, and a read through the
    mapping maps its whole folio: 16 gathered rows of a 0.1B model's embedding mapped 29 MB
    for the length of a step (a decoding batch of 16's peak memory), 64 prompt tokens 82 MB.
    Rows of a table that views a file of map_file's are read from the file instead
    (`os.preadv`, a copy out of the page cache that maps nothing); elsewhere (no preadv, a
    table in memory) through the mapping, 16 rows at a time with the pages unmapped
    between, so at most 16 folios are ever mapped. A table of at most SMALL_TABLE_BYTES is
    read through its mapping and stays mapped.
    """
    if table.nbytes <= SMALL_TABLE_BYTES:
        _check_rows(table, ids)
        return table[ids]
    rows = np.empty((len(ids),) + table.shape[1:], dtype=table.dtype)
    mapping = _mapping_of(table) if table.flags.c_contiguous else None
    file = _FILES.get(id(mapping[0])) if mapping else None
    if file is not None and len(ids):
        _check_rows(table, ids)  # a read would land in other tensors
        (fd, path), row_bytes, start = file, table.strides[0], mapping[1]
        for row, i in zip(rows.view(np.uint8).reshape(len(ids), -1), ids):
            if os.preadv(fd, [row], start + int(i) * row_bytes) != row_bytes:
                raise ModelFileError(path, "the file was cut short while the model was loaded")
        return rows
    for start in range(0, len(ids), GATHER_BLOCK):
        rows[start : start + GATHER_BLOCK] = table[ids[start : start + GATHER_BLOCK]]
        release_pages(table)
    return rows


def _check_rows(table: np.ndarray, ids: np.ndarray) -> None:
    if len(ids) and (int(np.min(ids)) < 0 or int(np.max(ids)) >= len(table)):
        raise IndexError(f"row ids must be in [0, {len(table)})")


def f32_to_bf16(values: np.ndarray) -> np.ndarray:
    """Round float32 to bfloat16 (nearest, ties to even) and return BF16 bit patterns."""
    values = np.ascontiguousarray(values, dtype=np.float32)
    bits = values.view(np.uint32)
    # Adding 0x7FFF plus the lowest kept bit rounds half-way cases to the even pattern.
    rounded = (bits + (np.uint32(0x7FFF) + ((bits >> 16) & np.uint32(1)))) >> 16
    # The rounding carry could turn a NaN with a small payload into ±inf: keep it NaN.
    rounded = np.where(np.isnan(values), np.uint32(0x7FC0), rounded)
    return rounded.astype(np.uint16).view(BF16)


def as_float(arr: np.ndarray) -> np.ndarray:
    """The array as numbers: bf16 widened to float32, fp16/fp32 returned as they are."""
    return bf16_to_f32(arr) if is_bf16(arr) else arr


def cast_for_storage(arr: np.ndarray, dtype: str, name: str, path: str | Path, room=None) -> np.ndarray:
    """A C-contiguous copy (or view) of `arr` in the storage dtype, ready to be written.
    A copy goes where `room(shape, dtype)` says if it gives an array (cpu/arena.py), else
    into a new one.

    bf16 → bf16 copies the bit patterns, so converting an official bf16 checkpoint to
    bf16 safetensors is exact and never widens to fp32. Other conversions go a block at a
    time, so their fp32 temporaries stay a few MB even for the head of a large model
    (whole, a 1.5B model's bf16 head widened to 512 MB on its way to fp16).
    """
    if dtype not in STORAGE_DTYPES:
        raise ValueError(f"unknown storage dtype {dtype!r}; expected one of {STORAGE_DTYPES}")
    target = BF16 if dtype == "bf16" else np.dtype(np.float16 if dtype == "fp16" else np.float32)
    if arr.dtype == target:
        return np.ascontiguousarray(arr)
    source = np.ascontiguousarray(arr).reshape(-1)  # a view of a mapped tensor
    out = room(arr.shape, target) if room is not None else None
    if out is None:
        out = np.empty(arr.shape, dtype=target)
    flat = out.reshape(-1)
    for start in range(0, source.size, _CAST_BLOCK):
        part = source[start : start + _CAST_BLOCK]
        flat[start : start + _CAST_BLOCK] = _cast(part, dtype, name, path)
    return out


_CAST_BLOCK = 1 << 20  # elements converted at a time


def _cast(part: np.ndarray, dtype: str, name: str, path: str | Path) -> np.ndarray:
    if dtype == "bf16":
        return f32_to_bf16(part)
    if dtype == "fp32":
        return as_float(part).astype(np.float32, copy=False)
    with np.errstate(over="ignore"):  # checked right below
        narrowed = as_float(part).astype(np.float16)
    # Released weights stay far below fp16's limit; a file that does not would be silently
    # broken by the cast, so say so instead.
    if np.isinf(narrowed).any() and not np.isinf(as_float(part)).any():
        raise ModelFileError(path, f"tensor '{name}' does not fit in fp16 (|x| > {_FP16_MAX:g}); use fp32 or bf16")
    return narrowed


def map_file(path: str | Path) -> mmap.mmap:
    """Map a whole file read-only, turning every way it can fail into ModelFileError."""
    try:
        with open(path, "rb") as f:
            size = os.fstat(f.fileno()).st_size
            if size == 0:
                raise ModelFileError(path, "empty file")
            mapped = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
            if hasattr(os, "preadv"):  # gather_rows reads the file by its own descriptor
                fd = os.dup(f.fileno())
                _FILES[id(mapped)] = fd, str(path)
                weakref.finalize(mapped, _close, id(mapped), fd)
            return mapped
    except FileNotFoundError:
        raise ModelFileError(path, "file not found") from None
    except IsADirectoryError:
        raise ModelFileError(path, "is a directory, not a model file") from None
    except PermissionError:
        raise ModelFileError(path, "cannot read: permission denied") from None
    except OSError as e:
        raise ModelFileError(path, f"cannot read: {e.strerror or e}") from None


# map_file's mappings by id, each with a descriptor and the name of the file it maps (while it lives).
_FILES: dict[int, tuple[int, str]] = {}


def _close(mapping_id: int, fd: int) -> None:
    _FILES.pop(mapping_id, None)
    os.close(fd)


def view_of(mapped: mmap.mmap, offset: int, dtype: np.dtype, count: int) -> np.ndarray:
    """A read-only 1-D array over `count` items of the mapped file (no copy)."""
    return np.frombuffer(mapped, dtype=dtype, count=count, offset=offset)


def shapes_of(tensors: dict[str, np.ndarray]) -> dict[str, tuple[int, ...]]:
    return {name: tuple(arr.shape) for name, arr in tensors.items()}


__all__ = [
    "BF16",
    "LAYOUTS",
    "STORAGE_DTYPES",
    "Layout",
    "StorageDtype",
    "as_float",
    "bf16_to_f32",
    "cast_for_storage",
    "f32_to_bf16",
    "gather_rows",
    "is_bf16",
    "map_file",
    "release_pages",
    "shapes_of",
    "view_of",
]
