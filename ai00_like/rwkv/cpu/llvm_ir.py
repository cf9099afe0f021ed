"""The LLVM IR of the operations vector_dots.py and intrinsics.py give compiled code.

Each operation is a numba intrinsic: a typing function (the argument types it accepts, and
its signature) that hands numba a code generator writing the operation's IR into the
caller. vector_dots.py and intrinsics.py wrap them (`numba.extending.intrinsic`) once
numba is configured; this module is imported only then. `width` is the lanes of a float
vector on the CPU numba compiles for: 16 (AVX-512) or 8 (AVX2).
"""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils



class _BFloat(ir.types._BaseFloatType):
    """LLVM's bfloat, which llvmlite's IR builder lacks: what `vdpbf16ps` multiplies."""

    null = "0.0"
    intrinsic_name = "bf16"

    def __str__(self):
        return "bfloat"


_BFloat._create_instance()
F32, BF16, I8, I32, I64 = ir.FloatType(), _BFloat(), ir.IntType(8), ir.IntType(32), ir.IntType(64)
NF4_BLOCK_BYTES = 32  # a 64-weight NF4 block: 32 bytes of two codes each
INT8_BLOCK = 128  # weights of an Int8 block, a byte each


def fvec(width: int) -> ir.VectorType:
    return ir.VectorType(F32, width)


def ivec(width: int) -> ir.VectorType:
    return ir.VectorType(I32, width)


def index(value: int) -> ir.Constant:
    return ir.Constant(I64, value)


def splat(value, vector):
    return ir.Constant(vector, [value] * vector.count)


def declare(builder, name, returns, *args):
    return cgutils.get_or_insert_function(builder.module, ir.FunctionType(returns, list(args)), name)


def c_arrays(*arrays) -> bool:
    return all(isinstance(a, types.Array) and a.layout == "C" for a in arrays)


def lookup_with(builder, levels_ptr):
    """AVX-512's NF4 lookup, codes → levels: one permute of the 16 levels a register holds."""
    vector, codes_type = fvec(16), ivec(16)
    table = builder.load(builder.bitcast(levels_ptr, vector.as_pointer()), align=4)
    permute = declare(builder, "llvm.x86.avx512.permvar.sf.512", vector, vector, codes_type)
    return lambda codes: builder.call(permute, [table, codes])


