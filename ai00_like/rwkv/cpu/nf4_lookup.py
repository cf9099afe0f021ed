"""NF4 dot products as explicit vector code: the 16 levels looked up in registers.

A weight of an NF4 block is L[c] · absmax for a 4-bit code c (nf4.py). Written as scalar
code, `L[c]` is a memory load per weight, which LLVM vectorises (if at all) as a gather:
the kernel then spends its time looking weights up, not reading them (about 5 billion
weights a second on one core, against 11 for Int8 bytes). A vector CPU has a faster way to
index a 16-entry table: a permute of a register that holds the table, by a register of
indices. With AVX-512 one `vpermps` of a 16-float register looks up 16 codes; with AVX2,
two permutes of 8 floats each and a blend on the code's top bit do the same.

`dot_rows(rows)` gives an intrinsic, callable from numba-compiled code, that computes for
weight row i and `rows` consecutive rows j… of x

    out[j + r, i] = Σ_b absmax[i, b] · Σ_t (L[lo_t] · x_even[j + r, t] + L[hi_t] · x_odd[j + r, t])

(byte t of a weight row holds codes 2t and 2t + 1), each looked-up vector of weights
serving all `rows` rows of x. The arithmetic is the scalar kernel's, fp32 multiply-adds of
the same levels and activations, summed in another order.

`build()` is None where the CPU has neither AVX-512 nor AVX2 with FMA, or without numba;
nf4.py then keeps its scalar loops.
"""

from __future__ import annotations

import functools

from .jit import compiler

BLOCK_BYTES = 32  # a 64-weight block: 32 bytes of two codes each


def vector_width() -> int:
    """Codes looked up per permute on the CPU numba compiles for: 16 (AVX-512), 8 (AVX2
    with FMA) or 0. That is this machine's, unless NUMBA_CPU_FEATURES names others (numba
    then compiles for those, e.g. a release built for older CPUs, or the AVX2 test)."""
    try:
        from llvmlite import binding
        from numba.core import config
    except ImportError:
        return 0
    if config.CPU_FEATURES:
        features = {f[1:]: f[0] == "+" for f in config.CPU_FEATURES.split(",") if f[:1] in "+-" and f[1:]}
    else:
        features = binding.get_host_cpu_features()
    if features.get("avx512f"):
        return 16
    if features.get("avx2") and features.get("fma"):
        return 8
    return 0


