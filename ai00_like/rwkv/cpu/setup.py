"""What the CPU backend changes in the process, once, when its first model is made: glibc's
allocator thresholds and numba's configuration (jit.compiler: its CPU features and
cache folder, set before any kernel is compiled). Nothing here runs at import, so a
process that only uses the GPU backend keeps the defaults."""

from __future__ import annotations

import ctypes
import functools
import sys

from .jit import compiler

_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3


@functools.cache
def prepare() -> None:
    _keep_freed_memory_for_reuse()
    compiler()


def _keep_freed_memory_for_reuse() -> None:
    """Stop glibc from handing every freed temporary straight back to the kernel.

    Every numpy temporary of a step is a fresh allocation of up to a few MB; by default
    glibc maps such blocks anew and unmaps them on free, so each step page-faults all its
    temporaries in again (measured: 3.7 ms of a 0.5 ms WKV update at batch 16). Serving
    blocks below 32 MB from the heap and keeping up to 256 MB of freed heap lets the next
    step reuse the same pages.
    """
    if not sys.platform.startswith("linux"):
        return
    try:
        libc = ctypes.CDLL("libc.so.6")
        libc.mallopt(_M_MMAP_THRESHOLD, 32 << 20)
        libc.mallopt(_M_TRIM_THRESHOLD, 256 << 20)
    except (OSError, AttributeError):  # not glibc: nothing to tune
        pass
