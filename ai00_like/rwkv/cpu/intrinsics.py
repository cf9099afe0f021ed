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
    weight_pair: Any
    holds_bf16: Any
    prefetch_array: Any
    exp: Any


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
    def weight_pair(typingctx, W, n, t):
        if not (isinstance(W, types.Array) and W.ndim == 2 and W.dtype in (types.float32, types.uint16, types.int16)):
            return None
        pair = types.UniTuple(types.float32, 2)
        f32, i8, i32, i64 = ir.FloatType(), ir.IntType(8), ir.IntType(32), ir.IntType(64)

        def codegen(context, builder, sig, args):
            array = context.make_array(sig.args[0])(context, builder, args[0])
            row_stride = cgutils.unpack_tuple(builder, array.strides, 2)[0]
            item = ir.Constant(i64, sig.args[0].dtype.bitwidth // 8)
            offset = builder.add(builder.mul(builder.sext(args[1], i64), row_stride),
                                 builder.mul(builder.sext(args[2], i64), builder.mul(item, ir.Constant(i64, 2))))
            address = builder.gep(builder.bitcast(array.data, i8.as_pointer()), [offset])
            if sig.args[0].dtype == types.int16:  # one 32-bit load (align 2: rows of odd length)
                word = builder.load(builder.bitcast(address, i32.as_pointer()), align=2)
                even = builder.bitcast(builder.shl(word, ir.Constant(i32, 16)), f32)
                odd = builder.bitcast(builder.and_(word, ir.Constant(i32, 0xFFFF0000)), f32)
            elif sig.args[0].dtype == types.uint16:
                first = builder.bitcast(address, ir.HalfType().as_pointer())
                even, odd = (builder.fpext(builder.load(builder.gep(first, [ir.Constant(i32, i)])), f32) for i in (0, 1))
            else:
                first = builder.bitcast(address, f32.as_pointer())
                even, odd = (builder.load(builder.gep(first, [ir.Constant(i32, i)])) for i in (0, 1))
            return context.make_tuple(builder, pair, (even, odd))
        return pair(W, n, t), codegen

    @intrinsic
    def holds_bf16(typingctx, W):
        if not isinstance(W, types.Array):
            return None
        answer = W.dtype == types.int16
        return types.boolean(W), lambda context, builder, sig, args: context.get_constant(types.boolean, answer)

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
    def prefetch_array(A):  # pragma: no cover - compiled by numba
        flat = A.reshape(-1)
        for p in range(0, flat.shape[0], 64 // A.itemsize):
            prefetch(flat, p)

    @intrinsic
    def exp(typingctx, x):
        """e^x for a float32, in arithmetic LLVM can vectorise (e^x = 2^n · e^r, |r| ≤ ln 2 / 2,
        e^r by Cephes' expf polynomial: within 3e-7 of e^x; past ±87 it saturates at the
        smallest and largest normal float32s, and nan stays nan). Without a vector maths
        library numba calls libm's expf once an element, and a decoding batch's element-wise
        work spent most of its time there."""
        if x != types.float32:
            return None

        def codegen(context, builder, sig, args):
            f32, i32 = ir.FloatType(), ir.IntType(32)
            c = lambda v: ir.Constant(f32, v)
            minnum = cgutils.get_or_insert_function(builder.module, ir.FunctionType(f32, [f32, f32]), "llvm.minnum.f32")
            maxnum = cgutils.get_or_insert_function(builder.module, ir.FunctionType(f32, [f32, f32]), "llvm.maxnum.f32")
            floor = cgutils.get_or_insert_function(builder.module, ir.FunctionType(f32, [f32]), "llvm.floor.f32")
            v = builder.call(maxnum, [builder.call(minnum, [args[0], c(88.3762626647949)]), c(-87.3365447505531)])
            n = builder.call(floor, [builder.fadd(builder.fmul(v, c(1.44269504088896341)), c(0.5))])
            r = builder.fsub(builder.fsub(v, builder.fmul(n, c(0.693359375))), builder.fmul(n, c(-2.12194440e-4)))
            p = c(1.9875691500e-4)
            for coefficient in (1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2, 1.6666665459e-1, 5.0000001201e-1):
                p = builder.fadd(builder.fmul(p, r), c(coefficient))
            e_r = builder.fadd(builder.fadd(builder.fmul(builder.fmul(p, r), r), r), c(1.0))
            bits = builder.shl(builder.add(builder.fptosi(n, i32), ir.Constant(i32, 127)), ir.Constant(i32, 23))
            value = builder.fmul(e_r, builder.bitcast(bits, f32))
            return builder.select(builder.fcmp_unordered("uno", args[0], args[0]), args[0], value)  # nan stays nan
        return types.float32(x), codegen

    return Tools(jit, prange, widen, weight_pair, holds_bf16, prefetch_array, exp)
