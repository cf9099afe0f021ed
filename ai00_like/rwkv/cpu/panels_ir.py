"""The LLVM IR of the products with Int8 weights in panels (panels.py), AVX-512.

Lanes run along 16 weight rows (outputs): lane o of a weight vector holds weights 2p and
2p + 1 of row o, and x's pair p is broadcast. The weights are stored that way (a panel of
48 rows, each pair of a row's bytes beside the next row's), as bytes, and widened to 16
bits as they are loaded. Lanes along the outputs need no sum across a vector's lanes, so
one kernel serves every row count, from a decoding step's one row to a prompt's chunk. A
call multiplies a block of `x_rows` rows of x (8, 4, 2 or 1) by the panel's 3 weight
vectors over one weight block of 128 inputs; each block's sums start from zero and are
folded into the rows' totals block after block, in order, so a row's result is the same
whichever block of rows took it. (Taking several weight blocks at once for one row of x,
for more chains of sums side by side, read the weights as several streams: a 128 MiB head
took 1.2–2× as long.) Each call asks for the lines of the weights two blocks on
(`PREFETCH_AHEAD`): a block of weights feeds 8 rows of x for about 0.7 µs, long enough
for the prefetchers to lose the stream (on two Zen 5 cores, 16 rows of x against 1.5B's
8,192 × 2,048 matrices: 2.5 → 1.4 ms; its 65,536-row head 23 → 13 ms).

Two kinds of x, told apart by the types of `x_parts`:

* fp32 x (panel_int8.py, exact): `(x [M, K] float32, x_sum [M, blocks])`. A pair's two
  weights are split out of the widened lane (the low and high 16 bits), made float and
  multiplied in turn with x's two inputs (two fp32 FMAs, in the same order for every row).
  The fold: total = fma(sum, step, total); total = fma(low, Σx, total).
* x rounded to 16-bit integers (vnni.py): `(xq [blocks, M, pairs] int32, x_scale,
  x_sum [M, blocks])`. `vpdpwssd` multiplies the pairs (32 multiply-adds an instruction,
  an fp32 FMA's 16) into exact 32-bit sums, in any order. The fold:
  total = fma(float(Σ q·xq), step · x_scale, total); total = fma(low, x_sum, total).
"""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils

from .llvm_ir import I8, I32, broadcast, c_arrays, declare, fvec, index, ivec, row_pointer

LANES = 16
PANEL_VECTORS = 3  # weight vectors of 16 rows a panel: 48 weight rows
PANEL = LANES * PANEL_VECTORS
PAIR_BYTES = 2 * PANEL  # a pair of inputs of every row of a panel
UNROLL = 4  # pairs a turn of the inner loop
PREFETCH_AHEAD = 2 * 64 * PAIR_BYTES  # bytes: two weight blocks on (the next panel's, past the last block)


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


