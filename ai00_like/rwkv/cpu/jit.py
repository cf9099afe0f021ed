"""What the compiled kernels (skinny.py, wkv_numba.py) share: numba, if it is there.

numba is optional: without it, or with AI00_LIKE_NO_NUMBA=1, `compiler()` is None and the
kernels' callers use numpy and BLAS.
"""

from __future__ import annotations

import functools
import os
import threading

# Reassociation lets LLVM vectorise sums; no-NaN/no-Inf flags are left off so a NaN or Inf
# in the weights or activations propagates as it would through BLAS.
FASTMATH = {"reassoc", "contract", "arcp", "nsz"}

# numba's fallback threading layer (workqueue, where neither OpenMP nor TBB is installed)
# aborts the process when two threads launch parallel kernels at once: two models served
# side by side take turns instead.
LAUNCH = threading.Lock()


def compiler():
    """`numba.njit` with our options and `numba.prange`, or None."""
    if os.environ.get("AI00_LIKE_NO_NUMBA"):
        return None
    try:
        from numba import njit, prange
    except ImportError:
        return None
    return functools.partial(njit, parallel=True, fastmath=FASTMATH, cache=True, nogil=True), prange
