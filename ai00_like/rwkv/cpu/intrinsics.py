"""LLVM operations the compiled kernels (skinny.py, int8.py, fused7.py) use that numba does not offer.

* `widen(w)`: one weight as float32, from fp32 (as is), fp16 (its uint16 bits: vcvtph2ps)
  or bf16 (its int16 bits: the top half of a float32, a shift).
* `weight_pair(W, n, t)`: weights 2t and 2t + 1 of row n of W as two float32s. For bf16
  one 32-bit load: the low half shifted up and the high half with the low one cleared, no
  lane-crossing zero-extension (skinny.py's one-row products read bf16 this way).
* `holds_bf16(W)`: whether W holds bf16 bit patterns, a constant of the compiled code (a
  branch on it is left out of the other types' kernels).
* `prefetch_array(A)`: ask for all of a C-contiguous array A ahead of its use, for small
  arrays a kernel needs after a stretch of streaming (fused7.py: a layer's vectors and
  WKV state). The weights themselves are left to the hardware prefetchers: every kernel
  reads each task's rows as one sequential stream, and asking for rows ahead as well
  made the products 10-35% slower on Zen 4 (Int8 at one row 29 → 37-43 GB/s without).

`build()` gives them with jit.py's compiler as a `Tools`, or None without numba; their
LLVM IR is llvm_ir.py's.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

from .jit import compiler


class Tools(NamedTuple):
    jit: Any
    prange: Any
    widen: Any
    weight_pair: Any
    holds_bf16: Any
    prefetch_array: Any
    exp: Any


@functools.cache
def build():
    if compiler() is None:
        return None
    jit, prange = compiler()
    from numba.extending import intrinsic

    from . import llvm_ir  # needs numba, configured by compiler() above

    prefetch = intrinsic(llvm_ir.prefetch)

    @jit(parallel=False, inline="always")
    def prefetch_array(A):  # pragma: no cover - compiled by numba
        flat = A.reshape(-1)
        for p in range(0, flat.shape[0], 64 // A.itemsize):
            prefetch(flat, p)

    return Tools(jit, prange, intrinsic(llvm_ir.widen), intrinsic(llvm_ir.weight_pair), intrinsic(llvm_ir.holds_bf16),
                 prefetch_array, intrinsic(llvm_ir.exp))
