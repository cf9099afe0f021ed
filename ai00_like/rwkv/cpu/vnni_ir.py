"""The LLVM IR of the rounded-activation products (vnni.py), AVX-512 VNNI.

`vpdpwssd` multiplies 16-bit integers in pairs and adds each lane's two products to a
32-bit sum: 32 multiply-adds an instruction against an fp32 FMA's 16, and a Zen 5 core
issues about as many of them a cycle. Its lanes here run along 16 weight rows (outputs):
lane o of a weight vector holds weights 2p and 2p + 1 of row o (the panel vnni.py packs),
and the x vector is x's pair p broadcast. A block of `X_ROWS` rows of x by `PANEL_VECTORS`
weight vectors keeps its integer sums in registers
(8 × 3: 24 sums of 32 registers; the float totals stay in memory). That is the panel kernel, for many rows of x.

For a few rows of x, packing a panel would cost more than the product: the row kernel's
lanes run along the inputs instead (32 bytes of a weight row widened to 16-bit, against
32 inputs of x), and each block's 16 lane sums are added up at its end: for 5 rows of x
or more four weight rows' at once (`lane_sums`), folded in a vector of four; for fewer one
weight row at a time (vnni.ONE_ROW_AT_A_TIME).

Each weight block's integer sum is exact, so a row's result does not depend on the order
of the pairs, nor on which kernel or which other rows shared the call. At the block's end
both kernels fold it into the row's float total the same way, in the same order:

    total = fma(float(Σ q·xq), step · x_scale, total);  total = fma(low, x_sum, total)

with (low, step) from `low_step_ir`, which both read.
"""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils

from .llvm_ir import F32, I8, I32, INT8_BLOCK, broadcast, c_arrays, declare, fvec, index, ivec, row_pointer, widen_half

