"""The LLVM IR of the products with Int8, NF4 and bf16 weights in panels (panels.py), AVX-512.

Lanes run along 16 weight rows (outputs): lane o of a weight vector holds weights 2p and
2p + 1 of row o, and x's pair p is broadcast. The weights are stored that way (a panel of
48 rows, each pair of a row's bytes beside the next row's), as bytes, and widened as
they are loaded. Lanes along the outputs need no sum across a vector's lanes, so
one kernel serves every row count, from a decoding step's one row to a prompt's chunk. A
call multiplies a block of `x_rows` rows of x (8, 4, 2 or 1) by the panel's 3 weight
vectors over one weight block (128 inputs of Int8, 64 of NF4); each block's sums start from zero and are
folded into the rows' totals block after block, in order, so a row's result is the same
whichever block of rows took it. (Taking several weight blocks at once for one row of x,
for more chains of sums side by side, read the weights as several streams: a 128 MiB head
took 1.2–2× as long.) Each call asks for the lines of the weights two blocks on
(`PREFETCH_BLOCKS`): a block of weights feeds 8 rows of x for about 0.7 µs, long enough
for the prefetchers to lose the stream (on two Zen 5 cores, 16 rows of x against 1.5B's
8,192 × 2,048 matrices: 2.5 → 1.4 ms; its 65,536-row head 23 → 13 ms).

Five kinds, told apart by the types of `x_parts`:

* Int8 weights, fp32 x (panel_int8.py, exact): `(x [M, K] float32, x_sum [M, blocks])`.
  A pair's two weights are split out of the widened lane (the low and high 16 bits), made
  float and multiplied in turn with x's two inputs (two fp32 FMAs, in the same order for
  every row). The fold: total = fma(sum, step, total); total = fma(low, Σx, total).
* NF4 weights, fp32 x (panel_nf4.py): `(x [M, K] float32, levels [16] float32)`. A
  panel's pair is a byte a row, its two codes the low and high nibble, looked up in the 16
  levels held in a register (one permute for 16 rows), then two FMAs as above. The fold:
  total = fma(sum, absmax, total).
* bf16 weights, fp32 x (panel_bf16.py): `(x [M, K] float32,)`. A pair is a row's two bf16
  in one 32-bit lane: the first is the lane shifted up 16 bits, the second the lane with
  its low 16 bits cleared, each an fp32 as it stands; two FMAs as above. No scales: the
  fold is total = total + sum.
* bf16 weights, x rounded to bf16 (rounded_bf16.py): `(xb [M, K/2] uint32,)`, a row's
  pair of inputs as bf16 in one 32-bit lane, as the weights' pairs are. `vdpbf16ps`
  multiplies the pairs (32 multiply-adds an instruction; each product of two bf16 exact
  in fp32) into the sums. The fold: total = total + sum.
* Int8 weights, x rounded to 16-bit integers (vnni.py): `(xq [blocks, M, pairs] int32, x_scale,
  x_sum [M, blocks])`. `vpdpwssd` multiplies the pairs (32 multiply-adds an instruction,
  an fp32 FMA's 16) into exact 32-bit sums, in any order. The fold:
  total = fma(float(Σ q·xq), step · x_scale, total); total = fma(low, x_sum, total).
"""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils

from .llvm_ir import BF16, I8, I32, broadcast, c_arrays, declare, fvec, index, ivec, row_pointer

LANES = 16
PANEL_VECTORS = 3  # weight vectors of 16 rows a panel: 48 weight rows
PANEL = LANES * PANEL_VECTORS
UNROLL = 4  # pairs a turn of the inner loop
PREFETCH_BLOCKS = 2  # weight blocks on that each call asks for (the next panel's, past the last block)


def block_row(context, builder, array_type, value, block, row):
    """Address of xq[block, row, 0] in a C-contiguous [blocks, M, pairs] array: a weight
    block's pairs of x, the rows of x one after another (the kernels read them in order)."""
    array = context.make_array(array_type)(context, builder, value)
    outer, inner = cgutils.unpack_tuple(builder, array.strides)[:2]
    offset = builder.add(builder.mul(block, outer), builder.mul(row, inner))
    raw = builder.gep(builder.bitcast(array.data, I8.as_pointer()), [offset])
    return builder.bitcast(raw, array.data.type)