def byte_plane_lookup_with(builder, levels_ptr):
    """AVX2's NF4 lookup of a whole 64-weight block: a function <8 x i32> words (32 bytes,
    two codes each) → 8 vectors of 8 levels, in the order nf4.code_position gives x.

    Zen 3 runs the lane-crossing permute (vpermps) about one every two cycles, and the
    permute lookup takes two for 8 codes: 4 cycles for 8 weights, what held a product to
    5.5 billion weights a second on a core. A byte shuffle (vpshufb) looks up 32 codes in a
    16-entry table of bytes at twice that rate: one shuffle for each byte of the 4 of a
    float gives 32 levels, and byte and word unpacks put each level's 4 bytes together
    again, in lanes of 8 floats (within each 128-bit half, as the unpacks work)."""
    bytes32, halves = ir.VectorType(I8, 32), ir.VectorType(ir.IntType(16), 16)
    table = builder.load(builder.bitcast(levels_ptr, ir.VectorType(I8, 64).as_pointer()), align=4)
    planes = [builder.shuffle_vector(table, ir.Constant(ir.VectorType(I8, 64), None),
                                     ir.Constant(ivec(32), [4 * (i % 16) + k for i in range(32)])) for k in range(4)]
    shuffle = declare(builder, "llvm.x86.avx2.pshuf.b", bytes32, bytes32, bytes32)
    nibble, four = splat(15, bytes32), splat(4, bytes32)

    def unpack(a, b, high):  # vpunpck{l,h}{bw,wd}: within each 128-bit half
        count = a.type.count
        per_half = count // 2
        first = per_half // 2 if high else 0
        mask = [v for half in (0, per_half) for i in range(first, first + per_half // 2)
                for v in (half + i, count + half + i)]
        return builder.shuffle_vector(a, b, ir.Constant(ivec(count), mask))

    def lookup(words):
        packed = builder.bitcast(words, bytes32)
        levels = []
        for codes in (builder.and_(packed, nibble), builder.lshr(packed, four)):  # even, odd weights
            p = [builder.call(shuffle, [plane, codes]) for plane in planes]
            low = [builder.bitcast(unpack(p[0], p[1], high), halves) for high in (False, True)]
            top = [builder.bitcast(unpack(p[2], p[3], high), halves) for high in (False, True)]
            for half in (0, 1):
                for high in (False, True):
                    levels.append(builder.bitcast(unpack(low[half], top[half], high), fvec(8)))
        return levels
    return lookup


def row_pointer(context, builder, array_type, value, row):
    """Address of array[row, 0] for a C-contiguous 2-D array, and the array's shape."""
    array = context.make_array(array_type)(context, builder, value)
    stride = cgutils.unpack_tuple(builder, array.strides)[0]
    raw = builder.gep(builder.bitcast(array.data, I8.as_pointer()), [builder.mul(row, stride)])
    return builder.bitcast(raw, array.data.type), cgutils.unpack_tuple(builder, array.shape)


def load_vector(builder, base, offset, vector, align):
    return builder.load(builder.bitcast(builder.gep(base, [offset]), vector.as_pointer()), align=align)


def broadcast(builder, value, width):
    vector = fvec(width)
    value = builder.insert_element(ir.Constant(vector, ir.Undefined), value, ir.Constant(I32, 0))
    return builder.shuffle_vector(value, ir.Constant(vector, ir.Undefined), ir.Constant(ivec(width), None))


def widen_half(builder, pointer, at):
    """An fp16 stored as its uint16 bits, as float32."""
    return builder.fpext(builder.bitcast(builder.load(builder.gep(pointer, [at])), ir.HalfType()), F32)


def running_sums(builder, vector, rows, weight_rows):
    """[weight row][row of x] accumulators, zero."""
    return [[cgutils.alloca_once_value(builder, ir.Constant(vector, None)) for _ in range(rows)]
            for _ in range(weight_rows)]


# A packed block's products are multiply-adds into sums that start at zero, one sum per
# (weight row, row of x): at one row a single chain, each FMA waiting 4 cycles for the one
# before while two could start every cycle. A block's FMAs go round this many sums a call
# (shared among its weight rows and rows of x), which are added up in pairs at its end. Int8
# at one row, 2 Zen 3 cores, 1.5B's 2,048 × 2,048: 16.9 → 21.4 billion weights a second.
CHAINS = 4


def chained_sums(vector, rows, weight_rows):
    """[weight row][row of x] lists of zero sums, CHAINS in all or one each."""
    chains = max(1, CHAINS // (rows * weight_rows))
    return [[[ir.Constant(vector, None)] * chains for _ in range(rows)] for _ in range(weight_rows)]


def fma_into(builder, fma, chain, n, a, b):
    """chain[n % len(chain)] += a · b."""
    chain[n % len(chain)] = builder.call(fma, [a, b, chain[n % len(chain)]])


def pairwise_sum(builder, values):
    """values[0] + values[1] + ..., added in pairs."""
    while len(values) > 1:
        values = [builder.fadd(values[k], values[k + 1]) if k + 1 < len(values) else values[k]
                  for k in range(0, len(values), 2)]
    return values[0]


def write_sums(context, builder, out_t, out, totals, j, i, width, extra=None):
    """out[j + r, i + a] = the lanes of totals[a][r] added up (+ extra[a][r])."""
    reduce = declare(builder, f"llvm.vector.reduce.fadd.v{width}f32", F32, F32, fvec(width))
    out_array = context.make_array(out_t)(context, builder, out)
    for a, row_totals in enumerate(totals):
        for r, total in enumerate(row_totals):
            value = builder.call(reduce, [ir.Constant(F32, 0.0), builder.load(total)])
            if extra is not None:
                value = builder.fadd(value, builder.load(extra[a][r]))
            target = cgutils.get_item_pointer(context, builder, out_t, out_array,
                                              [builder.add(j, index(r)), builder.add(i, index(a))])
            builder.store(value, target)


def block_scales(builder, scales, first, width):
    """The scales of the blocks a chunk's lanes hold, widened: block `first`'s in every
    lane (AVX2), or in the low 8 lanes and block first + 1's in the high 8 (AVX-512)."""
    if width == 8:
        return broadcast(builder, widen_half(builder, scales, first), width)
    pair = ir.VectorType(ir.HalfType(), 2)
    two = builder.fpext(builder.load(builder.bitcast(builder.gep(scales, [first]), pair.as_pointer()), align=2),
                        ir.VectorType(F32, 2))
    return builder.shuffle_vector(two, ir.Constant(ir.VectorType(F32, 2), None), ir.Constant(ivec(16), [0] * 8 + [1] * 8))


# ------------------------------------------------------------------ NF4


class Nf4Dot:
    """The IR of one NF4 dot-product intrinsic call: `weight_rows` rows of codes from row i
    against `rows` rows of x from row j (x as nf4.x_by_code arranges it)."""

    def __init__(self, context, builder, sig, args, width, rows, weight_rows):
        q_t, absmax_t, levels_t, x_t, out_t = sig.args[:4] + sig.args[-1:]
        q, absmax, levels, x, i, j, out = args
        self.builder, self.width, self.rows, self.weight_rows = builder, width, rows, weight_rows
        weights = [builder.add(i, index(a)) for a in range(weight_rows)]
        self.words = [builder.bitcast(row_pointer(context, builder, q_t, q, w)[0], ivec(width).as_pointer())
                      for w in weights]
        _, (_, self.half) = row_pointer(context, builder, q_t, q, i)
        self.scales = [row_pointer(context, builder, absmax_t, absmax, w)[0] for w in weights]
        self.xs = [builder.bitcast(row_pointer(context, builder, x_t, x, builder.add(j, index(r)))[0],
                                   fvec(width).as_pointer()) for r in range(rows)]
        levels_ptr = context.make_array(levels_t)(context, builder, levels).data
        self.lookup = (byte_plane_lookup_with if width == 8 else lookup_with)(builder, levels_ptr)
        self.fma = declare(builder, f"llvm.fma.v{width}f32", fvec(width), fvec(width), fvec(width), fvec(width))
        self.total = running_sums(builder, fvec(width), rows, weight_rows)
        self.out = (context, builder, out_t, out, self.total, j, i, width)

    def chunk(self, at, codes_of, scale_of):
        """A chunk's share of every sum: code c of each lane's word times x's vector c."""
        builder = self.builder
        sums = chained_sums(fvec(self.width), self.rows, self.weight_rows)
        levels = [self.chunk_levels(codes_of(w)) for w in self.words]
        for c in range(8):
            position = builder.add(builder.mul(at, index(8)), index(c))
            x_parts = [builder.load(builder.gep(x_row, [position]), align=4) for x_row in self.xs]
            for a in range(self.weight_rows):
                for r, x_part in enumerate(x_parts):
                    fma_into(builder, self.fma, sums[a][r], c, levels[a][c], x_part)
        for a in range(self.weight_rows):
            scale = scale_of(self.scales[a])
            for r in range(self.rows):
                total = self.total[a][r]
                chunk_sum = pairwise_sum(builder, sums[a][r])
                builder.store(builder.call(self.fma, [chunk_sum, scale, builder.load(total)]), total)

    def chunk_levels(self, words):
        """The chunk's 8 vectors of levels, vector c for x's vector c: the byte-plane lookup's
        (AVX2), or code c of every word (AVX-512)."""
        if self.width == 8:
            return self.lookup(words)
        builder, nibble = self.builder, splat(15, ivec(16))
        return [self.lookup(builder.and_(builder.lshr(words, splat(4 * c, ivec(16))), nibble)) for c in range(8)]

    def emit(self):
        # A chunk is `width` words: one block of 64 weights with AVX2, two with AVX-512.
        builder, width = self.builder, self.width
        blocks = builder.udiv(self.half, index(NF4_BLOCK_BYTES))
        chunks = builder.udiv(blocks, index(width // 8))
        with cgutils.for_range(builder, chunks) as loop:
            first = builder.mul(loop.index, index(width // 8))
            self.chunk(loop.index, lambda w: builder.load(builder.gep(w, [loop.index]), align=1),
                       lambda scale: block_scales(builder, scale, first, width))
        if width == 16:  # an odd number of blocks: the last one in the low lanes, x zero above
            odd = builder.icmp_unsigned("!=", builder.mul(chunks, index(2)), blocks)
            with builder.if_then(odd, likely=False):
                last = builder.sub(blocks, index(1))
                eight = ir.VectorType(I32, 8)

                def low_half(w):
                    part = builder.load(builder.bitcast(builder.gep(w, [chunks]), eight.as_pointer()), align=1)
                    return builder.shuffle_vector(part, ir.Constant(eight, None), ir.Constant(ivec(16), list(range(16))))
                self.chunk(chunks, low_half, lambda scale: broadcast(builder, widen_half(builder, scale, last), width))
        write_sums(*self.out)


def nf4_dot(width: int, rows: int, weight_rows: int):
    """The typing of intrinsic(q, absmax, levels, x, i, j, out) (vector_dots.py's `nf4`)."""
    def codegen(context, builder, sig, args):
        Nf4Dot(context, builder, sig, args, width, rows, weight_rows).emit()
        return context.get_dummy_value()

    def dot(typingctx, q, absmax, levels, x, i, j, out):
        if not c_arrays(q, absmax, levels, x):
            return None
        if (q.dtype, absmax.dtype, levels.dtype, x.dtype) != (types.uint8, types.uint16, types.float32, types.float32):
            return None
        return types.void(q, absmax, levels, x, types.int64, types.int64, out), codegen
    return dot


def nf4_row(width: int):
    """The typing of intrinsic(q, absmax, levels, i, out, r): out[r] = row i widened."""
    def codegen(context, builder, sig, args):
        nf4_row_ir(context, builder, sig, args, width)
        return context.get_dummy_value()

    def nf4_row(typingctx, q, absmax, levels, i, out, r):
        if not c_arrays(q, absmax, levels, out):
            return None
        if (q.dtype, absmax.dtype, levels.dtype, out.dtype) != (types.uint8, types.uint16, types.float32, types.float32):
            return None
        return types.void(q, absmax, levels, types.int64, out, types.int64), codegen
    return nf4_row


def nf4_row_ir(context, builder, sig, args, width):
    q_t, absmax_t, levels_t, _, out_t, _ = sig.args
    q, absmax, levels, i, out, r = args
    q_row, (_, half) = row_pointer(context, builder, q_t, q, i)
    scales, _ = row_pointer(context, builder, absmax_t, absmax, i)
    target, _ = row_pointer(context, builder, out_t, out, r)
    levels_ptr = context.make_array(levels_t)(context, builder, levels).data
    if width == 8:
        return nf4_row_by_bytes(builder, q_row, half, scales, target, levels_ptr)
    lookup = lookup_with(builder, levels_ptr)
    nibble, four = splat(15, ivec(width)), splat(4, ivec(width))
    # Weights 2t and 2t + 1 (byte t's low and high codes) side by side again.
    interleave = ir.Constant(ir.VectorType(I32, 2 * width), [v for t in range(width) for v in (t, width + t)])
    wide = ir.VectorType(F32, 2 * width)
    blocks = builder.udiv(half, index(NF4_BLOCK_BYTES))
    with cgutils.for_range(builder, blocks) as loop:
        start = builder.mul(loop.index, index(NF4_BLOCK_BYTES))
        scale = broadcast(builder, widen_half(builder, scales, loop.index), width)
        for part in range(0, NF4_BLOCK_BYTES, width):
            at = builder.add(start, index(part))
            codes = builder.zext(load_vector(builder, q_row, at, ir.VectorType(I8, width), 1), ivec(width))
            w_even = builder.fmul(lookup(builder.and_(codes, nibble)), scale)
            w_odd = builder.fmul(lookup(builder.lshr(codes, four)), scale)
            pairs = builder.shuffle_vector(w_even, w_odd, interleave)
            address = builder.gep(target, [builder.mul(at, index(2))])
            builder.store(pairs, builder.bitcast(address, wide.as_pointer()), align=4)


def nf4_row_by_bytes(builder, q_row, half, scales, target, levels_ptr):
    """nf4_row with AVX2: each block's levels from the byte-plane lookup, put back in the
    row's order (widening a row for a decoding batch took twice as long by permutes)."""
    lookup, vector = byte_plane_lookup_with(builder, levels_ptr), fvec(8)
    # Level vector j of the even weights holds weights 8j + 2u (u < 4) in its low half and
    # 32 + 8j + 2u in its high one; vector 4 + j the odd weights beside them.
    low, high = (ir.Constant(ivec(8), [v for u in range(4) for v in (first + u, first + 8 + u)]) for first in (0, 4))
    blocks = builder.udiv(half, index(NF4_BLOCK_BYTES))
    with cgutils.for_range(builder, blocks) as loop:
        words = load_vector(builder, q_row, builder.mul(loop.index, index(NF4_BLOCK_BYTES)), ivec(8), 1)
        scale = broadcast(builder, widen_half(builder, scales, loop.index), 8)
        levels = [builder.fmul(level, scale) for level in lookup(words)]
        start = builder.mul(loop.index, index(2 * NF4_BLOCK_BYTES))
        for j in range(4):
            for offset, order in ((8 * j, low), (32 + 8 * j, high)):
                address = builder.gep(target, [builder.add(start, index(offset))])
                builder.store(builder.shuffle_vector(levels[j], levels[4 + j], order),
                              builder.bitcast(address, vector.as_pointer()), align=4)


# ------------------------------------------------------------------ Int8


def int8_dot(width: int, rows: int, weight_rows: int):
    """The typing of intrinsic(q, bounds, x, xsum, i, j, out) (vector_dots.py's `int8`)."""
    def codegen(context, builder, sig, args):
        int8_dot_ir(context, builder, sig, args, width, rows, weight_rows)
        return context.get_dummy_value()

    def dot(typingctx, q, bounds, x, xsum, i, j, out):
        if not c_arrays(q, bounds, x, xsum):
            return None
        if (q.dtype, bounds.dtype, x.dtype, xsum.dtype) != (types.uint8, types.uint16, types.float32, types.float32):
            return None
        return types.void(q, bounds, x, xsum, types.int64, types.int64, out), codegen
    return dot


def int8_dot_ir(context, builder, sig, args, width, rows, weight_rows):
    q_t, bounds_t, x_t, xsum_t, _, _, out_t = sig.args
    q, bounds, x, xsum, i, j, out = args
    vector = fvec(width)
    weights = [builder.add(i, index(a)) for a in range(weight_rows)]
    q_rows = [row_pointer(context, builder, q_t, q, w)[0] for w in weights]
    _, (_, cols) = row_pointer(context, builder, q_t, q, i)
    limits = [row_pointer(context, builder, bounds_t, bounds, w)[0] for w in weights]
    xs = [row_pointer(context, builder, x_t, x, builder.add(j, index(r)))[0] for r in range(rows)]
    x_sums = [row_pointer(context, builder, xsum_t, xsum, builder.add(j, index(r)))[0] for r in range(rows)]
    fma = declare(builder, f"llvm.fma.v{width}f32", vector, vector, vector, vector)
    total = running_sums(builder, vector, rows, weight_rows)
    offset = running_sums(builder, F32, rows, weight_rows)
    with cgutils.for_range(builder, builder.udiv(cols, index(INT8_BLOCK))) as loop:
        start = builder.mul(loop.index, index(INT8_BLOCK))
        sums = chained_sums(vector, rows, weight_rows)
        for n, part in enumerate(range(0, INT8_BLOCK, width)):
            at = builder.add(start, index(part))
            x_parts = [load_vector(builder, x_row, at, vector, 4) for x_row in xs]
            for a, q_row in enumerate(q_rows):
                widened = builder.uitofp(load_vector(builder, q_row, at, ir.VectorType(I8, width), 1), vector)
                for r, x_part in enumerate(x_parts):
                    fma_into(builder, fma, sums[a][r], n, widened, x_part)
        sums = [[pairwise_sum(builder, chain) for chain in row_sums] for row_sums in sums]
        two_b = builder.mul(loop.index, index(2))
        block_x = [builder.load(builder.gep(x_sum, [loop.index])) for x_sum in x_sums]
        for a in range(weight_rows):
            low = widen_half(builder, limits[a], two_b)
            high = widen_half(builder, limits[a], builder.add(two_b, index(1)))
            step = broadcast(builder, builder.fdiv(builder.fsub(high, low), ir.Constant(F32, 255.0)), width)
            for r in range(rows):
                builder.store(builder.call(fma, [sums[a][r], step, builder.load(total[a][r])]), total[a][r])
                builder.store(builder.fadd(builder.load(offset[a][r]), builder.fmul(low, block_x[r])), offset[a][r])
    write_sums(context, builder, out_t, out, total, j, i, width, offset)


# ------------------------------------------------------------------ 16-bit and fp32 blocks


def widened(builder, pointer, at, element, width):
    """`width` weights from `pointer` + at as float32: fp32 as they are, fp16 (uint16 bits)
    by vcvtph2ps, bf16 (int16 bits) as the top halves of float32s."""
    if element == types.float32:
        return load_vector(builder, pointer, at, fvec(width), 4)
    bits = load_vector(builder, pointer, at, ir.VectorType(ir.IntType(16), width), 2)
    if element == types.uint16:
        return builder.fpext(builder.bitcast(bits, ir.VectorType(ir.HalfType(), width)), fvec(width))
    return builder.bitcast(builder.shl(builder.zext(bits, ivec(width)), splat(16, ivec(width))), fvec(width))


def prefetch_lines(builder, fetch, early, step, per, span):
    """As many lines of the rows a few blocks on as a step reads of one row (2 of 16-bit
    weights, 4 of fp32), up to the span's end: the weights of a multi-row product stream in
    bursts between which the prefetchers lose them (a bf16 head at 16 rows: 65 → 97 GMAC/s,
    as fast as from cache)."""
    for t in range(per):
        line = builder.mul(builder.add(builder.mul(step, index(per)), index(t)), index(64))
        # Each line once: a batch of 16 splits a block's lines over 4 calls, whose later
        # steps had asked for the span's last line again and again.
        with builder.if_then(builder.icmp_signed("<", line, span)):
            builder.call(fetch, [builder.gep(early, [line]), ir.Constant(I32, 0), ir.Constant(I32, 3),
                                 ir.Constant(I32, 1)])


def block_ir(context, builder, sig, args, width, weight_rows, x_rows):
    W_t, _, x_t, _, out_t, _, P_t, _, _, _ = sig.args
    W, w, x, j, out, n, P, ahead, lo, span = args
    vector = fvec(width)
    rows = [row_pointer(context, builder, W_t, W, builder.add(w, index(a)))[0] for a in range(weight_rows)]
    _, (_, K) = row_pointer(context, builder, W_t, W, w)
    xs = [row_pointer(context, builder, x_t, x, builder.add(j, index(b)))[0] for b in range(x_rows)]
    early, _ = row_pointer(context, builder, P_t, P, ahead)
    early = builder.gep(builder.bitcast(early, I8.as_pointer()), [lo])
    fetch = declare(builder, "llvm.prefetch.p0i8", ir.VoidType(), I8.as_pointer(), I32, I32, I32)
    fma = declare(builder, f"llvm.fma.v{width}f32", vector, vector, vector, vector)
    sums = running_sums(builder, vector, x_rows, weight_rows)
    # The lines of the weights a step reads, rounded up: asked for as many ahead.
    per = -(-weight_rows * width * (4 if W_t.dtype == types.float32 else 2) // 64)
    with cgutils.for_range(builder, builder.udiv(K, index(width))) as loop:
        prefetch_lines(builder, fetch, early, loop.index, per, span)
        at = builder.mul(loop.index, index(width))
        weights = [widened(builder, row, at, W_t.dtype, width) for row in rows]
        for b, x_row in enumerate(xs):
            xv = load_vector(builder, x_row, at, vector, 4)
            for a in range(weight_rows):
                builder.store(builder.call(fma, [weights[a], xv, builder.load(sums[a][b])]), sums[a][b])
    # sums[a][b] is out[j + b, n + a]: write_sums takes [column][row], as here.
    write_sums(context, builder, out_t, out, sums, j, n, width)


def block(width: int, weight_rows: int, x_rows: int):
    """The typing of intrinsic(W, w, x, j, out, n, P, ahead, lo, span) (vector_dots.py's
    `block`, and `block_tails` for the rows of x past the last 4): `weight_rows` rows of W by
    `x_rows` rows of x. 4 × 4 takes 16 running sums and 8 operands, which AVX-512's 32
    registers hold; AVX2 has 16, so there the block is 3 × 4: 12 sums, 3 weight vectors
    and one of x. Each sum runs along K in the same lanes whatever the block's shape, so a
    row of x gets the same sums to the bit in a block of 4 rows and in one of 1 to 3."""
    def codegen(context, builder, sig, args):
        block_ir(context, builder, sig, args, width, weight_rows, x_rows)
        return context.get_dummy_value()

    def block(typingctx, W, w, x, j, out, n, P, ahead, lo, span):
        """out[j + b, n + a] = x[j + b] · W[w + a] for a < weight_rows, b < x_rows (K a multiple
        of 16), and bytes [lo, lo + span) of P's rows from `ahead` on asked for meanwhile
        (none for span 0): W's own, or the packed rows a block kernel widens into W."""
        if not c_arrays(W, x, out, P):
            return None
        if W.dtype not in (types.float32, types.uint16, types.int16) or x.dtype != types.float32:
            return None
        return types.void(W, types.int64, x, types.int64, out, types.int64, P, types.int64, types.int64,
                          types.int64), codegen
    return block


# ------------------------------------------------------------------ intrinsics.py's scalar operations


def widen(typingctx, w):
    """One weight as float32, from fp32 (as is), fp16 (its uint16 bits) or bf16 (its int16 bits)."""
    if w == types.float32:
        return types.float32(w), lambda context, builder, sig, args: args[0]
    if w == types.uint16:
        def fp16(context, builder, sig, args):
            return builder.fpext(builder.bitcast(args[0], ir.HalfType()), F32)
        return types.float32(w), fp16
    if w == types.int16:
        def bf16(context, builder, sig, args):  # the top half of a float32
            return builder.bitcast(builder.shl(builder.zext(args[0], I32), ir.Constant(I32, 16)), F32)
        return types.float32(w), bf16
    return None


def weight_pair(typingctx, W, n, t):
    """Weights 2t and 2t + 1 of row n of W as two float32s."""
    if not (isinstance(W, types.Array) and W.ndim == 2 and W.dtype in (types.float32, types.uint16, types.int16)):
        return None
    pair = types.UniTuple(types.float32, 2)

    def codegen(context, builder, sig, args):
        array = context.make_array(sig.args[0])(context, builder, args[0])
        row_stride = cgutils.unpack_tuple(builder, array.strides, 2)[0]
        item = index(sig.args[0].dtype.bitwidth // 8)
        offset = builder.add(builder.mul(builder.sext(args[1], I64), row_stride),
                             builder.mul(builder.sext(args[2], I64), builder.mul(item, index(2))))
        address = builder.gep(builder.bitcast(array.data, I8.as_pointer()), [offset])
        if sig.args[0].dtype == types.int16:  # one 32-bit load (align 2: rows of odd length)
            word = builder.load(builder.bitcast(address, I32.as_pointer()), align=2)
            even = builder.bitcast(builder.shl(word, ir.Constant(I32, 16)), F32)
            odd = builder.bitcast(builder.and_(word, ir.Constant(I32, 0xFFFF0000)), F32)
        elif sig.args[0].dtype == types.uint16:
            first = builder.bitcast(address, ir.HalfType().as_pointer())
            even, odd = (builder.fpext(builder.load(builder.gep(first, [ir.Constant(I32, i)])), F32) for i in (0, 1))
        else:
            first = builder.bitcast(address, F32.as_pointer())
            even, odd = (builder.load(builder.gep(first, [ir.Constant(I32, i)])) for i in (0, 1))
        return context.make_tuple(builder, pair, (even, odd))
    return pair(W, n, t), codegen


def holds_bf16(typingctx, W):
    """Whether W holds bf16 bit patterns, as a constant of the compiled code."""
    if not isinstance(W, types.Array):
        return None
    answer = W.dtype == types.int16
    return types.boolean(W), lambda context, builder, sig, args: context.get_constant(types.boolean, answer)


def prefetch(typingctx, flat, at):
    """Ask for the cache line of flat[at]: read, keep in every cache level, data cache."""
    def codegen(context, builder, sig, args):
        data = context.make_array(sig.args[0])(context, builder, args[0]).data
        fetch = declare(builder, "llvm.prefetch.p0i8", ir.VoidType(), I8.as_pointer(), I32, I32, I32)
        address = builder.bitcast(builder.gep(data, [args[1]]), I8.as_pointer())
        builder.call(fetch, [address, ir.Constant(I32, 0), ir.Constant(I32, 3), ir.Constant(I32, 1)])
        return context.get_dummy_value()
    return types.void(flat, at), codegen


def exp(typingctx, x):
    """e^x for a float32, in arithmetic LLVM can vectorise (e^x = 2^n · e^r, |r| ≤ ln 2 / 2,
    e^r by Cephes' expf polynomial: within 3e-7 of e^x; past ±87 it saturates at the
    smallest and largest normal float32s, and nan stays nan). Without a vector maths
    library numba calls libm's expf once an element, and a decoding batch's element-wise
    work spent most of its time there."""
    if x != types.float32:
        return None
    return types.float32(x), exp_ir


def exp_ir(context, builder, sig, args):
    c = lambda v: ir.Constant(F32, v)
    minnum = declare(builder, "llvm.minnum.f32", F32, F32, F32)
    maxnum = declare(builder, "llvm.maxnum.f32", F32, F32, F32)
    floor = declare(builder, "llvm.floor.f32", F32, F32)
    v = builder.call(maxnum, [builder.call(minnum, [args[0], c(88.3762626647949)]), c(-87.3365447505531)])
    n = builder.call(floor, [builder.fadd(builder.fmul(v, c(1.44269504088896341)), c(0.5))])
    r = builder.fsub(builder.fsub(v, builder.fmul(n, c(0.693359375))), builder.fmul(n, c(-2.12194440e-4)))
    p = c(1.9875691500e-4)
    for coefficient in (1.3981999507e-3, 8.3334519073e-3, 4.1665795894e-2, 1.6666665459e-1, 5.0000001201e-1):
        p = builder.fadd(builder.fmul(p, r), c(coefficient))
    e_r = builder.fadd(builder.fadd(builder.fmul(builder.fmul(p, r), r), r), c(1.0))
    bits = builder.shl(builder.add(builder.fptosi(n, I32), ir.Constant(I32, 127)), ir.Constant(I32, 23))
    value = builder.fmul(e_r, builder.bitcast(bits, F32))
    return builder.select(builder.fcmp_unordered("uno", args[0], args[0]), args[0], value)  # nan stays nan