class PanelBlock:
    """One call: weight block `block` of a panel against rows j … j + x_rows − 1 of x,
    folded into those rows of `totals` (row m at totals[m − t]).

    panel [pairs, PAIR_BYTES] uint8 (pair p of each row's weights, rows side by side),
    bounds [blocks, 2, PANEL] uint16 (each block's low, then high, as fp16 bit patterns),
    totals [rows, PANEL] float32; x_parts as the subclass reads them."""

    chains = 1  # sets of sums, alternate pairs (only integer sums may be split so)
    zero = ir.Constant(fvec(LANES), None)

    def __init__(self, context, builder, sig, args, x_rows, block_pairs):
        panel_t, bounds_t, parts_t, _, _, _, totals_t = sig.args
        panel, bounds, parts, self.block, j, t, totals = args
        self.builder, self.x_rows, self.block_pairs = builder, x_rows, block_pairs
        self.panel = context.make_array(panel_t)(context, builder, panel).data
        self.bounds = context.make_array(bounds_t)(context, builder, bounds).data
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

    def fold(self, low, step, m, sums, total):
        """Row m's `total` of a weight vector (its `low` and `step`) with the block's `sums`
        (one a chain) folded in."""
        raise NotImplementedError

    def pair_bytes(self, pair):
        """Where pair `pair` of the block starts in the panel, in bytes."""
        builder = self.builder
        return builder.mul(builder.add(builder.mul(self.block, index(self.block_pairs)), pair), index(PAIR_BYTES))

    def weights(self, pair):
        """The panel's 3 weight vectors of pair `pair` of the block, widened to 16 bits: lane
        o holds row o's two weights, the first in its low half."""
        builder = self.builder
        bytes32, halves = ir.VectorType(I8, 2 * LANES), ir.VectorType(ir.IntType(16), 2 * LANES)
        at = self.pair_bytes(pair)
        vectors = []
        for n in range(PANEL_VECTORS):
            address = builder.gep(self.panel, [builder.add(at, index(2 * LANES * n))])
            raw = builder.load(builder.bitcast(address, bytes32.as_pointer()), align=1)
            vectors.append(builder.bitcast(builder.zext(raw, halves), ivec(LANES)))
        return vectors

    def low_step(self, n):
        """Weight vector n's (low, step) of the block, w = low + step · q, computed as
        int8.py's kernels compute them (plain IR, no fast-math: the same bits)."""
        builder = self.builder
        halves, lanes = ir.VectorType(ir.IntType(16), LANES), ir.VectorType(ir.HalfType(), LANES)

        def widened(part):
            at = builder.add(builder.mul(builder.add(builder.mul(self.block, index(2)), index(part)), index(PANEL)),
                             index(LANES * n))
            bits = builder.load(builder.bitcast(builder.gep(self.bounds, [at]), halves.as_pointer()), align=2)
            return builder.fpext(builder.bitcast(bits, lanes), fvec(LANES))
        low, high = widened(0), widened(1)
        return low, builder.fdiv(builder.fsub(high, low), ir.Constant(fvec(LANES), [255.0] * LANES))

    def emit(self):
        builder = self.builder
        with cgutils.for_range(builder, index(self.block_pairs // UNROLL)) as loop:
            sums = [[[builder.load(s) for s in row] for row in chain] for chain in self.sums]
            first = builder.mul(loop.index, index(UNROLL))
            for u in range(UNROLL):
                self.pair_step(builder.add(first, index(u)), sums[u % self.chains])
            ahead = builder.add(self.pair_bytes(first), index(PREFETCH_AHEAD))
            for line in range(0, UNROLL * PAIR_BYTES, 64):  # past the last panel: prefetches do not fault
                address = builder.gep(self.panel, [builder.add(ahead, index(line))])
                builder.call(self.fetch, [address, ir.Constant(I32, 0), ir.Constant(I32, 3), ir.Constant(I32, 1)])
            for chain, values in zip(self.sums, sums):
                for row, row_values in zip(chain, values):
                    for s, v in zip(row, row_values):
                        builder.store(v, s)
        lows_steps = [self.low_step(n) for n in range(PANEL_VECTORS)]
        for m in range(self.x_rows):
            for n, (low, step) in enumerate(lows_steps):
                place = builder.bitcast(builder.gep(self.totals[m], [index(LANES * n)]), fvec(LANES).as_pointer())
                values = [builder.load(chain[m][n]) for chain in self.sums]
                builder.store(self.fold(low, step, m, values, builder.load(place, align=4)), place, align=4)


class Fp32Block(PanelBlock):
    """x in fp32 (panel_int8.py): x_parts = (x [M, K], x_sum [M, blocks])."""

    def read_x(self, context, part_types, parts):
        builder = self.builder
        self.x = [row_pointer(context, builder, part_types[0], parts[0], r)[0] for r in self.rows]
        self.x_sum = [row_pointer(context, builder, part_types[1], parts[1], r)[0] for r in self.rows]

    def pair_step(self, pair, sums):
        builder = self.builder
        low_half = ir.Constant(ivec(LANES), [0xFFFF] * LANES)
        halves = []
        for lanes in self.weights(pair):
            halves.append((builder.sitofp(builder.and_(lanes, low_half), fvec(LANES)),
                           builder.sitofp(builder.lshr(lanes, ir.Constant(ivec(LANES), [16] * LANES)), fvec(LANES))))
        first = builder.add(builder.mul(self.block, index(2 * self.block_pairs)), builder.mul(pair, index(2)))
        for m in range(self.x_rows):
            x_pair = [broadcast(builder, builder.load(builder.gep(self.x[m], [builder.add(first, index(i))])), LANES)
                      for i in range(2)]
            for n, (even, odd) in enumerate(halves):
                sums[m][n] = builder.call(self.fma, [even, x_pair[0], sums[m][n]])
                sums[m][n] = builder.call(self.fma, [odd, x_pair[1], sums[m][n]])

    def fold(self, low, step, m, sums, total):
        builder = self.builder
        (total_sum,) = sums
        x_sum = broadcast(builder, builder.load(builder.gep(self.x_sum[m], [self.block])), LANES)
        return builder.call(self.fma, [low, x_sum, builder.call(self.fma, [total_sum, step, total])])


class Int16Block(PanelBlock):
    """x rounded to 16-bit integers (vnni.py): x_parts = (xq [blocks, M, pairs] int32,
    x_scale [M, blocks], x_sum [M, blocks])."""

    zero = ir.Constant(ivec(LANES), None)

    def __init__(self, context, builder, sig, args, x_rows, block_pairs):
        # One row of x has only three sums, each a chain of dependent instructions: two
        # sets, alternate pairs (integers: any order gives the same sums).
        self.chains = 2 if x_rows <= 2 else 1
        super().__init__(context, builder, sig, args, x_rows, block_pairs)
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

    def fold(self, low, step, m, sums, total):
        builder = self.builder
        exact = sums[0]
        for chain in sums[1:]:
            exact = builder.add(exact, chain)
        x_scale = broadcast(builder, builder.load(builder.gep(self.x_scale[m], [self.block])), LANES)
        x_sum = broadcast(builder, builder.load(builder.gep(self.x_sum[m], [self.block])), LANES)
        total = builder.call(self.fma, [builder.sitofp(exact, fvec(LANES)), builder.fmul(step, x_scale), total])
        return builder.call(self.fma, [low, x_sum, total])


def _kind_of(parts) -> type[PanelBlock] | None:
    """Which block reads x_parts of these types, or None."""
    if not isinstance(parts, types.BaseTuple) or not c_arrays(*parts.types):
        return None
    dtypes = tuple(a.dtype for a in parts.types)
    if dtypes == (types.float32, types.float32):
        return Fp32Block
    if dtypes == (types.int32, types.float32, types.float32):
        return Int16Block
    return None


def panel_block(x_rows: int, block_pairs: int):
    """The typing of intrinsic(panel, bounds, x_parts, block, j, t, totals)."""
    def block(typingctx, panel, bounds, parts, first, j, t, totals):
        kind = _kind_of(parts)
        if kind is None or not c_arrays(panel, bounds, totals):
            return None
        if (panel.dtype, bounds.dtype, totals.dtype) != (types.uint8, types.uint16, types.float32):
            return None

        def codegen(context, builder, sig, args):
            kind(context, builder, sig, args, x_rows, block_pairs).emit()
            return context.get_dummy_value()
        return types.void(panel, bounds, parts, types.int64, types.int64, types.int64, totals), codegen
    return block