@functools.cache
def build():
    """`dot_rows(rows)` → the intrinsic for that many rows of x, or None."""
    width = vector_width()
    if compiler() is None or width == 0:
        return None
    from llvmlite import ir
    from numba import types
    from numba.core import cgutils
    from numba.extending import intrinsic

    f32, i8, i32, i64 = ir.FloatType(), ir.IntType(8), ir.IntType(32), ir.IntType(64)
    fvec, ivec, bvec = ir.VectorType(f32, width), ir.VectorType(i32, width), ir.VectorType(i8, width)

    def splat(value, vector):
        return ir.Constant(vector, [value] * width)

    def declare(builder, name, returns, *args):
        return cgutils.get_or_insert_function(builder.module, ir.FunctionType(returns, list(args)), name)

    def lookup_with(builder, levels_ptr):
        """A function codes → levels for this CPU, its table loaded once into registers."""
        if width == 16:
            table = builder.load(builder.bitcast(levels_ptr, fvec.as_pointer()), align=4)
            permute = declare(builder, "llvm.x86.avx512.permvar.sf.512", fvec, fvec, ivec)
            return lambda codes: builder.call(permute, [table, codes])
        low = builder.load(builder.bitcast(levels_ptr, fvec.as_pointer()), align=4)
        high = builder.load(builder.bitcast(builder.gep(levels_ptr, [ir.Constant(i64, 8)]), fvec.as_pointer()),
                            align=4)
        permute = declare(builder, "llvm.x86.avx2.permps", fvec, fvec, ivec)
        seven = splat(7, ivec)

        def lookup(codes):  # the permute reads the low 3 bits; the 4th picks the half
            upper = builder.icmp_unsigned(">", codes, seven)
            return builder.select(upper, builder.call(permute, [high, codes]), builder.call(permute, [low, codes]))
        return lookup

    def row_pointer(context, builder, array_type, value, row):
        """Address of array[row, 0] for a C-contiguous 2-D array."""
        array = context.make_array(array_type)(context, builder, value)
        stride = cgutils.unpack_tuple(builder, array.strides)[0]
        raw = builder.gep(builder.bitcast(array.data, i8.as_pointer()), [builder.mul(row, stride)])
        return builder.bitcast(raw, array.data.type), cgutils.unpack_tuple(builder, array.shape)

    def load_vector(builder, base, offset, vector, align):
        return builder.load(builder.bitcast(builder.gep(base, [offset]), vector.as_pointer()), align=align)

    def make(rows: int):
        def codegen(context, builder, sig, args):
            q_t, absmax_t, levels_t, even_t, odd_t, _, _, out_t = sig.args
            q, absmax, levels, even, odd, i, j, out = args
            q_row, (_, half) = row_pointer(context, builder, q_t, q, i)
            scales, _ = row_pointer(context, builder, absmax_t, absmax, i)
            xs = [(row_pointer(context, builder, even_t, even, builder.add(j, ir.Constant(i64, r)))[0],
                   row_pointer(context, builder, odd_t, odd, builder.add(j, ir.Constant(i64, r)))[0])
                  for r in range(rows)]
            lookup = lookup_with(builder, context.make_array(levels_t)(context, builder, levels).data)
            fma = declare(builder, "llvm.fma." + ("v16f32" if width == 16 else "v8f32"), fvec, fvec, fvec, fvec)
            total = [cgutils.alloca_once_value(builder, ir.Constant(fvec, None)) for _ in range(rows)]
            nibble, four = splat(15, ivec), splat(4, ivec)
            blocks = builder.udiv(half, ir.Constant(i64, BLOCK_BYTES))
            with cgutils.for_range(builder, blocks) as loop:
                start = builder.mul(loop.index, ir.Constant(i64, BLOCK_BYTES))
                sums = [ir.Constant(fvec, None)] * rows
                for part in range(0, BLOCK_BYTES, width):
                    at = builder.add(start, ir.Constant(i64, part))
                    codes = builder.zext(load_vector(builder, q_row, at, bvec, 1), ivec)
                    w_even = lookup(builder.and_(codes, nibble))
                    w_odd = lookup(builder.lshr(codes, four))
                    for r, (x_even, x_odd) in enumerate(xs):
                        sums[r] = builder.call(fma, [w_even, load_vector(builder, x_even, at, fvec, 4), sums[r]])
                        sums[r] = builder.call(fma, [w_odd, load_vector(builder, x_odd, at, fvec, 4), sums[r]])
                bits = builder.load(builder.gep(scales, [loop.index]))
                scale = builder.fpext(builder.bitcast(bits, ir.HalfType()), f32)
                scale = builder.insert_element(ir.Constant(fvec, ir.Undefined), scale, ir.Constant(i32, 0))
                scale = builder.shuffle_vector(scale, ir.Constant(fvec, ir.Undefined), ir.Constant(ivec, None))
                for r in range(rows):
                    builder.store(builder.call(fma, [sums[r], scale, builder.load(total[r])]), total[r])
            reduce = declare(builder, "llvm.vector.reduce.fadd." + ("v16f32" if width == 16 else "v8f32"),
                             f32, f32, fvec)
            out_array = context.make_array(out_t)(context, builder, out)
            for r in range(rows):
                value = builder.call(reduce, [ir.Constant(f32, 0.0), builder.load(total[r])])
                row = builder.add(j, ir.Constant(i64, r))
                target = cgutils.get_item_pointer(context, builder, out_t, out_array, [row, i])
                builder.store(value, target)
            return context.get_dummy_value()

        @intrinsic
        def dot(typingctx, q, absmax, levels, x_even, x_odd, i, j, out):
            arrays = (q, absmax, levels, x_even, x_odd)
            if any(not isinstance(a, types.Array) or a.layout != "C" for a in arrays):
                return None
            if (q.dtype, absmax.dtype, levels.dtype) != (types.uint8, types.uint16, types.float32):
                return None
            return types.void(q, absmax, levels, x_even, x_odd, types.int64, types.int64, out), codegen

        return dot

    return functools.cache(make)
