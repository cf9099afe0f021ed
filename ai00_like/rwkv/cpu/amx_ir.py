"""The LLVM IR of AMX's bf16 tile product of a panel (amx.py).

AMX holds eight tiles of 16 rows of 64 bytes. `tdpbf16ps` multiplies a tile of x (16 rows
of 16 pairs of bf16) by a tile of weights (16 pairs, each of 16 outputs' two bf16) into a
tile of 16 × 16 fp32 sums: 8,192 multiply-adds an instruction, an fp32 FMA's 16 times 32.
A bf16 panel (panels.py) holds pair p of its 48 rows side by side, 192 bytes: weight vector
n's 16 rows of 16 pairs are then a tile read with a stride of 192 bytes, as the panels are
stored. Rows of x are rounded to bf16 pairs as vdpbf16ps takes them (bf16_rounding.py).

`panel_tiles(panel, scales, (xb,), (first, count), sums)`: sums [16, 48] float32 = rows
first … first + 15 of xb [rows, K/2] uint32 · the panel [K/2, 96] uint16's weights (no
scales; the signature is amx_int8_ir's, whose Int8 panels have them). Each tile's sums run over K in
order, 16 pairs a step, whatever the other rows of the tile hold: a row's result does not
depend on its batch or its prompt's chunking.
"""

from __future__ import annotations

from llvmlite import ir
from numba.core import cgutils

from .llvm_ir import I8, I64, declare, index

TILE_ROWS = 16  # rows of x, and of sums, a tile holds
TILE_BYTES = 64  # a tile row: 16 pairs of bf16, or 16 fp32 sums
PANEL_VECTORS = 3  # panels.PANEL's 48 rows as three tiles of 16 outputs
PAIR_BYTES = 4 * 16 * PANEL_VECTORS  # a panel's pair: two bf16 of each of its 48 rows
SUM_ROW_BYTES = 4 * 16 * PANEL_VECTORS  # a row of sums: 48 fp32
SUMS, X_TILE, WEIGHTS = (0, 1, 2), 3, (4, 5, 6)


def tile_config(builder):
    """ldtilecfg's 64 bytes: palette 1, all eight tiles of 16 rows of 64 bytes."""
    data = bytearray(64)
    data[0] = 1
    for tile in range(8):
        data[16 + 2 * tile] = TILE_BYTES
        data[48 + tile] = TILE_ROWS
    value = ir.Constant(ir.ArrayType(I8, 64), data)
    name = "amx_tile_config"
    held = builder.module.globals.get(name) or cgutils.global_constant(builder.module, name, value)
    return builder.bitcast(held, I8.as_pointer())


class TileProduct:
    """The code of one panel_tiles call."""

    def __init__(self, context, builder, sig, args):
        self.builder = builder
        panel_t, _, parts_t, _, sums_t = sig.args
        panel, _, parts, rows, sums = args
        self.row = cgutils.unpack_tuple(builder, rows, 2)[0]
        self.panel = self.bytes_of(context, panel_t, panel)
        x = context.make_array(parts_t.types[0])(context, builder, cgutils.unpack_tuple(builder, parts, 1)[0])
        self.x, self.x_stride = builder.bitcast(x.data, I8.as_pointer()), cgutils.unpack_tuple(builder, x.strides)[0]
        self.steps = builder.udiv(cgutils.unpack_tuple(builder, x.shape)[1], index(16))
        self.sums = self.bytes_of(context, sums_t, sums)
        tile, void, pointer = ir.Constant, ir.VoidType(), I8.as_pointer()
        self.tile = lambda number: tile(I8, number)
        self.load = declare(builder, "llvm.x86.tileloadd64", void, I8, pointer, I64)
        self.store = declare(builder, "llvm.x86.tilestored64", void, I8, pointer, I64)
        self.dot = declare(builder, "llvm.x86.tdpbf16ps", void, I8, I8, I8)
        self.zero = declare(builder, "llvm.x86.tilezero", void, I8)

    def bytes_of(self, context, array_type, value):
        return self.builder.bitcast(context.make_array(array_type)(context, self.builder, value).data, I8.as_pointer())

    def emit(self):
        builder = self.builder
        builder.call(declare(builder, "llvm.x86.ldtilecfg", ir.VoidType(), I8.as_pointer()), [tile_config(builder)])
        for t in SUMS:
            builder.call(self.zero, [self.tile(t)])
        rows = builder.gep(self.x, [builder.mul(self.row, self.x_stride)])
        with cgutils.for_range(builder, self.steps) as loop:
            builder.call(self.load, [self.tile(X_TILE), builder.gep(rows, [builder.mul(loop.index, index(TILE_BYTES))]),
                                     self.x_stride])
            weights = builder.gep(self.panel, [builder.mul(loop.index, index(16 * PAIR_BYTES))])
            for n, t in enumerate(WEIGHTS):
                builder.call(self.load, [self.tile(t), builder.gep(weights, [index(TILE_BYTES * n)]), index(PAIR_BYTES)])
            for s, w in zip(SUMS, WEIGHTS):
                builder.call(self.dot, [self.tile(s), self.tile(X_TILE), self.tile(w)])
        for n, t in enumerate(SUMS):
            builder.call(self.store, [self.tile(t), builder.gep(self.sums, [index(TILE_BYTES * n)]), index(SUM_ROW_BYTES)])
        builder.call(declare(builder, "llvm.x86.tilerelease", ir.VoidType()), [])


def bf16_codegen(context, builder, sig, args):
    """panel_tiles' code for a bf16 panel (amx_int8_ir.panel_tiles types it)."""
    TileProduct(context, builder, sig, args).emit()
    return context.get_dummy_value()