LANES = 16
PANEL_VECTORS = 3  # weight vectors of 16 rows a panel: 48 weight rows
PANEL = LANES * PANEL_VECTORS
X_ROWS = 8  # rows of x a register block
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
    """One call: weight block `block` of a whole panel against rows j … j + x_rows − 1 of x,
    folded into those rows of `totals`.

    panel [pairs, PANEL] int32 (weights 2p, 2p + 1 of each row as int16), steps and lows
    [blocks, PANEL] float32, xq [blocks, M, block pairs] int32 (x's pairs as int16), x_scale and x_sum
    [M, blocks] float32, totals [M, PANEL] float32. A task's blocks go round all its rows of
    x before the next block, so the block's 12 KiB of panel stay in L1: with the whole
    panel swept for each register block of rows, its loads from L2 held the kernel to a
    third of the instructions' rate."""

    def __init__(self, context, builder, sig, args, x_rows, block_pairs):
        panel_t, steps_t, lows_t, xq_t, scale_t, xsum_t, _, _, totals_t = sig.args
        panel, steps, lows, xq, x_scale, x_sum, self.block, j, totals = args
        self.builder, self.x_rows, self.block_pairs = builder, x_rows, block_pairs
        data = lambda t, v: context.make_array(t)(context, builder, v).data  # noqa: E731
        self.panel, self.steps, self.lows = (data(t, v) for t, v in ((panel_t, panel), (steps_t, steps), (lows_t, lows)))
        rows = [builder.add(j, index(m)) for m in range(x_rows)]
        self.xq = [block_row(context, builder, xq_t, xq, self.block, r) for r in rows]
        self.x_scale = [row_pointer(context, builder, scale_t, x_scale, r)[0] for r in rows]
        self.x_sum = [row_pointer(context, builder, xsum_t, x_sum, r)[0] for r in rows]
        self.totals = [row_pointer(context, builder, totals_t, totals, r)[0] for r in rows]
        self.dot = declare(builder, "llvm.x86.avx512.vpdpwssd.512", ivec(LANES), ivec(LANES), ivec(LANES), ivec(LANES))
        self.fma = declare(builder, f"llvm.fma.v{LANES}f32", fvec(LANES), fvec(LANES), fvec(LANES), fvec(LANES))
        self.sums = [[cgutils.alloca_once_value(builder, ir.Constant(ivec(LANES), None)) for _ in range(PANEL_VECTORS)]
                     for _ in range(x_rows)]

    def vector_at(self, base, element, offset):
        builder = self.builder
        address = builder.gep(base, [offset])
        return builder.load(builder.bitcast(address, ir.VectorType(element, LANES).as_pointer()), align=4)

    def pair_step(self, pair, sums):
        """Every sum += weight vector n of the block's pair `pair` · x's pair broadcast."""
        builder = self.builder
        at = builder.mul(builder.add(builder.mul(self.block, index(self.block_pairs)), pair), index(PANEL))
        weights = [self.vector_at(self.panel, I32, builder.add(at, index(LANES * n))) for n in range(PANEL_VECTORS)]
        for m in range(self.x_rows):
            x_pair = splat_int(builder, builder.load(builder.gep(self.xq[m], [pair])))
            for n in range(PANEL_VECTORS):
                sums[m][n] = builder.call(self.dot, [sums[m][n], weights[n], x_pair])

    def fold(self):
        builder, block = self.builder, self.block
        at = builder.mul(block, index(PANEL))
        steps = [self.vector_at(self.steps, F32, builder.add(at, index(LANES * n))) for n in range(PANEL_VECTORS)]
        lows = [self.vector_at(self.lows, F32, builder.add(at, index(LANES * n))) for n in range(PANEL_VECTORS)]
        for m in range(self.x_rows):
            x_scale = broadcast(builder, builder.load(builder.gep(self.x_scale[m], [block])), LANES)
            x_sum = broadcast(builder, builder.load(builder.gep(self.x_sum[m], [block])), LANES)
            for n in range(PANEL_VECTORS):
                place = builder.bitcast(builder.gep(self.totals[m], [index(LANES * n)]), fvec(LANES).as_pointer())
                exact = builder.sitofp(builder.load(self.sums[m][n]), fvec(LANES))
                total = builder.call(self.fma, [exact, builder.fmul(steps[n], x_scale), builder.load(place, align=4)])
                builder.store(builder.call(self.fma, [lows[n], x_sum, total]), place, align=4)

    def emit(self):
        builder = self.builder
        with cgutils.for_range(builder, index(self.block_pairs // UNROLL)) as loop:
            sums = [[builder.load(s) for s in row] for row in self.sums]
            for u in range(UNROLL):
                self.pair_step(builder.add(builder.mul(loop.index, index(UNROLL)), index(u)), sums)
            for row, values in zip(self.sums, sums):
                for s, v in zip(row, values):
                    builder.store(v, s)
        self.fold()


def int16_block(x_rows: int, block_pairs: int):
    """The typing of intrinsic(panel, steps, lows, xq, x_scale, x_sum, block, j, totals)."""
    def codegen(context, builder, sig, args):
        Int16Block(context, builder, sig, args, x_rows, block_pairs).emit()
        return context.get_dummy_value()

    def block(typingctx, panel, steps, lows, xq, x_scale, x_sum, b, j, totals):
        arrays = (panel, steps, lows, xq, x_scale, x_sum, totals)
        if not c_arrays(*arrays):
            return None
        if tuple(a.dtype for a in arrays) != (types.int32, *[types.float32] * 2, types.int32, *[types.float32] * 3):
            return None
        return types.void(panel, steps, lows, xq, x_scale, x_sum, types.int64, types.int64, totals), codegen
    return block


def low_step_ir(builder, limits, block):
    """Int8 block `block` of a row whose fp16 bounds start at `limits`: (low, step), w = low +
    step · q. Plain IR, no fast-math: every kernel that reads it gets the same bits."""
    two_b = builder.mul(block, index(2))
    low = widen_half(builder, limits, two_b)
    high = widen_half(builder, limits, builder.add(two_b, index(1)))
    return low, builder.fdiv(builder.fsub(high, low), ir.Constant(F32, 255.0))


def low_step(typingctx, bounds, row, block):
    """intrinsic(bounds, row, block) → (low, step) of an Int8 matrix's block."""
    if not (c_arrays(bounds) and bounds.dtype == types.uint16):
        return None

    def codegen(context, builder, sig, args):
        limits, _ = row_pointer(context, builder, sig.args[0], args[0], args[1])
        low, step = low_step_ir(builder, limits, args[2])
        return context.make_tuple(builder, sig.return_type, [low, step])
    return types.UniTuple(types.float32, 2)(bounds, types.int64, types.int64), codegen


ROW_CHAINS = 4  # integer sums a row kernel's call goes round (see llvm_ir.CHAINS)


def lane_sums(builder, vectors):
    """The lane sums of 1 or 4 <16 x i32> vectors as <n x i32>. Four at once in a tree of
    shuffles and adds (15 adds for the four, against 4 steps each apart)."""
    if len(vectors) == 1:
        reduce = declare(builder, "llvm.vector.reduce.add.v16i32", I32, ivec(LANES))
        total = builder.call(reduce, [vectors[0]])
        return builder.insert_element(ir.Constant(ivec(1), None), total, ir.Constant(I32, 0))

    def halves(a, b, width, parts):
        """Lanes of each `parts`-long run of a and b: first halves + second halves."""
        half = parts // 2
        firsts = [run + k for run in range(0, width, parts) for k in range(half)]
        seconds = [run + half + k for run in range(0, width, parts) for k in range(half)]
        low = builder.shuffle_vector(a, b, ir.Constant(ivec(len(firsts)), firsts))
        high = builder.shuffle_vector(a, b, ir.Constant(ivec(len(seconds)), seconds))
        return builder.add(low, high)

    a, b, c, d = vectors
    ab, cd = halves(a, b, 2 * LANES, LANES), halves(c, d, 2 * LANES, LANES)  # 8 partial sums each
    abcd = halves(ab, cd, 2 * LANES, LANES // 2)  # 4 each
    eight = halves(abcd, ir.Constant(ivec(LANES), None), LANES, 4)  # 2 each
    return halves(eight, ir.Constant(ivec(8), None), 8, 2)  # the four sums


def int16_rows_ir(context, builder, sig, args, j, x_rows, weight_rows):
    """out[j + m, i + a] for the call's weight rows and rows j … j + x_rows − 1 of x."""
    q_t, bounds_t, xq_t, scale_t, xsum_t, _, out_t = sig.args
    q, bounds, xq, x_scale, x_sum, i, out = args
    vector, folded = ivec(LANES), ir.VectorType(F32, weight_rows)
    fma = declare(builder, f"llvm.fma.v{weight_rows}f32", folded, folded, folded, folded)
    dot = declare(builder, "llvm.x86.avx512.vpdpwssd.512", vector, vector, vector, vector)
    weight_rows_at = [builder.add(i, index(a)) for a in range(weight_rows)]
    q_rows = [row_pointer(context, builder, q_t, q, w)[0] for w in weight_rows_at]
    _, (_, cols) = row_pointer(context, builder, q_t, q, i)
    limits = [row_pointer(context, builder, bounds_t, bounds, w)[0] for w in weight_rows_at]
    rows = [builder.add(j, index(m)) for m in range(x_rows)]
    scales = [row_pointer(context, builder, scale_t, x_scale, r)[0] for r in rows]
    sums = [row_pointer(context, builder, xsum_t, x_sum, r)[0] for r in rows]
    totals = [cgutils.alloca_once_value(builder, ir.Constant(folded, None)) for _ in rows]
    chains = max(1, ROW_CHAINS // (x_rows * weight_rows))
    bytes32, halves = ir.VectorType(I8, LANES * 2), ir.VectorType(ir.IntType(16), LANES * 2)

    def lanes(values):
        packed = ir.Constant(folded, None)
        for a, value in enumerate(values):
            packed = builder.insert_element(packed, value, ir.Constant(I32, a))
        return packed

    def spread(value):
        return builder.shuffle_vector(lanes([value]), ir.Constant(folded, None), ir.Constant(ivec(weight_rows), None))

    with cgutils.for_range(builder, builder.udiv(cols, index(INT8_BLOCK))) as loop:
        start = builder.mul(loop.index, index(INT8_BLOCK))
        acc = [[[ir.Constant(vector, None)] * chains for _ in rows] for _ in q_rows]
        xs = [builder.bitcast(block_row(context, builder, xq_t, xq, loop.index, r), vector.as_pointer()) for r in rows]
        for part in range(INT8_BLOCK // (2 * LANES)):
            at = builder.add(start, index(2 * LANES * part))
            x_parts = [builder.load(builder.gep(x_row, [index(part)]), align=4) for x_row in xs]
            for a, q_row in enumerate(q_rows):
                raw = builder.load(builder.bitcast(builder.gep(q_row, [at]), bytes32.as_pointer()), align=1)
                weights = builder.bitcast(builder.zext(raw, halves), vector)
                for m, x_part in enumerate(x_parts):
                    chain = acc[a][m]
                    chain[part % chains] = builder.call(dot, [chain[part % chains], weights, x_part])
        bounds_of = [low_step_ir(builder, limit, loop.index) for limit in limits]
        low, step = lanes([b[0] for b in bounds_of]), lanes([b[1] for b in bounds_of])
        for m in range(x_rows):
            exact = []
            for a in range(weight_rows):
                chain = acc[a][m]
                total = chain[0]
                for extra in chain[1:]:
                    total = builder.add(total, extra)  # integers: any order gives the same sum
                exact.append(total)
            exact = builder.sitofp(lane_sums(builder, exact), folded)
            scale = spread(builder.load(builder.gep(scales[m], [loop.index])))
            total = builder.call(fma, [exact, builder.fmul(step, scale), builder.load(totals[m])])
            total = builder.call(fma, [low, spread(builder.load(builder.gep(sums[m], [loop.index]))), total])
            builder.store(total, totals[m])
    out_array = context.make_array(out_t)(context, builder, out)
    for m, r in enumerate(rows):
        values = builder.load(totals[m])
        for a, w in enumerate(weight_rows_at):
            target = cgutils.get_item_pointer(context, builder, out_t, out_array, [r, w])
            builder.store(builder.extract_element(values, ir.Constant(I32, a)), target)


def int16_rows(weight_rows: int):
    """The typing of intrinsic(q, bounds, xq, x_scale, x_sum, i, out): out[:, i + a] for
    weight rows i … i + weight_rows − 1 (1 or 4) of an Int8 matrix and every row of x (xq
    [blocks, M, block pairs] int32 pairs), 4 rows of x a time and then the rest."""
    def codegen(context, builder, sig, args):
        xq = context.make_array(sig.args[2])(context, builder, args[2])
        rows = cgutils.unpack_tuple(builder, xq.shape)[1]
        fours = builder.udiv(rows, index(4))
        with cgutils.for_range(builder, fours) as loop:
            int16_rows_ir(context, builder, sig, args, builder.mul(loop.index, index(4)), 4, weight_rows)
        rest, j = builder.urem(rows, index(4)), builder.mul(fours, index(4))
        for x_rows in (1, 2, 3):
            with builder.if_then(builder.icmp_unsigned("==", rest, index(x_rows))):
                int16_rows_ir(context, builder, sig, args, j, x_rows, weight_rows)
        return context.get_dummy_value()

    def rows(typingctx, q, bounds, xq, x_scale, x_sum, i, out):
        arrays = (q, bounds, xq, x_scale, x_sum, out)
        if not c_arrays(*arrays):
            return None
        if tuple(a.dtype for a in arrays) != (types.uint8, types.uint16, types.int32, *[types.float32] * 3):
            return None
        return types.void(q, bounds, xq, x_scale, x_sum, types.int64, out), codegen
    return rows
