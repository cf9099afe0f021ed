"""Reusable per-thread buffers for the sampler's big temporaries.

A fresh [8, 65536] float32 array is 2 MB: the allocator maps it from the OS and every one
of its 512 pages faults on first touch, which measured ≈ 3 ms per step at batch 16 — more
than all the arithmetic. Reusing the same few buffers step after step avoids that.

Only transient arrays live here: nothing handed back to a caller may be a scratch view.
"""

from __future__ import annotations

import threading

import numpy as np


class _Scratch(threading.local):
    def __init__(self) -> None:
        self.buffers: dict[str, np.ndarray] = {}

    def array(self, name: str, shape: tuple[int, ...], dtype: type) -> np.ndarray:
        """An uninitialised array of `shape` and `dtype` in the buffer called `name`. The
        next request for the same name reuses (and overwrites) the same memory."""
        count = 1
        for size in shape:
            count *= size
        nbytes = count * np.dtype(dtype).itemsize
        buffer = self.buffers.get(name)
        if buffer is None or buffer.size < nbytes:
            buffer = np.empty(max(nbytes, 1), dtype=np.uint8)
            self.buffers[name] = buffer
        return buffer[:nbytes].view(dtype).reshape(shape)


scratch = _Scratch()
