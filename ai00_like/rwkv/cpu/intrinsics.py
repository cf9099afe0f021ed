"""LLVM operations the compiled kernels (skinny.py, int8.py) use that numba does not offer.

* `widen(w)`: one weight as float32, from fp32 (as is), fp16 (its uint16 bits: vcvtph2ps)
  or bf16 (its int16 bits: the top half of a float32, a shift).
* `prefetch(flat, index)`: ask for the cache line holding flat[index] ahead of its use.
  The hardware prefetchers follow a stream only so far past where it starts, and the
  kernels read each block of weight rows as short streams.

`build()` is None without numba (jit.py).
"""

from __future__ import annotations

import functools

from .jit import compiler


@functools.cache
def build():
    if compiler() is None:
        return None
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

    return widen, prefetch
