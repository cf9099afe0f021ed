"""LLVM operations the compiled kernels (skinny.py, int8.py) use that numba does not offer.

* `widen(w)`: one weight as float32, from fp32 (as is), fp16 (its uint16 bits: vcvtph2ps)
  or bf16 (its int16 bits: the top half of a float32, a shift).
* `prefetch_rows(W, first, count)`: ask for rows [first, first + count) of W (if W has
  them) ahead of their use. The hardware prefetchers lose each short stream of weight rows
  when it ends; asking a few rows ahead keeps the reads going (a 16-bit head of 65,536 ×
  768 weights: 19 → 39 GB/s).

`build()` gives them with jit.py's compiler as a `Tools`, or None without numba.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

from .jit import compiler


class Tools(NamedTuple):
    jit: Any
    prange: Any
    widen: Any
    prefetch_rows: Any


@functools.cache
def build():
    if compiler() is None:
        return None
    jit, prange = compiler()
    from llvmlite import ir
    from numba import types
    from numba.core import cgutils
    from numba.extending import intrinsic

    @intrinsic
    def widen(typingctx, w):
        if w == types.float32:
            return types.float32(w), lambda context, builder, sig, args: args[0]
        if w == types.uint16:
            def fp16(context, builder, sig, args):
                return builder.fpext(builder.bitcast(args[0], ir.HalfType()), ir.FloatType())
            return types.float32(w), fp16
        if w == types.int16:
            def bf16(context, builder, sig, args):  # the top half of a float32
                wide = builder.shl(builder.zext(args[0], ir.IntType(32)), ir.Constant(ir.IntType(32), 16))
                return builder.bitcast(wide, ir.FloatType())
            return types.float32(w), bf16
        return None

    @intrinsic
    def prefetch(typingctx, flat, index):
        def codegen(context, builder, sig, args):
            data = context.make_array(sig.args[0])(context, builder, args[0]).data
            byte_ptr, i32 = ir.IntType(8).as_pointer(), ir.IntType(32)
            fn = cgutils.get_or_insert_function(builder.module, ir.FunctionType(ir.VoidType(), [byte_ptr, i32, i32, i32]),
                                                "llvm.prefetch.p0i8")
            address = builder.bitcast(builder.gep(data, [args[1]]), byte_ptr)
            # read, keep in every cache level, data cache
            builder.call(fn, [address, ir.Constant(i32, 0), ir.Constant(i32, 3), ir.Constant(i32, 1)])
            return context.get_dummy_value()
        return types.void(flat, index), codegen

    @jit(parallel=False, inline="always")
    def prefetch_rows(W, first, count):  # pragma: no cover - compiled by numba
        N, K = W.shape
        if first + count <= N:
            flat = W.reshape(-1)
            for p in range(first * K, (first + count) * K, 64 // W.itemsize):
                prefetch(flat, p)

    return Tools(jit, prange, widen, prefetch_rows)
