"""The LLVM IR of AMX's bf16 tile product of an NF4 matrix widened to bf16 (rounded_nf4.py, amx.py).

The weights are the tiles' first operand here, a tile row being 32 bf16 of one output:
the matrix is kept in row blocks (rounded_nf4.RoundedNF4), and a row's 64-input block of codes,
32 bytes, widens to its 64 bf16 with few instructions. `widen_rows` makes the block's
table of 16 weights, bf16(level · absmax) (one multiply, one conversion to bf16, ties to
even), and looks the 32 first codes (the low nibbles: inputs 0, 2, …, 62 of the block) and
the 32 second ones (inputs 1, 3, …, 63) up in it, 32 at a time (`vpermw`). Tile step s of
a block (32 bf16, 16 pairs) is then its even inputs (s even) or its odd ones, pair k of it
inputs 4k and 4k + 2 (or 4k + 1 and 4k + 3), and x is put in pairs in that order
(rounded_nf4.tile_pairs), 16 rows of x a tile row: `tdpbf16ps` multiplies the pairs into
fp32 sums, outputs by rows of x.

`widen_rows(q, absmax, levels, p, (b, blocks), widened)`: blocks b … b + blocks − 1 of
panel p of q [panels, K/64, 48, 32] uint8 (a block's 32 bytes of each of the panel's 48
rows side by side, a byte's low nibble the first code; rounded_nf4.RoundedNF4) with absmax
[panels, K/64, 48] (fp16 bit patterns) and the 16 levels, read in the order they are
stored, into widened [48, K'] uint16 bf16 from its start, each block's 32 even inputs,
then its odd (K' ≥ 64 · blocks; rows 4 KiB apart would all fall in the same sets of L1,
and a tile's 16 loads evict each other).

`nf4_tiles(widened, xt, group, (s, steps), sums)`: sums [48, 16] float32 (+)= the widened
rows, tile steps s … s + steps − 1 from the widened start, · rows 16·group … 16·group +
15 of x, held as xt [groups, K/2, 16] uint32 (pair j of each of a group's 16 rows side by
side). From step 0 the sums start at zero, else from `sums` (fp32, as the tiles hold
them: the same bits as one call over all the steps). Each sum runs over K in order
whatever the other rows of the group hold: a row's result does not depend on its batch or
its prompt's chunking.

`nf4_panel_one_group(q, absmax, levels, p, xt, widened, sums)`: the two above for panel p
and the first group of x (a decoding step), a block at a time: block b widened into slot
b mod 2 of widened [2, 48, K'], then block b − 1's tile steps from the other slot, so that
the tiles multiply while the vector ports widen (the same steps in the same order: the
same bits), the sums in the tiles from the first step to the last.
"""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils

from .amx_ir import TILE_BYTES, TILE_ROWS, tile_config
from .llvm_ir import BF16, F32, I8, I32, I64, c_arrays, declare, fvec, index, row_pointer

LANES = 16
BLOCK = 64  # inputs of an NF4 block
ROWS = 48  # weight rows a call widens: three tiles of 16 outputs
AHEAD = 4  # blocks on that the widening asks for (one row from memory: 2.1 → 1.9 times the exact panels' time)
SUMS, X_TILE, WEIGHTS = (0, 1, 2), 3, (4, 5, 6)
WORDS = ir.VectorType(ir.IntType(16), 2 * LANES)


