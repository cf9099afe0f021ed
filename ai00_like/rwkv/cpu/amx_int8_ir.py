"""The LLVM IR of AMX's int8 tile product of an Int8 panel with x rounded to 16-bit integers (amx.py).

vnni.py rounds each row of x, per 128 inputs, to 16-bit integers xq, and a block's share of
a product is step · x_scale · Σ q·xq + low · x_sum with Σ q·xq an exact 32-bit integer.
AMX multiplies bytes, not 16-bit integers, so xq is split into its high byte (signed) and
its low byte (unsigned), xq = 256 · xh + xl, and

    Σ q·xq = 256 · Σ q·xh + Σ q·xl,

`tdpbsud` and `tdpbuud` tile products (16 × 16 × 64 multiply-adds an instruction, four times
`vpdpwssd`'s vector), both exact in 32 bits. The block's integer sum is the same integer
vpdpwssd makes, and it is folded with the same two FMAs (panels_ir.rounded_fold): the
result is the same to the bit as vnni.py's kernels give on a CPU without tiles.

A tile of weights is 16 rows of 64 bytes, each row four consecutive inputs of 16 outputs:
for the tiles the Int8 panels hold a quad of inputs of each of their 48 rows side by side
(192 bytes), and weight vector n's tile is read with that stride. x's parts are held as
xq is, [blocks, rows, 128], a tile being 16 rows' 64 bytes of a block.

`panel_tiles(panel, bounds, x_parts, (first, count), totals)`: for rows first … first + count − 1 of x,
totals [16, 48] float32 += x's rounded rows · the panel [K/4, 192] uint8 with its block
bounds [blocks, 2, 48] (fp16 low and high), x_parts = (xh, xl, x_scale, x_sum). Blocks are
folded in order, a row's from its own sums: its result does not depend on the other rows.
"""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils

from .amx_ir import TILE_BYTES, TILE_ROWS, bf16_codegen, tile_config
from .llvm_ir import I8, I64, broadcast, c_arrays, declare, fvec, index, ivec, row_pointer
from .panels_ir import LANES, PANEL, PANEL_VECTORS, block_scale, block_row, int8_step, rounded_fold

INT8_BLOCK = 128  # inputs of an Int8 block (panels.INT8_BLOCK)
QUAD_BYTES = 4 * PANEL  # a panel's quad of inputs: four bytes of each of its 48 rows
BLOCK_STEPS = INT8_BLOCK // TILE_BYTES  # tile products a block, 64 inputs each
HIGH, LOW = (0, 1, 2), (3, 4, 5)  # the sums' tiles, one a weight vector, for xh and xl
X_TILE, WEIGHTS = 6, 7
SUM_ROW_BYTES = 4 * 2 * PANEL  # a row of sums: 48 of xh's, 48 of xl's, int32


