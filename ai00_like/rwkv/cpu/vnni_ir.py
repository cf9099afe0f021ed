"""The LLVM IR of the rounded-activation products (vnni.py), AVX-512 VNNI.

`vpdpwssd` multiplies 16-bit integers in pairs and adds each lane's two products to a
32-bit sum: 32 multiply-adds an instruction against an fp32 FMA's 16, and a Zen 5 core
issues about as many of them a cycle. Its lanes here run along 16 weight rows (outputs):
lane o of a weight vector holds weights 2p and 2p + 1 of row o, and the x vector is x's
pair p broadcast. The weights are stored that way (vnni.RoundedInt8: a panel of 48 rows,
each pair of a row's bytes beside the next row's), as bytes, and widened to 16 bits as
they are loaded. A block of `x_rows` rows of x (8, 4, 2 or 1) by `PANEL_VECTORS` weight
vectors keeps its integer sums in registers (8 × 3: 24 sums of 32 registers; the float
totals stay in memory).

Lanes along the outputs need no sum across a vector's lanes, which is what held the
earlier kernel for a few rows of x (lanes along the inputs) to half the instructions'
rate; so one kernel serves every row count, from a decoding step's one row to a prompt's
chunk, and nothing is packed at the product's time.

Each weight block's integer sum is exact, so a row's result does not depend on the order
of the pairs, nor on which other rows shared the call. At the block's end every register
block folds it into the row's float total the same way, in the same order:

    total = fma(float(Σ q·xq), step · x_scale, total);  total = fma(low, x_sum, total)
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


class Int16Block:
    """One call: weight block `block` of a panel against rows j … j + x_rows − 1 of x,
    folded into those rows of `totals` (row m of them at totals[m − t]).

    panel [pairs, PAIR_BYTES] uint8 (pair p of each row's weights, rows side by side),
    bounds [blocks, 2, PANEL] uint16 (each block's low, then high, as fp16 bit patterns),
    xq [blocks, M, block pairs] int32 (x's pairs as int16), x_scale and x_sum [M, blocks]
    float32, totals [rows, PANEL] float32."""

    def __init__(self, context, builder, sig, args, x_rows, block_pairs):
        panel_t, bounds_t, xq_t, scale_t, xsum_t, _, _, _, totals_t = sig.args
        panel, bounds, xq, x_scale, x_sum, self.block, j, t, totals = args
        self.builder, self.x_rows, self.block_pairs = builder, x_rows, block_pairs
        self.panel = context.make_array(panel_t)(context, builder, panel).data
        self.bounds = context.make_array(bounds_t)(context, builder, bounds).data
        rows = [builder.add(j, index(m)) for m in range(x_rows)]
        self.xq = [block_row(context, builder, xq_t, xq, self.block, r) for r in rows]
        self.x_scale = [row_pointer(context, builder, scale_t, x_scale, r)[0] for r in rows]
        self.x_sum = [row_pointer(context, builder, xsum_t, x_sum, r)[0] for r in rows]
        self.totals = [row_pointer(context, builder, totals_t, totals, builder.sub(r, t))[0] for r in rows]
        self.dot = declare(builder, "llvm.x86.avx512.vpdpwssd.512", ivec(LANES), ivec(LANES), ivec(LANES), ivec(LANES))
        self.fma = declare(builder, f"llvm.fma.v{LANES}f32", fvec(LANES), fvec(LANES), fvec(LANES), fvec(LANES))
        # One row of x has only three sums, each a chain of dependent instructions: two
        # sets, alternate pairs (integers: any order gives the same sums).
        self.chains = 2 if x_rows <= 2 else 1
        self.sums = [[[cgutils.alloca_once_value(builder, ir.Constant(ivec(LANES), None)) for _ in range(PANEL_VECTORS)]
                      for _ in range(x_rows)] for _ in range(self.chains)]

    def weights(self, pair):
        """The panel's 3 weight vectors of pair `pair` of the block, widened to 16 bits."""
        builder = self.builder
        bytes32, halves = ir.VectorType(I8, 2 * LANES), ir.VectorType(ir.IntType(16), 2 * LANES)
        at = builder.mul(builder.add(builder.mul(self.block, index(self.block_pairs)), pair), index(PAIR_BYTES))
        vectors = []
        for n in range(PANEL_VECTORS):
            address = builder.gep(self.panel, [builder.add(at, index(2 * LANES * n))])
            raw = builder.load(builder.bitcast(address, bytes32.as_pointer()), align=1)
            vectors.append(builder.bitcast(builder.zext(raw, halves), ivec(LANES)))
        return vectors

    def pair_step(self, pair, sums):
        """Every sum += weight vector n of the block's pair `pair` · x's pair broadcast."""
        builder = self.builder
        weights = self.weights(pair)
        for m in range(self.x_rows):
            x_pair = splat_int(builder, builder.load(builder.gep(self.xq[m], [pair])))
            for n in range(PANEL_VECTORS):
                sums[m][n] = builder.call(self.dot, [sums[m][n], weights[n], x_pair])

    def fold(self):
        builder, block = self.builder, self.block
        lows, steps = zip(*(self.low_step(n) for n in range(PANEL_VECTORS)))
        for m in range(self.x_rows):
            x_scale = broadcast(builder, builder.load(builder.gep(self.x_scale[m], [block])), LANES)
            x_sum = broadcast(builder, builder.load(builder.gep(self.x_sum[m], [block])), LANES)
            for n in range(PANEL_VECTORS):
                place = builder.bitcast(builder.gep(self.totals[m], [index(LANES * n)]), fvec(LANES).as_pointer())
                exact = builder.load(self.sums[0][m][n])
                for chain in self.sums[1:]:
                    exact = builder.add(exact, builder.load(chain[m][n]))
                exact = builder.sitofp(exact, fvec(LANES))
                total = builder.call(self.fma, [exact, builder.fmul(steps[n], x_scale), builder.load(place, align=4)])
                builder.store(builder.call(self.fma, [lows[n], x_sum, total]), place, align=4)

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
            for u in range(UNROLL):
                self.pair_step(builder.add(builder.mul(loop.index, index(UNROLL)), index(u)), sums[u % self.chains])
            for chain, values in zip(self.sums, sums):
                for row, row_values in zip(chain, values):
                    for s, v in zip(row, row_values):
                        builder.store(v, s)
        self.fold()


def int16_block(x_rows: int, block_pairs: int):
    """The typing of intrinsic(panel, bounds, xq, x_scale, x_sum, block, j, t, totals)."""
    def codegen(context, builder, sig, args):
        Int16Block(context, builder, sig, args, x_rows, block_pairs).emit()
        return context.get_dummy_value()

    def block(typingctx, panel, bounds, xq, x_scale, x_sum, b, j, t, totals):
        arrays = (panel, bounds, xq, x_scale, x_sum, totals)
        if not c_arrays(*arrays):
            return None
        if tuple(a.dtype for a in arrays) != (types.uint8, types.uint16, types.int32, *[types.float32] * 3):
            return None
        return types.void(panel, bounds, xq, x_scale, x_sum, types.int64, types.int64, types.int64, totals), codegen
    return block