class _Widening:
    """The code that widens a panel's blocks (`widen_rows`), for one function's builder."""

    def __init__(self, context, builder, arrays, panel):
        q_t, q, absmax_t, absmax, levels_t, levels_array = arrays
        self.builder = builder
        levels_data = context.make_array(levels_t)(context, builder, levels_array).data
        self.levels = builder.load(builder.bitcast(levels_data, fvec(LANES).as_pointer()), align=4)
        self.to_bf16 = declare(builder, "llvm.x86.avx512bf16.cvtneps2bf16.512", ir.VectorType(BF16, LANES), fvec(LANES))
        self.lookup = declare(builder, "llvm.x86.avx512.permvar.hi.512", WORDS, WORDS, WORDS)
        self.fetch = declare(builder, "llvm.prefetch.p0i8", ir.VoidType(), I8.as_pointer(), I32, I32, I32)
        self.codes = builder.bitcast(row_pointer(context, builder, q_t, q, panel)[0], I8.as_pointer())
        self.scales = row_pointer(context, builder, absmax_t, absmax, panel)[0]

    def emit(self, span, out, row_words):
        """Blocks span = (b, blocks) into out (WORDS*), a row every row_words, from its start."""
        builder = self.builder
        first_block, blocks = span
        widened_table = ir.Constant(ir.VectorType(ir.IntType(32), 2 * LANES), list(range(2 * LANES)))
        no_table = ir.Constant(ir.VectorType(ir.IntType(16), LANES), None)
        shift, low_nibble = ir.Constant(WORDS, [4] * 2 * LANES), ir.Constant(WORDS, [15] * 2 * LANES)
        # The panel's blocks in the order they are stored: one stream of bytes from memory.
        with cgutils.for_range(builder, blocks) as block_loop:
            b = builder.add(first_block, block_loop.index)
            with cgutils.for_range(builder, index(ROWS)) as row_loop:
                at = builder.add(builder.mul(b, index(ROWS)), row_loop.index)
                half = builder.bitcast(builder.load(builder.gep(self.scales, [at])), ir.HalfType())
                scaled = builder.fmul(self.levels, _splat(builder, builder.fpext(half, F32)))
                table16 = builder.bitcast(builder.call(self.to_bf16, [scaled]), ir.VectorType(ir.IntType(16), LANES))
                # vpermw reads 5 bits of an index: the upper 16 words are never looked up (zeros
                # cost nothing; the table twice took one more shuffle on the busiest port).
                table = builder.shuffle_vector(table16, no_table, widened_table)
                early = builder.gep(self.codes, [builder.mul(builder.add(at, index(ROWS * AHEAD)), index(BLOCK // 2))])
                builder.call(self.fetch, [early, ir.Constant(I32, 0), ir.Constant(I32, 3), ir.Constant(I32, 1)])
                raw = builder.load(builder.bitcast(builder.gep(self.codes, [builder.mul(at, index(BLOCK // 2))]),
                                                   ir.VectorType(I8, 2 * LANES).as_pointer()), align=1)
                codes = builder.zext(raw, WORDS)
                evens = builder.call(self.lookup, [table, builder.and_(codes, low_nibble)])
                odds = builder.call(self.lookup, [table, builder.lshr(codes, shift)])
                place = builder.add(builder.mul(row_loop.index, row_words), builder.mul(block_loop.index, index(2)))
                builder.store(evens, builder.gep(out, [place]), align=2)
                builder.store(odds, builder.gep(out, [builder.add(place, index(1))]), align=2)


def _words(context, builder, widened_t, widened):
    """widened [rows, K'] uint16 as (WORDS*, its row stride in WORDS)."""
    rows = context.make_array(widened_t)(context, builder, widened)
    stride = cgutils.unpack_tuple(builder, rows.strides)[0]
    return builder.bitcast(rows.data, WORDS.as_pointer()), builder.udiv(stride, index(2 * 2 * LANES))


def _widen(context, builder, sig, args):
    q_t, absmax_t, levels_t, _, _, widened_t = sig.args
    q, absmax, levels_array, panel, span, widened = args
    widening = _Widening(context, builder, (q_t, q, absmax_t, absmax, levels_t, levels_array), panel)
    widening.emit(cgutils.unpack_tuple(builder, span, 2), *_words(context, builder, widened_t, widened))
    return context.get_dummy_value()


def _splat(builder, value):
    vector = builder.insert_element(ir.Constant(fvec(LANES), ir.Undefined), value, ir.Constant(ir.IntType(32), 0))
    return builder.shuffle_vector(vector, ir.Constant(fvec(LANES), ir.Undefined),
                                  ir.Constant(ir.VectorType(ir.IntType(32), LANES), None))


def widen_rows(typingctx, q, absmax, levels, panel, span, widened):
    """The typing of intrinsic(q, absmax, levels, panel, (first block, blocks), widened)
    (the module's docstring)."""
    if not _nf4_arrays(q, absmax, levels, widened) or not isinstance(panel, types.Integer):
        return None
    return types.void(q, absmax, levels, types.int64, types.UniTuple(types.int64, 2), widened), _widen


def _nf4_arrays(q, absmax, levels, widened) -> bool:
    return (c_arrays(q, absmax, levels, widened) and (q.ndim, absmax.ndim) == (4, 3)
            and (q.dtype, absmax.dtype, levels.dtype, widened.dtype) == (types.uint8, types.uint16, types.float32,
                                                                         types.uint16))


class _TileSteps:
    """The code of tile steps over widened rows and a group of x (`nf4_tiles`), for one function's builder."""

    def __init__(self, context, builder, xt_arg, group):
        xt_t, xt = xt_arg
        self.builder = builder
        xt_array = context.make_array(xt_t)(context, builder, xt)
        group_bytes = cgutils.unpack_tuple(builder, xt_array.strides)[0]
        data = builder.bitcast(xt_array.data, I8.as_pointer())
        self.rows_x = builder.gep(data, [builder.mul(group, group_bytes)])
        pointer, void = I8.as_pointer(), ir.VoidType()
        self.load = declare(builder, "llvm.x86.tileloadd64", void, I8, pointer, I64)
        self.store = declare(builder, "llvm.x86.tilestored64", void, I8, pointer, I64)
        self.dot = declare(builder, "llvm.x86.tdpbf16ps", void, I8, I8, I8)
        self.zero = declare(builder, "llvm.x86.tilezero", void, I8)

    def configure(self):
        self.builder.call(declare(self.builder, "llvm.x86.ldtilecfg", ir.VoidType(), I8.as_pointer()),
                          [tile_config(self.builder)])

    def start(self, sums, stored):
        """The sums' tiles at zero, or (stored true) loaded from sums [48, 16] fp32: the same
        as had they stayed in the tiles."""
        if stored is None:
            for t in SUMS:
                self.builder.call(self.zero, [_tile(t)])
            return
        with self.builder.if_else(stored) as (going_on, starting):
            with going_on:
                self._sums(self.load, sums)
            with starting:
                for t in SUMS:
                    self.builder.call(self.zero, [_tile(t)])

    def finish(self, sums):
        self._sums(self.store, sums)
        self.builder.call(declare(self.builder, "llvm.x86.tilerelease", ir.VoidType()), [])

    def _sums(self, op, sums):
        for n, t in enumerate(SUMS):
            self.builder.call(op, [_tile(t), self.builder.gep(sums, [index(TILE_ROWS * TILE_BYTES * n)]),
                                   index(TILE_BYTES)])

    def emit(self, span, weights, weight_stride):
        """Tile steps span = (s, steps) of x, the weights' from weights (i8*) on, a row every weight_stride bytes."""
        builder = self.builder
        first_step, steps = span
        with cgutils.for_range(builder, steps) as loop:
            step = builder.add(first_step, loop.index)
            builder.call(self.load, [_tile(X_TILE), builder.gep(self.rows_x, [builder.mul(step, index(TILE_ROWS * TILE_BYTES))]),
                                     index(TILE_BYTES)])
            for n, t in enumerate(WEIGHTS):
                at = builder.add(builder.mul(index(TILE_ROWS * n), weight_stride), builder.mul(loop.index, index(TILE_BYTES)))
                builder.call(self.load, [_tile(t), builder.gep(weights, [at]), weight_stride])
            for s, w in zip(SUMS, WEIGHTS):
                builder.call(self.dot, [_tile(s), _tile(w), _tile(X_TILE)])


def _tile(number):
    return ir.Constant(I8, number)


def _bytes(context, builder, array_t, array):
    return builder.bitcast(context.make_array(array_t)(context, builder, array).data, I8.as_pointer())


def _tiles(context, builder, sig, args):
    widened_t, xt_t, _, _, sums_t = sig.args
    widened, xt, group, span, sums = args
    first_step, steps = cgutils.unpack_tuple(builder, span, 2)
    stride = cgutils.unpack_tuple(builder, context.make_array(widened_t)(context, builder, widened).strides)[0]
    out = _bytes(context, builder, sums_t, sums)
    tiles = _TileSteps(context, builder, (xt_t, xt), group)
    tiles.configure()
    tiles.start(out, builder.icmp_unsigned("!=", first_step, index(0)))
    tiles.emit((first_step, steps), _bytes(context, builder, widened_t, widened), stride)
    tiles.finish(out)
    return context.get_dummy_value()


def _one_group(context, builder, sig, args):
    """Each block of the panel widened into one of two slots of widened [2, 48, K'] while the
    tiles multiply the block before, from the other: the widening's ports and the tiles work
    at once. The sums stay in the tiles from the first step to the last."""
    q_t, absmax_t, levels_t, _, xt_t, widened_t, sums_t = sig.args
    q, absmax, levels_array, panel, xt, widened, sums = args
    widening = _Widening(context, builder, (q_t, q, absmax_t, absmax, levels_t, levels_array), panel)
    blocks = cgutils.unpack_tuple(builder, context.make_array(q_t)(context, builder, q).shape)[1]
    slots = context.make_array(widened_t)(context, builder, widened)
    slot_bytes, row_bytes = cgutils.unpack_tuple(builder, slots.strides)[:2]
    first_slot = builder.bitcast(slots.data, I8.as_pointer())
    slot = lambda b: builder.gep(first_slot, [builder.mul(builder.and_(b, index(1)), slot_bytes)])
    row_words = builder.udiv(row_bytes, index(2 * 2 * LANES))
    tiles = _TileSteps(context, builder, (xt_t, xt), index(0))
    tiles.configure()
    tiles.start(None, None)
    with cgutils.for_range(builder, blocks) as loop:
        b = loop.index
        widening.emit((b, index(1)), builder.bitcast(slot(b), WORDS.as_pointer()), row_words)
        with builder.if_then(builder.icmp_unsigned("!=", b, index(0))):
            before = builder.sub(b, index(1))
            tiles.emit((builder.mul(before, index(2)), index(2)), slot(before), row_bytes)
    last = builder.sub(blocks, index(1))
    tiles.emit((builder.mul(last, index(2)), index(2)), slot(last), row_bytes)
    tiles.finish(_bytes(context, builder, sums_t, sums))
    return context.get_dummy_value()


def nf4_panel_one_group(typingctx, q, absmax, levels, panel, xt, widened, sums):
    """The typing of intrinsic(q, absmax, levels, panel, xt, widened, sums): sums [48, 16]
    = panel `panel` widened · the first group of xt, a block at a time (`_one_group`)."""
    if not _nf4_arrays(q, absmax, levels, widened) or not c_arrays(xt, sums) or not isinstance(panel, types.Integer):
        return None
    if widened.ndim != 3 or (xt.dtype, sums.dtype) != (types.uint32, types.float32):
        return None
    return types.void(q, absmax, levels, types.int64, xt, widened, sums), _one_group


def nf4_tiles(typingctx, widened, xt, group, span, sums):
    """The typing of intrinsic(widened, xt, group, (first step, steps), sums) (the module's docstring)."""
    if not c_arrays(widened, xt, sums) or not isinstance(group, types.Integer):
        return None
    if (widened.dtype, xt.dtype, sums.dtype) != (types.uint16, types.uint32, types.float32):
        return None
    return types.void(widened, xt, types.int64, types.UniTuple(types.int64, 2), sums), _tiles
