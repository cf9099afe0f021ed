"""The packed kernels' dot products as explicit vector code (LLVM IR through numba).

Written as scalar loops (int8.py's and nf4.py's fallbacks), these products run below what
the CPU can do, each for its own reason:

* NF4: a weight is L[c] · absmax for a 4-bit code c. `L[c]` is a memory load per weight,
  which LLVM vectorises (if at all) as a gather: the kernel spends its time looking
  weights up, not reading them (5 billion weights a second on one core, against 11 for
  Int8). A vector CPU indexes a 16-entry table faster with a permute of a register that
  holds it: with AVX-512 one `vpermps` of 16 floats looks up 16 codes; with AVX2, two
  permutes of 8 floats and a blend on the code's top bit do the same (15–20 billion).
  The codes are read as the 32-bit words quant.py packs them in, eight to a word, and
  code c of every lane is a shift away (nf4.py).
* Int8: a weight is low + step · q for a byte q; the bytes are widened to floats a vector
  at a time (`vpmovzxbd`, `vcvtdq2ps`) and multiplied with x in the same registers.

`nf4_row` widens a row of NF4 weights to fp32 the same way, 16 or 8 codes a permute, for
the kernels that multiply widened rows (nf4.py: a decoding batch's block kernel, prefill's
tiles).

`nf4(rows, weight_rows=1)` and `int8(rows, weight_rows=1)` give intrinsics, callable from
numba-compiled code, that compute for weight rows i… and `rows` consecutive rows j… of x

    NF4:  out[j + r, i] = Σ_chunks Σ_c L[word >> 4c] · x[j + r, chunk's vector c] · absmax
          (x as nf4.x_by_code arranges it, each lane scaled by its block's absmax)
    Int8: out[j + r, i] = Σ_b (step_b · Σ_k q_k · x[j + r, k] + low_b · xsum[j + r, b])

(with several weight rows, the same for each i + a), each widened vector of weights
serving all `rows` rows of x and each vector of x all the weight rows. The arithmetic is the scalar kernels', fp32 multiply-adds of the same
weights and activations, summed in another order.

`build()` is None where the CPU has neither AVX-512 nor AVX2 with FMA, or without numba;
int8.py and nf4.py then keep their scalar loops.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

from .jit import compiler

NF4_BLOCK_BYTES = 32  # a 64-weight NF4 block: 32 bytes of two codes each
INT8_BLOCK = 128  # weights of an Int8 block, a byte each


class Kernels(NamedTuple):
    nf4: Any  # (rows, weight_rows=1) → intrinsic(q, absmax, levels, x, i, j, out)
    int8: Any  # (rows, weight_rows=1) → intrinsic(q, bounds, x, xsum, i, j, out)
    nf4_row: Any  # intrinsic(q, absmax, levels, i, out, r): out[r] = row i widened to fp32
    block4: Any  # intrinsic(W, w, x, j, out, n, P, ahead, lo, span), AVX-512 only (else None)


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
    """The intrinsics' factories for this CPU, or None."""
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

    def broadcast(builder, value):
        value = builder.insert_element(ir.Constant(fvec, ir.Undefined), value, ir.Constant(i32, 0))
        return builder.shuffle_vector(value, ir.Constant(fvec, ir.Undefined), ir.Constant(ivec, None))

    def widen_half(builder, pointer, index):
        """An fp16 stored as its uint16 bits, as float32."""
        return builder.fpext(builder.bitcast(builder.load(builder.gep(pointer, [index])), ir.HalfType()), f32)

    def write_sums(context, builder, out_t, out, totals, j, i, extra=None):
        """out[j + r, i + a] = the lanes of totals[a][r] added up (+ extra[a][r])."""
        reduce = declare(builder, f"llvm.vector.reduce.fadd.v{width}f32", f32, f32, fvec)
        out_array = context.make_array(out_t)(context, builder, out)
        for a, row_totals in enumerate(totals):
            for r, total in enumerate(row_totals):
                value = builder.call(reduce, [ir.Constant(f32, 0.0), builder.load(total)])
                if extra is not None:
                    value = builder.fadd(value, builder.load(extra[a][r]))
                target = cgutils.get_item_pointer(context, builder, out_t, out_array,
                                                  [builder.add(j, ir.Constant(i64, r)), builder.add(i, ir.Constant(i64, a))])
                builder.store(value, target)

    def nf4_dot(rows: int, weight_rows: int = 1):
        def codegen(context, builder, sig, args):
            q_t, absmax_t, levels_t, x_t, out_t = sig.args[:4] + sig.args[-1:]
            q, absmax, levels, x, i, j, out = args
            weights = [builder.add(i, ir.Constant(i64, a)) for a in range(weight_rows)]
            words = [builder.bitcast(row_pointer(context, builder, q_t, q, w)[0], ivec.as_pointer()) for w in weights]
            _, (_, half) = row_pointer(context, builder, q_t, q, i)
            scales = [row_pointer(context, builder, absmax_t, absmax, w)[0] for w in weights]
            xs = [builder.bitcast(row_pointer(context, builder, x_t, x, builder.add(j, ir.Constant(i64, r)))[0],
                                  fvec.as_pointer()) for r in range(rows)]
            lookup = lookup_with(builder, context.make_array(levels_t)(context, builder, levels).data)
            fma = declare(builder, f"llvm.fma.v{width}f32", fvec, fvec, fvec, fvec)
            total = [[cgutils.alloca_once_value(builder, ir.Constant(fvec, None)) for _ in range(rows)]
                     for _ in range(weight_rows)]
            nibble = splat(15, ivec)

            def chunk(index, codes_of, scale_of):
                """A chunk's share of every sum: code c of each lane's word times x's vector c."""
                sums = [[ir.Constant(fvec, None)] * rows for _ in range(weight_rows)]
                packed = [codes_of(w) for w in words]
                for c in range(8):
                    at = builder.add(builder.mul(index, ir.Constant(i64, 8)), ir.Constant(i64, c))
                    x_parts = [builder.load(builder.gep(x_row, [at]), align=4) for x_row in xs]
                    for a, word in enumerate(packed):
                        w = lookup(builder.and_(builder.lshr(word, splat(4 * c, ivec)), nibble))
                        for r, x_part in enumerate(x_parts):
                            sums[a][r] = builder.call(fma, [w, x_part, sums[a][r]])
                for a in range(weight_rows):
                    scale = scale_of(scales[a])
                    for r in range(rows):
                        builder.store(builder.call(fma, [sums[a][r], scale, builder.load(total[a][r])]), total[a][r])

            # A chunk is `width` words: one block of 64 weights with AVX2, two with AVX-512.
            blocks = builder.udiv(half, ir.Constant(i64, NF4_BLOCK_BYTES))
            chunks = builder.udiv(blocks, ir.Constant(i64, width // 8))
            with cgutils.for_range(builder, chunks) as loop:
                first = builder.mul(loop.index, ir.Constant(i64, width // 8))
                chunk(loop.index, lambda w: builder.load(builder.gep(w, [loop.index]), align=1),
                      lambda scale: block_scales(builder, scale, first))
            if width == 16:  # an odd number of blocks: the last one in the low lanes, x zero above
                odd = builder.icmp_unsigned("!=", builder.mul(chunks, ir.Constant(i64, 2)), blocks)
                with builder.if_then(odd, likely=False):
                    last = builder.sub(blocks, ir.Constant(i64, 1))
                    eight = ir.VectorType(i32, 8)

                    def low_half(w):
                        part = builder.load(builder.bitcast(builder.gep(w, [chunks]), eight.as_pointer()), align=1)
                        return builder.shuffle_vector(part, ir.Constant(eight, None), ir.Constant(ivec, list(range(16))))
                    chunk(chunks, low_half, lambda scale: broadcast(builder, widen_half(builder, scale, last)))
            write_sums(context, builder, out_t, out, total, j, i)
            return context.get_dummy_value()

        @intrinsic
        def dot(typingctx, q, absmax, levels, x, i, j, out):
            arrays = (q, absmax, levels, x)
            if any(not isinstance(a, types.Array) or a.layout != "C" for a in arrays):
                return None
            if (q.dtype, absmax.dtype, levels.dtype, x.dtype) != (types.uint8, types.uint16, types.float32, types.float32):
                return None
            return types.void(q, absmax, levels, x, types.int64, types.int64, out), codegen

        return dot

    def block_scales(builder, scales, first):
        """The scales of the blocks a chunk's lanes hold, widened: block `first`'s in every
        lane (AVX2), or in the low 8 lanes and block first + 1's in the high 8 (AVX-512)."""
        if width == 8:
            return broadcast(builder, widen_half(builder, scales, first))
        pair = ir.VectorType(ir.HalfType(), 2)
        two = builder.fpext(builder.load(builder.bitcast(builder.gep(scales, [first]), pair.as_pointer()), align=2),
                            ir.VectorType(f32, 2))
        return builder.shuffle_vector(two, ir.Constant(ir.VectorType(f32, 2), None), ir.Constant(ivec, [0] * 8 + [1] * 8))

    def nf4_row_codegen(context, builder, sig, args):
        q_t, absmax_t, levels_t, _, out_t, _ = sig.args
        q, absmax, levels, i, out, r = args
        q_row, (_, half) = row_pointer(context, builder, q_t, q, i)
        scales, _ = row_pointer(context, builder, absmax_t, absmax, i)
        target, _ = row_pointer(context, builder, out_t, out, r)
        lookup = lookup_with(builder, context.make_array(levels_t)(context, builder, levels).data)
        nibble, four = splat(15, ivec), splat(4, ivec)
        # Weights 2t and 2t + 1 (byte t's low and high codes) side by side again.
        interleave = ir.Constant(ir.VectorType(i32, 2 * width), [v for t in range(width) for v in (t, width + t)])
        wide = ir.VectorType(f32, 2 * width)
        blocks = builder.udiv(half, ir.Constant(i64, NF4_BLOCK_BYTES))
        with cgutils.for_range(builder, blocks) as loop:
            start = builder.mul(loop.index, ir.Constant(i64, NF4_BLOCK_BYTES))
            scale = broadcast(builder, widen_half(builder, scales, loop.index))
            for part in range(0, NF4_BLOCK_BYTES, width):
                at = builder.add(start, ir.Constant(i64, part))
                codes = builder.zext(load_vector(builder, q_row, at, bvec, 1), ivec)
                w_even = builder.fmul(lookup(builder.and_(codes, nibble)), scale)
                w_odd = builder.fmul(lookup(builder.lshr(codes, four)), scale)
                pairs = builder.shuffle_vector(w_even, w_odd, interleave)
                address = builder.gep(target, [builder.mul(at, ir.Constant(i64, 2))])
                builder.store(pairs, builder.bitcast(address, wide.as_pointer()), align=4)
        return context.get_dummy_value()

    @intrinsic
    def nf4_row(typingctx, q, absmax, levels, i, out, r):
        arrays = (q, absmax, levels, out)
        if any(not isinstance(a, types.Array) or a.layout != "C" for a in arrays):
            return None
        if (q.dtype, absmax.dtype, levels.dtype, out.dtype) != (types.uint8, types.uint16, types.float32, types.float32):
            return None
        return types.void(q, absmax, levels, types.int64, out, types.int64), nf4_row_codegen

    def int8_dot(rows: int, weight_rows: int = 1):
        def codegen(context, builder, sig, args):
            q_t, bounds_t, x_t, xsum_t, _, _, out_t = sig.args
            q, bounds, x, xsum, i, j, out = args
            weights = [builder.add(i, ir.Constant(i64, a)) for a in range(weight_rows)]
            q_rows = [row_pointer(context, builder, q_t, q, w)[0] for w in weights]
            _, (_, cols) = row_pointer(context, builder, q_t, q, i)
            limits = [row_pointer(context, builder, bounds_t, bounds, w)[0] for w in weights]
            xs = [row_pointer(context, builder, x_t, x, builder.add(j, ir.Constant(i64, r)))[0] for r in range(rows)]
            x_sums = [row_pointer(context, builder, xsum_t, xsum, builder.add(j, ir.Constant(i64, r)))[0]
                      for r in range(rows)]
            fma = declare(builder, f"llvm.fma.v{width}f32", fvec, fvec, fvec, fvec)
            total = [[cgutils.alloca_once_value(builder, ir.Constant(fvec, None)) for _ in range(rows)]
                     for _ in range(weight_rows)]
            offset = [[cgutils.alloca_once_value(builder, ir.Constant(f32, 0.0)) for _ in range(rows)]
                      for _ in range(weight_rows)]
            blocks = builder.udiv(cols, ir.Constant(i64, INT8_BLOCK))
            with cgutils.for_range(builder, blocks) as loop:
                start = builder.mul(loop.index, ir.Constant(i64, INT8_BLOCK))
                sums = [[ir.Constant(fvec, None)] * rows for _ in range(weight_rows)]
                for part in range(0, INT8_BLOCK, width):
                    at = builder.add(start, ir.Constant(i64, part))
                    x_parts = [load_vector(builder, x_row, at, fvec, 4) for x_row in xs]
                    for a, q_row in enumerate(q_rows):
                        widened = builder.uitofp(load_vector(builder, q_row, at, bvec, 1), fvec)
                        for r, x_part in enumerate(x_parts):
                            sums[a][r] = builder.call(fma, [widened, x_part, sums[a][r]])
                two_b = builder.mul(loop.index, ir.Constant(i64, 2))
                block_x = [builder.load(builder.gep(x_sum, [loop.index])) for x_sum in x_sums]
                for a in range(weight_rows):
                    low = widen_half(builder, limits[a], two_b)
                    high = widen_half(builder, limits[a], builder.add(two_b, ir.Constant(i64, 1)))
                    step = broadcast(builder, builder.fdiv(builder.fsub(high, low), ir.Constant(f32, 255.0)))
                    for r in range(rows):
                        builder.store(builder.call(fma, [sums[a][r], step, builder.load(total[a][r])]), total[a][r])
                        builder.store(builder.fadd(builder.load(offset[a][r]), builder.fmul(low, block_x[r])),
                                      offset[a][r])
            write_sums(context, builder, out_t, out, total, j, i, offset)
            return context.get_dummy_value()

        @intrinsic
        def dot(typingctx, q, bounds, x, xsum, i, j, out):
            arrays = (q, bounds, x, xsum)
            if any(not isinstance(a, types.Array) or a.layout != "C" for a in arrays):
                return None
            if (q.dtype, bounds.dtype, x.dtype, xsum.dtype) != (types.uint8, types.uint16, types.float32, types.float32):
                return None
            return types.void(q, bounds, x, xsum, types.int64, types.int64, out), codegen

        return dot

    def widened(builder, pointer, at, element):
        """16 weights from `pointer` + at as float32: fp32 as they are, fp16 (uint16 bits)
        by vcvtph2ps, bf16 (int16 bits) as the top halves of float32s."""
        if element == types.float32:
            return load_vector(builder, pointer, at, fvec, 4)
        bits = load_vector(builder, pointer, at, ir.VectorType(ir.IntType(16), width), 2)
        if element == types.uint16:
            return builder.fpext(builder.bitcast(bits, ir.VectorType(ir.HalfType(), width)), fvec)
        return builder.bitcast(builder.shl(builder.zext(bits, ivec), splat(16, ivec)), fvec)

    def block4_codegen(context, builder, sig, args):
        W_t, _, x_t, _, out_t, _, P_t, _, _, _ = sig.args
        W, w, x, j, out, n, P, ahead, lo, span = args
        four = [builder.add(w, ir.Constant(i64, a)) for a in range(4)]
        rows = [row_pointer(context, builder, W_t, W, row)[0] for row in four]
        _, (_, K) = row_pointer(context, builder, W_t, W, w)
        xs = [row_pointer(context, builder, x_t, x, builder.add(j, ir.Constant(i64, b)))[0] for b in range(4)]
        early, _ = row_pointer(context, builder, P_t, P, ahead)
        early = builder.gep(builder.bitcast(early, i8.as_pointer()), [lo])
        fetch = declare(builder, "llvm.prefetch.p0i8", ir.VoidType(), i8.as_pointer(), i32, i32, i32)
        fma = declare(builder, f"llvm.fma.v{width}f32", fvec, fvec, fvec, fvec)
        sums = [[cgutils.alloca_once_value(builder, ir.Constant(fvec, None)) for _ in range(4)] for _ in range(4)]
        with cgutils.for_range(builder, builder.udiv(K, ir.Constant(i64, width))) as loop:
            # As many lines of the rows a few blocks on as a step reads of one row (2 of
            # 16-bit weights, 4 of fp32), up to the span's end: the weights of a multi-row
            # product stream in bursts between which the prefetchers lose them (a bf16
            # head at 16 rows: 65 → 97 GMAC/s, as fast as from cache).
            per = 4 if W_t.dtype == types.float32 else 2
            for t in range(per):
                line = builder.mul(builder.add(builder.mul(loop.index, ir.Constant(i64, per)), ir.Constant(i64, t)),
                                   ir.Constant(i64, 64))
                # Each line once: a batch of 16 splits a block's lines over 4 calls, whose
                # later steps had asked for the span's last line again and again.
                with builder.if_then(builder.icmp_signed("<", line, span)):
                    builder.call(fetch, [builder.gep(early, [line]), ir.Constant(i32, 0), ir.Constant(i32, 3),
                                         ir.Constant(i32, 1)])
            at = builder.mul(loop.index, ir.Constant(i64, width))
            weights = [widened(builder, row, at, W_t.dtype) for row in rows]
            for b, x_row in enumerate(xs):
                xv = load_vector(builder, x_row, at, fvec, 4)
                for a in range(4):
                    builder.store(builder.call(fma, [weights[a], xv, builder.load(sums[a][b])]), sums[a][b])
        reduce = declare(builder, f"llvm.vector.reduce.fadd.v{width}f32", f32, f32, fvec)
        out_array = context.make_array(out_t)(context, builder, out)
        for a in range(4):
            for b in range(4):
                value = builder.call(reduce, [ir.Constant(f32, 0.0), builder.load(sums[a][b])])
                target = cgutils.get_item_pointer(context, builder, out_t, out_array,
                                                  [builder.add(j, ir.Constant(i64, b)),
                                                   builder.add(n, ir.Constant(i64, a))])
                builder.store(value, target)
        return context.get_dummy_value()

    @intrinsic
    def block4(typingctx, W, w, x, j, out, n, P, ahead, lo, span):
        """out[j + b, n + a] = x[j + b] · W[w + a] for a, b < 4 (K a multiple of 16), and
        bytes [lo, lo + span) of P's rows from `ahead` on asked for meanwhile (span ≥ 64):
        W's own, or the packed rows a block kernel widens into W."""
        if any(not isinstance(a, types.Array) or a.layout != "C" for a in (W, x, out, P)):
            return None
        if W.dtype not in (types.float32, types.uint16, types.int16) or x.dtype != types.float32:
            return None
        return types.void(W, types.int64, x, types.int64, out, types.int64, P, types.int64, types.int64,
                          types.int64), block4_codegen

    return Kernels(functools.cache(nf4_dot), functools.cache(int8_dot), nf4_row, block4 if width == 16 else None)
