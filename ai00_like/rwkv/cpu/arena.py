"""The matrices a step streams, in anonymous memory backed by huge pages.

Decoding reads every weight once a token, 270 MiB for a bf16 0.1B model. Read through the
file's mapping, each 4 KiB page of it is a TLB entry of its own, and the page walks stall
the streams: in 2 MiB pages (Linux's transparent huge pages, asked for with madvise) the
same model decoded 117–125 tokens/s at batch 1 against 102 from the mapping, in the same
process (small pages of anonymous memory did no better than the mapping).

So where the kernel offers huge pages, the CPU backend copies each matrix it keeps (the
projections, the LoRA factors, the head) into one anonymous mapping as the layers are
built, and drops the file's pages of each as it goes: the model is never held twice, and
the file stays in the page cache for the next load. Where it does not (other systems, or
huge pages turned off) the matrices stay where they are, mapped in place.
"""

from __future__ import annotations

import ctypes
import mmap
from pathlib import Path

import numpy as np

from ..formats import mapped_from_file, release_pages

HUGE_PAGE = 2 << 20
ALIGN = 64  # each matrix starts on a cache line
THP_SETTING = Path("/sys/kernel/mm/transparent_hugepage/enabled")


def huge_pages_offered() -> bool:
    """Whether madvise can give this process transparent huge pages."""
    if not hasattr(mmap, "MADV_HUGEPAGE"):
        return False
    try:
        return "[never]" not in THP_SETTING.read_text()
    except OSError:
        return False


class Arena:
    """Room for matrices up to `capacity` bytes, taken in order by `hold`. Untouched room
    costs nothing: the mapping is reserved, and memory is given as it is written.
    `in_memory` are arrays already in the process's own memory (a LoRA merged at load): a
    matrix of theirs stays where it is, as a copy would hold it twice."""

    def __init__(self, capacity: int, in_memory=()):
        self._map = mmap.mmap(-1, capacity + 2 * HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        self._map.madvise(mmap.MADV_HUGEPAGE)
        # Seen through ctypes, not as an mmap: formats.release_pages drops the pages of a
        # file's mapping, and must never take these for one.
        raw = np.ctypeslib.as_array((ctypes.c_uint8 * len(self._map)).from_buffer(self._map))
        start = -raw.ctypes.data % HUGE_PAGE  # the first whole huge page
        self._room = raw[start : start + capacity]
        self._used = 0
        self._in_memory = {id(_owner(a)) for a in in_memory}

    @staticmethod
    def for_tensors(tensors, itemsize: int) -> Arena | None:
        """An arena for the matrices of `tensors` kept at `itemsize` bytes a weight (or at
        their own, if larger), or None where huge pages are not to be had."""
        if not huge_pages_offered():
            return None
        arrays = [t for t in tensors.values() if isinstance(t, np.ndarray)]
        matrices = [t for name, t in tensors.items()
                    if isinstance(t, np.ndarray) and t.ndim == 2 and name != "emb.weight"]
        capacity = sum(_aligned(t.size * max(t.itemsize, itemsize)) for t in matrices)
        in_memory = [a for a in arrays if not mapped_from_file(a)]
        return Arena(capacity, in_memory) if capacity else None

    def hold(self, matrix):
        """`matrix` copied into the arena (read-only, as a mapped one is) with its file pages
        dropped; anything else, a matrix in memory already, or one that does not fit, as it is."""
        if not isinstance(matrix, np.ndarray) or matrix.ndim != 2 or self._used + matrix.nbytes > len(self._room):
            return matrix
        if not mapped_from_file(matrix) and id(_owner(matrix)) in self._in_memory:
            return matrix
        held = self._room[self._used : self._used + matrix.nbytes].view(matrix.dtype).reshape(matrix.shape)
        np.copyto(held, matrix)
        release_pages(matrix)
        self._used += _aligned(matrix.nbytes)
        held.flags.writeable = False
        return held


def _aligned(nbytes: int) -> int:
    return -(-nbytes // ALIGN) * ALIGN


def _owner(array: np.ndarray) -> np.ndarray:
    """The array that owns the memory `array` views."""
    while isinstance(array.base, np.ndarray):
        array = array.base
    return array