class Int8TileProduct:
    """The code of one int8_panel_tiles call."""

    def __init__(self, context, builder, sig, args):
        self.builder = builder
        panel_t, bounds_t, parts_t, _, totals_t = sig.args
        panel, bounds, parts, rows, totals = args
        self.first, self.count = cgutils.unpack_tuple(builder, rows, 2)
        self.panel = builder.bitcast(context.make_array(panel_t)(context, builder, panel).data, I8.as_pointer())
        bounds_array = context.make_array(bounds_t)(context, builder, bounds)
        self.bounds, self.blocks = bounds_array.data, cgutils.unpack_tuple(builder, bounds_array.shape)[0]
        self.parts = (context, parts_t.types, cgutils.unpack_tuple(builder, parts, len(parts_t)))
        self.totals = (totals_t, totals)
        pointer, void = I8.as_pointer(), ir.VoidType()
        self.load = declare(builder, "llvm.x86.tileloadd64", void, I8, pointer, I64)
        self.store = declare(builder, "llvm.x86.tilestored64", void, I8, pointer, I64)
        self.signed_dot = declare(builder, "llvm.x86.tdpbsud", void, I8, I8, I8)
        self.unsigned_dot = declare(builder, "llvm.x86.tdpbuud", void, I8, I8, I8)
        self.zero = declare(builder, "llvm.x86.tilezero", void, I8)
        self.fma = declare(builder, f"llvm.fma.v{LANES}f32", *[fvec(LANES)] * 4)
        self.sums = builder.bitcast(cgutils.alloca_once(builder, ir.ArrayType(I8, TILE_ROWS * SUM_ROW_BYTES)), pointer)

    def tile(self, number):
        return ir.Constant(I8, number)

    def x_tile(self, part, block, step):
        """Rows first … first + 15 of x's part (0 xh, 1 xl) in the block's step, as a tile's address and stride."""
        context, part_types, parts = self.parts
        start = block_row(context, self.builder, part_types[part], parts[part], block, self.first)
        address = self.builder.gep(self.builder.bitcast(start, I8.as_pointer()), [index(TILE_BYTES * step)])
        return address, index(INT8_BLOCK)

    def block_sums(self, block):
        """The block's Σ q·xh and Σ q·xl of 16 rows into the sums' tiles, then self.sums."""
        builder = self.builder
        for t in HIGH + LOW:
            builder.call(self.zero, [self.tile(t)])
        for step in range(BLOCK_STEPS):
            quad = builder.mul(builder.add(builder.mul(block, index(BLOCK_STEPS)), index(step)), index(TILE_ROWS))
            weights = builder.gep(self.panel, [builder.mul(quad, index(QUAD_BYTES))])
            for part, (sums, dot) in enumerate(((HIGH, self.signed_dot), (LOW, self.unsigned_dot))):
                builder.call(self.load, [self.tile(X_TILE), *self.x_tile(part, block, step)])
                for n, s in enumerate(sums):
                    builder.call(self.load, [self.tile(WEIGHTS), builder.gep(weights, [index(TILE_BYTES * n)]),
                                             index(QUAD_BYTES)])
                    builder.call(dot, [self.tile(s), self.tile(X_TILE), self.tile(WEIGHTS)])
        for t in HIGH + LOW:
            builder.call(self.store, [self.tile(t), builder.gep(self.sums, [index(TILE_BYTES * t)]), index(SUM_ROW_BYTES)])

    def fold(self, block):
        """Each row's totals with the block's exact sums folded in, as vnni.py's kernels fold them."""
        builder = self.builder
        lows = [block_scale(builder, self.bounds, (block, 2, 0, n)) for n in range(PANEL_VECTORS)]
        steps = [int8_step(builder, low, block_scale(builder, self.bounds, (block, 2, 1, n))) for n, low in enumerate(lows)]
        context, part_types, parts = self.parts
        with cgutils.for_range(builder, self.count) as loop:
            r = loop.index
            x = builder.add(self.first, r)
            x_scale, x_sum = (broadcast(builder, builder.load(builder.gep(
                row_pointer(context, builder, part_types[p], parts[p], x)[0], [block])), LANES) for p in (2, 3))
            totals = row_pointer(context, builder, *self.totals, r)[0]
            row_sums = builder.bitcast(builder.gep(self.sums, [builder.mul(r, index(SUM_ROW_BYTES))]),
                                       ivec(LANES).as_pointer())
            for n in range(PANEL_VECTORS):
                high = builder.load(builder.gep(row_sums, [index(HIGH[n])]), align=4)
                low_byte = builder.load(builder.gep(row_sums, [index(LOW[n])]), align=4)
                exact = builder.add(builder.shl(high, ir.Constant(ivec(LANES), [8] * LANES)), low_byte)
                place = builder.bitcast(builder.gep(totals, [index(LANES * n)]), fvec(LANES).as_pointer())
                total = rounded_fold(builder, self.fma, exact, (lows[n], steps[n], x_scale, x_sum),
                                     builder.load(place, align=4))
                builder.store(total, place, align=4)

    def emit(self):
        builder = self.builder
        builder.call(declare(builder, "llvm.x86.ldtilecfg", ir.VoidType(), I8.as_pointer()), [tile_config(builder)])
        with cgutils.for_range(builder, self.blocks) as loop:
            self.block_sums(loop.index)
            self.fold(loop.index)
        builder.call(declare(builder, "llvm.x86.tilerelease", ir.VoidType()), [])


def _int8_codegen(context, builder, sig, args):
    Int8TileProduct(context, builder, sig, args).emit()
    return context.get_dummy_value()


BF16_PARTS = (types.uint16, types.uint16, types.uint32, types.float32)  # panel, scales, (xb,), totals
INT8_PARTS = (types.uint8, types.uint16, types.int8, types.uint8, types.float32, types.float32, types.float32)


def panel_tiles(typingctx, panel, scales, x_parts, rows, totals):
    """The typing of intrinsic(panel, scales, x_parts, (first, count), totals) for either
    kind of panel: bf16 (amx_ir.py) with x_parts = (xb,), or Int8 with (xh, xl, x_scale,
    x_sum) as above."""
    if not isinstance(x_parts, types.BaseTuple) or not c_arrays(panel, scales, totals, *x_parts):
        return None
    kinds = (panel.dtype, scales.dtype, *(p.dtype for p in x_parts), totals.dtype)
    codegen = {BF16_PARTS: bf16_codegen, INT8_PARTS: _int8_codegen}.get(kinds)
    if codegen is None:
        return None
    return types.void(panel, scales, x_parts, types.UniTuple(types.int64, 2), totals), codegen
