"""The matrices a step streams, in anonymous memory backed by huge pages.

Decoding reads every weight once a token, 270 MiB for a bf16 0.1B model. Read through the
file's mapping, each 4 KiB page of it is a TLB entry of its own, and the page walks stall
the streams: in 2 MiB pages (Linux's transparent huge pages, asked for with madvise) the
same model decoded 117–125 tokens/s at batch 1 against 102 from the mapping, in the same
process (small pages of anonymous memory did no better than the mapping).

So where the kernel offers huge pages, the CPU backend puts each matrix it streams (the
projections, the LoRA factors and the head) in one anonymous mapping as the layers are
built: a matrix kept in the file's precision is copied there a few MiB at a time, the
file's pages of each part dropped as it goes, and one converted at load (a bf16 file kept
as fp16) is converted straight into it. The model is never held twice, and the file stays
in the page cache for the next load. Matrices quantised at load are in numpy's memory,
which asks for huge pages itself for every array of 4 MiB or more. Where huge pages are
not offered (other systems, or turned off) the matrices stay mapped.
"""

from __future__ import annotations

import ctypes
import mmap
from pathlib import Path

import numpy as np

from ..formats import mapped_from_file, release_pages

HUGE_PAGE = 2 << 20
ALIGN = 64  # each matrix starts on a cache line
COPY_BYTES = 4 << 20  # copied at a time: the file's pages and the copy overlap by this much
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
    costs nothing: the mapping is reserved, and memory is given as it is written."""

    def __init__(self, capacity: int):
        self._map = mmap.mmap(-1, capacity + 2 * HUGE_PAGE, flags=mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
        self._map.madvise(mmap.MADV_HUGEPAGE)
        # Seen through ctypes, not as an mmap: formats.release_pages drops the pages of a
        # file's mapping, and must never take these for one.
        raw = np.ctypeslib.as_array((ctypes.c_uint8 * len(self._map)).from_buffer(self._map))
        start = -raw.ctypes.data % HUGE_PAGE  # the first whole huge page
        self._room = raw[start : start + capacity]
        self._used = 0

    @staticmethod
    def for_tensors(tensors, precision: str) -> Arena | None:
        """An arena for the file-mapped matrices of `tensors` as kept in `precision`, or
        None where huge pages are not to be had."""
        if not huge_pages_offered():
            return None
        size = 2 if precision in ("fp16", "bf16") else None
        capacity = sum(_aligned(t.size * (size or t.itemsize)) for name, t in tensors.items()
                       if isinstance(t, np.ndarray) and t.ndim == 2 and name != "emb.weight" and mapped_from_file(t))
        return Arena(capacity) if capacity else None

    def room(self, shape: tuple[int, ...], dtype) -> np.ndarray | None:
        """Room for a matrix about to be written (a conversion at load), or None if full."""
        nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
        if self._used + nbytes > len(self._room):
            return None
        taken = self._room[self._used : self._used + nbytes].view(dtype).reshape(shape)
        self._used += _aligned(nbytes)
        return taken

    def hold(self, matrix):
        """A matrix viewing the file's mapping, copied into the arena (read-only, as the
        mapping is) a few MiB at a time, each part's file pages dropped once copied;
        anything else as it is (a matrix converted at load was written into `room`)."""
        if not isinstance(matrix, np.ndarray) or matrix.ndim != 2 or not mapped_from_file(matrix) \
                or not matrix.flags.c_contiguous or self._used + matrix.nbytes > len(self._room):
            return matrix
        held = self.room(matrix.shape, matrix.dtype)
        rows = max(1, COPY_BYTES // max(1, matrix.strides[0]))
        for first in range(0, len(matrix), rows):
            np.copyto(held[first : first + rows], matrix[first : first + rows])
            release_pages(matrix[first : first + rows])
        release_pages(matrix)  # the pages the parts shared at their ends
        held.flags.writeable = False
        return held


def _aligned(nbytes: int) -> int:
    return -(-nbytes // ALIGN) * ALIGN