def splat_int(builder, value):
    vector = ivec(LANES)
    value = builder.insert_element(ir.Constant(vector, ir.Undefined), value, ir.Constant(I32, 0))
    return builder.shuffle_vector(value, ir.Constant(vector, ir.Undefined), ir.Constant(ivec(LANES), None))


def block_scale(builder, scales, where):
    """16 rows' fp16 scale in a panel's scales [blocks, count, PANEL], widened to fp32:
    where = (block, count, part, n), weight vector n's scale `part` of the block."""
    block, count, part, n = where
    halves, lanes = ir.VectorType(ir.IntType(16), LANES), ir.VectorType(ir.HalfType(), LANES)
    at = builder.add(builder.mul(builder.add(builder.mul(block, index(count)), index(part)), index(PANEL)),
                     index(LANES * n))
    bits = builder.load(builder.bitcast(builder.gep(scales, [at]), halves.as_pointer()), align=2)
    return builder.fpext(builder.bitcast(bits, lanes), fvec(LANES))


def int8_step(builder, low, high):
    """An Int8 block's step, w = low + step · q, as int8.py's kernels compute it (plain IR,
    no fast-math: the same bits)."""
    return builder.fdiv(builder.fsub(high, low), ir.Constant(fvec(LANES), [255.0] * LANES))


def rounded_fold(builder, fma, block_sum, row_scales, total):
    """A row's total with an Int8 block's share on x rounded to 16-bit integers folded in:
    total = fma(float(Σ q·xq), step · x_scale, total); total = fma(low, x_sum, total), the
    same two FMAs in every kernel. block_sum: the exact Σ q·xq; row_scales: (low, step, the
    row's x_scale and x_sum broadcast)."""
    low, step, x_scale, x_sum = row_scales
    total = builder.call(fma, [builder.sitofp(block_sum, fvec(LANES)), builder.fmul(step, x_scale), total])
    return builder.call(fma, [low, x_sum, total])


class PanelBlock:
    """One call: weight block `block` of a panel against rows j … j + x_rows − 1 of x,
    folded into those rows of `totals` (row m at totals[m − t]).

    panel [pairs, ROW_BYTES · PANEL] uint8 (pair p of each row's weights, rows side by
    side), scales [blocks, SCALES, PANEL] uint16 (fp16 bit patterns), totals [rows, PANEL]
    float32; x_parts as the subclass reads them."""

    ROW_BYTES = 2  # a pair's bytes a row
    BLOCK_PAIRS = 64  # pairs of inputs a weight block
    SCALES = 2  # fp16 scales a block and row
    chains = 1  # sets of sums, alternate pairs (only integer sums may be split so)
    PANEL_DTYPE = types.uint8  # what the panel's array holds
    zero = ir.Constant(fvec(LANES), None)

    def __init__(self, context, builder, sig, args, x_rows):
        panel_t, scales_t, parts_t, _, _, _, totals_t = sig.args
        panel, scales, parts, self.block, j, t, totals = args
        self.builder, self.x_rows = builder, x_rows
        # Addressed in bytes, whatever the array holds.
        self.panel = builder.bitcast(context.make_array(panel_t)(context, builder, panel).data, I8.as_pointer())
        self.scales = context.make_array(scales_t)(context, builder, scales).data
        self.rows = [builder.add(j, index(m)) for m in range(x_rows)]
        self.totals = [row_pointer(context, builder, totals_t, totals, builder.sub(r, t))[0] for r in self.rows]
        self.read_x(context, parts_t.types, cgutils.unpack_tuple(builder, parts, len(parts_t)))
        self.fma = declare(builder, f"llvm.fma.v{LANES}f32", fvec(LANES), fvec(LANES), fvec(LANES), fvec(LANES))
        self.fetch = declare(builder, "llvm.prefetch.p0i8", ir.VoidType(), I8.as_pointer(), I32, I32, I32)
        self.sums = [[[cgutils.alloca_once_value(builder, self.zero) for _ in range(PANEL_VECTORS)]
                      for _ in range(x_rows)] for _ in range(self.chains)]

    def read_x(self, context, part_types, parts):
        raise NotImplementedError

    def pair_step(self, pair, sums):
        """Every sum += the block's pair `pair` of weights · x's pair."""
        raise NotImplementedError

    def block_scales(self, n):
        """Weight vector n's scales of the block, as `fold` takes them."""
        raise NotImplementedError

    def fold(self, scales, m, sums, total):
        """Row m's `total` of a weight vector (its block's `scales`) with the block's `sums`
        (one a chain) folded in."""
        raise NotImplementedError

    def pair_bytes(self, pair):
        """Where pair `pair` of the block starts in the panel, in bytes."""
        builder = self.builder
        at = builder.add(builder.mul(self.block, index(self.BLOCK_PAIRS)), pair)
        return builder.mul(at, index(self.ROW_BYTES * PANEL))

    def loaded(self, pair, n, lanes_type):
        """Weight vector n's bytes of pair `pair`, zero-extended to `lanes_type`."""
        builder = self.builder
        raw_type = ir.VectorType(I8, self.ROW_BYTES * LANES)
        address = builder.gep(self.panel, [builder.add(self.pair_bytes(pair), index(self.ROW_BYTES * LANES * n))])
        raw = builder.load(builder.bitcast(address, raw_type.as_pointer()), align=1)
        return builder.bitcast(builder.zext(raw, lanes_type), ivec(LANES))

    def scale(self, part, n):
        """Scale `part` of weight vector n's rows in the block, widened from fp16."""
        return block_scale(self.builder, self.scales, (self.block, self.SCALES, part, n))

    def fp32_x(self, context, part_type, part):
        self.x = [row_pointer(context, self.builder, part_type, part, r)[0] for r in self.rows]

    def fma_pairs(self, pair, halves, sums):
        """sums[m][n] += halves[n]'s first weights · x[m, 2p], then its second · x[m, 2p + 1]."""
        builder = self.builder
        first = builder.add(builder.mul(self.block, index(2 * self.BLOCK_PAIRS)), builder.mul(pair, index(2)))
        for m in range(self.x_rows):
            x_pair = [broadcast(builder, builder.load(builder.gep(self.x[m], [builder.add(first, index(i))])), LANES)
                      for i in range(2)]
            for n, (even, odd) in enumerate(halves):
                sums[m][n] = builder.call(self.fma, [even, x_pair[0], sums[m][n]])
                sums[m][n] = builder.call(self.fma, [odd, x_pair[1], sums[m][n]])

    def emit(self):
        builder = self.builder
        with cgutils.for_range(builder, index(self.BLOCK_PAIRS // UNROLL)) as loop:
            sums = [[[builder.load(s) for s in row] for row in chain] for chain in self.sums]
            first = builder.mul(loop.index, index(UNROLL))
            for u in range(UNROLL):
                self.pair_step(builder.add(first, index(u)), sums[u % self.chains])
            ahead = builder.add(self.pair_bytes(first), index(PREFETCH_BLOCKS * self.BLOCK_PAIRS * self.ROW_BYTES * PANEL))
            for line in range(0, UNROLL * self.ROW_BYTES * PANEL, 64):  # past the last panel: prefetches do not fault
                address = builder.gep(self.panel, [builder.add(ahead, index(line))])
                builder.call(self.fetch, [address, ir.Constant(I32, 0), ir.Constant(I32, 3), ir.Constant(I32, 1)])
            for chain, values in zip(self.sums, sums):
                for row, row_values in zip(chain, values):
                    for s, v in zip(row, row_values):
                        builder.store(v, s)
        scales = [self.block_scales(n) for n in range(PANEL_VECTORS)]
        for m in range(self.x_rows):
            for n, vector_scales in enumerate(scales):
                place = builder.bitcast(builder.gep(self.totals[m], [index(LANES * n)]), fvec(LANES).as_pointer())
                values = [builder.load(chain[m][n]) for chain in self.sums]
                builder.store(self.fold(vector_scales, m, values, builder.load(place, align=4)), place, align=4)


class Int8Block(PanelBlock):
    """Int8 weights: a pair is 2 bytes a row, widened to the two 16-bit halves of a lane;
    a block's scales are each row's low and high."""

    def weights(self, pair):
        return [self.loaded(pair, n, ir.VectorType(ir.IntType(16), 2 * LANES)) for n in range(PANEL_VECTORS)]

    def block_scales(self, n):
        """(low, step) of the block, w = low + step · q, computed as int8.py's kernels
        compute them (plain IR, no fast-math: the same bits)."""
        low = self.scale(0, n)
        return low, int8_step(self.builder, low, self.scale(1, n))


class Fp32Block(Int8Block):
    """Int8 weights, x in fp32 (panel_int8.py): x_parts = (x [M, K], x_sum [M, blocks])."""

    def read_x(self, context, part_types, parts):
        self.fp32_x(context, part_types[0], parts[0])
        self.x_sum = [row_pointer(context, self.builder, part_types[1], parts[1], r)[0] for r in self.rows]

    def pair_step(self, pair, sums):
        builder = self.builder
        low_half, shift = ir.Constant(ivec(LANES), [0xFFFF] * LANES), ir.Constant(ivec(LANES), [16] * LANES)
        halves = [(builder.sitofp(builder.and_(lanes, low_half), fvec(LANES)),
                   builder.sitofp(builder.lshr(lanes, shift), fvec(LANES))) for lanes in self.weights(pair)]
        self.fma_pairs(pair, halves, sums)

    def fold(self, scales, m, sums, total):
        builder = self.builder
        (low, step), (total_sum,) = scales, sums
        x_sum = broadcast(builder, builder.load(builder.gep(self.x_sum[m], [self.block])), LANES)
        return builder.call(self.fma, [low, x_sum, builder.call(self.fma, [total_sum, step, total])])


class Int16Block(Int8Block):
    """Int8 weights, x rounded to 16-bit integers (vnni.py): x_parts = (xq [blocks, M,
    pairs] int32, x_scale [M, blocks], x_sum [M, blocks])."""

    zero = ir.Constant(ivec(LANES), None)

    def __init__(self, context, builder, sig, args, x_rows):
        # One row of x has only three sums, each a chain of dependent instructions: two
        # sets, alternate pairs (integers: any order gives the same sums).
        self.chains = 2 if x_rows <= 2 else 1
        super().__init__(context, builder, sig, args, x_rows)
        self.dot = declare(builder, "llvm.x86.avx512.vpdpwssd.512", ivec(LANES), ivec(LANES), ivec(LANES), ivec(LANES))

    def read_x(self, context, part_types, parts):
        builder = self.builder
        self.xq = [block_row(context, builder, part_types[0], parts[0], self.block, r) for r in self.rows]
        self.x_scale = [row_pointer(context, builder, part_types[1], parts[1], r)[0] for r in self.rows]
        self.x_sum = [row_pointer(context, builder, part_types[2], parts[2], r)[0] for r in self.rows]

    def pair_step(self, pair, sums):
        builder = self.builder
        weights = self.weights(pair)
        for m in range(self.x_rows):
            x_pair = splat_int(builder, builder.load(builder.gep(self.xq[m], [pair])))
            for n in range(PANEL_VECTORS):
                sums[m][n] = builder.call(self.dot, [sums[m][n], weights[n], x_pair])

    def fold(self, scales, m, sums, total):
        builder = self.builder
        low, step = scales
        exact = sums[0]
        for chain in sums[1:]:
            exact = builder.add(exact, chain)
        x_scale = broadcast(builder, builder.load(builder.gep(self.x_scale[m], [self.block])), LANES)
        x_sum = broadcast(builder, builder.load(builder.gep(self.x_sum[m], [self.block])), LANES)
        return rounded_fold(builder, self.fma, exact, (low, step, x_scale, x_sum), total)


class Nf4Block(PanelBlock):
    """NF4 weights, x in fp32 (panel_nf4.py): x_parts = (x [M, K], the 16 levels)."""

    ROW_BYTES, BLOCK_PAIRS, SCALES = 1, 32, 1

    def read_x(self, context, part_types, parts):
        self.fp32_x(context, part_types[0], parts[0])
        builder = self.builder
        permute = declare(builder, "llvm.x86.avx512.permvar.sf.512", fvec(LANES), fvec(LANES), ivec(LANES))
        table = context.make_array(part_types[1])(context, builder, parts[1]).data
        levels = builder.load(builder.bitcast(table, fvec(LANES).as_pointer()), align=4)
        self.lookup = lambda codes: builder.call(permute, [levels, codes])

    def pair_step(self, pair, sums):
        builder = self.builder
        low_nibble, shift = ir.Constant(ivec(LANES), [15] * LANES), ir.Constant(ivec(LANES), [4] * LANES)
        halves = []
        for n in range(PANEL_VECTORS):
            codes = self.loaded(pair, n, ivec(LANES))
            halves.append((self.lookup(builder.and_(codes, low_nibble)), self.lookup(builder.lshr(codes, shift))))
        self.fma_pairs(pair, halves, sums)

    def block_scales(self, n):
        return self.scale(0, n)

    def fold(self, scales, m, sums, total):
        (total_sum,) = sums
        return self.builder.call(self.fma, [total_sum, scales, total])


class Bf16Block(PanelBlock):
    """bf16 weights, x in fp32 (panel_bf16.py): x_parts = (x [M, K],). A block is 64
    inputs (6 KiB of a panel, as Int8's 128)."""

    ROW_BYTES, BLOCK_PAIRS, SCALES = 4, 32, 0
    PANEL_DTYPE = types.uint16

    def read_x(self, context, part_types, parts):
        self.fp32_x(context, part_types[0], parts[0])

    def lanes(self, pair, n):
        """Weight vector n's pair `pair`: a row's two bf16 a 32-bit lane."""
        builder = self.builder
        address = builder.gep(self.panel, [builder.add(self.pair_bytes(pair), index(self.ROW_BYTES * LANES * n))])
        return builder.load(builder.bitcast(address, ivec(LANES).as_pointer()), align=4)

    def pair_step(self, pair, sums):
        builder = self.builder
        shift, high = ir.Constant(ivec(LANES), [16] * LANES), ir.Constant(ivec(LANES), [0xFFFF0000] * LANES)
        halves = []
        for n in range(PANEL_VECTORS):
            lanes = self.lanes(pair, n)
            halves.append((builder.bitcast(builder.shl(lanes, shift), fvec(LANES)),
                           builder.bitcast(builder.and_(lanes, high), fvec(LANES))))
        self.fma_pairs(pair, halves, sums)

    def block_scales(self, n):
        return None

    def fold(self, scales, m, sums, total):
        return self.builder.fadd(total, sums[0])


class Bf16DotBlock(Bf16Block):
    """bf16 weights, x rounded to bf16 (rounded_bf16.py): x_parts = (xb [M, K/2] uint32,),
    a row's pair of inputs a lane. One `vdpbf16ps` a weight vector and row of x."""

    def __init__(self, context, builder, sig, args, x_rows):
        super().__init__(context, builder, sig, args, x_rows)
        pairs = ir.VectorType(BF16, 2 * LANES)
        self.as_pairs = lambda lanes: builder.bitcast(lanes, pairs)
        self.dot = declare(builder, "llvm.x86.avx512bf16.dpbf16ps.512", fvec(LANES), fvec(LANES), pairs, pairs)

    def read_x(self, context, part_types, parts):
        self.fp32_x(context, part_types[0], parts[0])  # rows of pairs, not of floats

    def pair_step(self, pair, sums):
        builder = self.builder
        weights = [self.as_pairs(self.lanes(pair, n)) for n in range(PANEL_VECTORS)]
        at = builder.add(builder.mul(self.block, index(self.BLOCK_PAIRS)), pair)
        for m in range(self.x_rows):
            x_pair = self.as_pairs(splat_int(builder, builder.load(builder.gep(self.x[m], [at]))))
            for n in range(PANEL_VECTORS):
                sums[m][n] = builder.call(self.dot, [sums[m][n], weights[n], x_pair])


def _kind_of(parts) -> type[PanelBlock] | None:
    """Which block reads x_parts of these types, or None."""
    if not isinstance(parts, types.BaseTuple) or not c_arrays(*parts.types):
        return None
    kinds = {((types.float32, 2), (types.float32, 2)): Fp32Block, ((types.float32, 2), (types.float32, 1)): Nf4Block,
             ((types.int32, 3), (types.float32, 2), (types.float32, 2)): Int16Block,
             ((types.float32, 2),): Bf16Block, ((types.uint32, 2),): Bf16DotBlock}
    return kinds.get(tuple((a.dtype, a.ndim) for a in parts.types))


def panel_block(x_rows: int):
    """The typing of intrinsic(panel, scales, x_parts, block, j, t, totals)."""
    def block(typingctx, panel, scales, parts, b, j, t, totals):
        kind = _kind_of(parts)
        if kind is None or not c_arrays(panel, scales, totals):
            return None
        if (panel.dtype, scales.dtype, totals.dtype) != (kind.PANEL_DTYPE, types.uint16, types.float32):
            return None

        def codegen(context, builder, sig, args):
            kind(context, builder, sig, args, x_rows).emit()
            return context.get_dummy_value()
        return types.void(panel, scales, parts, types.int64, types.int64, types.int64, totals), codegen
    return block
