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


def _widen(context, builder, sig, args):
    q_t, absmax_t, levels_t, _, _, widened_t = sig.args
    q, absmax, levels_array, panel, span, widened = args
    first_block, blocks = cgutils.unpack_tuple(builder, span, 2)
    levels_data = context.make_array(levels_t)(context, builder, levels_array).data
    levels = builder.load(builder.bitcast(levels_data, fvec(LANES).as_pointer()), align=4)
    to_bf16 = declare(builder, "llvm.x86.avx512bf16.cvtneps2bf16.512", ir.VectorType(BF16, LANES), fvec(LANES))
    lookup = declare(builder, "llvm.x86.avx512.permvar.hi.512", WORDS, WORDS, WORDS)
    widened_table = ir.Constant(ir.VectorType(ir.IntType(32), 2 * LANES), list(range(2 * LANES)))
    no_table = ir.Constant(ir.VectorType(ir.IntType(16), LANES), None)
    shift, low_nibble = ir.Constant(WORDS, [4] * 2 * LANES), ir.Constant(WORDS, [15] * 2 * LANES)
    codes_panel = builder.bitcast(row_pointer(context, builder, q_t, q, panel)[0], I8.as_pointer())
    scales_panel = row_pointer(context, builder, absmax_t, absmax, panel)[0]
    widened_rows = context.make_array(widened_t)(context, builder, widened)
    row_words = builder.udiv(cgutils.unpack_tuple(builder, widened_rows.strides)[0], index(2 * 2 * LANES))
    out = builder.bitcast(widened_rows.data, WORDS.as_pointer())
    fetch = declare(builder, "llvm.prefetch.p0i8", ir.VoidType(), I8.as_pointer(), I32, I32, I32)
    # The panel's blocks in the order they are stored: one stream of bytes from memory.
    with cgutils.for_range(builder, blocks) as block_loop:
        b = builder.add(first_block, block_loop.index)
        with cgutils.for_range(builder, index(ROWS)) as row_loop:
            at = builder.add(builder.mul(b, index(ROWS)), row_loop.index)
            half = builder.bitcast(builder.load(builder.gep(scales_panel, [at])), ir.HalfType())
            scaled = builder.fmul(levels, _splat(builder, builder.fpext(half, F32)))
            table16 = builder.bitcast(builder.call(to_bf16, [scaled]), ir.VectorType(ir.IntType(16), LANES))
            # vpermw reads 5 bits of an index: the upper 16 words are never looked up (zeros
            # cost nothing; the table twice took one more shuffle on the busiest port).
            table = builder.shuffle_vector(table16, no_table, widened_table)
            early = builder.gep(codes_panel, [builder.mul(builder.add(at, index(ROWS * AHEAD)), index(BLOCK // 2))])
            builder.call(fetch, [early, ir.Constant(I32, 0), ir.Constant(I32, 3), ir.Constant(I32, 1)])
            raw = builder.load(builder.bitcast(builder.gep(codes_panel, [builder.mul(at, index(BLOCK // 2))]),
                                               ir.VectorType(I8, 2 * LANES).as_pointer()), align=1)
            codes = builder.zext(raw, WORDS)
            evens = builder.call(lookup, [table, builder.and_(codes, low_nibble)])
            odds = builder.call(lookup, [table, builder.lshr(codes, shift)])
            place = builder.add(builder.mul(row_loop.index, row_words), builder.mul(block_loop.index, index(2)))
            builder.store(evens, builder.gep(out, [place]), align=2)
            builder.store(odds, builder.gep(out, [builder.add(place, index(1))]), align=2)
    return context.get_dummy_value()


def _splat(builder, value):
    vector = builder.insert_element(ir.Constant(fvec(LANES), ir.Undefined), value, ir.Constant(ir.IntType(32), 0))
    return builder.shuffle_vector(vector, ir.Constant(fvec(LANES), ir.Undefined),
                                  ir.Constant(ir.VectorType(ir.IntType(32), LANES), None))


def widen_rows(typingctx, q, absmax, levels, panel, span, widened):
    """The typing of intrinsic(q, absmax, levels, panel, (first block, blocks), widened)
    (the module's docstring)."""
    if not c_arrays(q, absmax, levels, widened) or not isinstance(panel, types.Integer) or (q.ndim, absmax.ndim) != (4, 3):
        return None
    if (q.dtype, absmax.dtype, levels.dtype, widened.dtype) != (types.uint8, types.uint16, types.float32, types.uint16):
        return None
    return types.void(q, absmax, levels, types.int64, types.UniTuple(types.int64, 2), widened), _widen


def _tiles(context, builder, sig, args):
    widened_t, xt_t, _, _, sums_t = sig.args
    widened, xt, group, span, sums = args
    first_step, steps = cgutils.unpack_tuple(builder, span, 2)
    data = lambda t, v: builder.bitcast(context.make_array(t)(context, builder, v).data, I8.as_pointer())
    weights_array = context.make_array(widened_t)(context, builder, widened)
    weights, weight_stride = data(widened_t, widened), cgutils.unpack_tuple(builder, weights_array.strides)[0]
    xt_array = context.make_array(xt_t)(context, builder, xt)
    group_bytes = cgutils.unpack_tuple(builder, xt_array.strides)[0]
    rows_x = builder.gep(data(xt_t, xt), [builder.mul(group, group_bytes)])
    pointer, void = I8.as_pointer(), ir.VoidType()
    tile = lambda number: ir.Constant(I8, number)
    load = declare(builder, "llvm.x86.tileloadd64", void, I8, pointer, I64)
    store = declare(builder, "llvm.x86.tilestored64", void, I8, pointer, I64)
    dot = declare(builder, "llvm.x86.tdpbf16ps", void, I8, I8, I8)
    zero = declare(builder, "llvm.x86.tilezero", void, I8)
    out = data(sums_t, sums)
    builder.call(declare(builder, "llvm.x86.ldtilecfg", void, pointer), [tile_config(builder)])
    with builder.if_else(builder.icmp_unsigned("==", first_step, index(0))) as (starting, going_on):
        with starting:
            for t in SUMS:
                builder.call(zero, [tile(t)])
        with going_on:  # the sums so far, as fp32: the same as had they stayed in the tiles
            for n, t in enumerate(SUMS):
                builder.call(load, [tile(t), builder.gep(out, [index(TILE_ROWS * TILE_BYTES * n)]), index(TILE_BYTES)])
    with cgutils.for_range(builder, steps) as loop:
        step = builder.add(first_step, loop.index)
        builder.call(load, [tile(X_TILE), builder.gep(rows_x, [builder.mul(step, index(TILE_ROWS * TILE_BYTES))]),
                            index(TILE_BYTES)])
        for n, t in enumerate(WEIGHTS):
            at = builder.add(builder.mul(index(TILE_ROWS * n), weight_stride), builder.mul(loop.index, index(TILE_BYTES)))
            builder.call(load, [tile(t), builder.gep(weights, [at]), weight_stride])
        for s, w in zip(SUMS, WEIGHTS):
            builder.call(dot, [tile(s), tile(w), tile(X_TILE)])
    for n, t in enumerate(SUMS):
        builder.call(store, [tile(t), builder.gep(out, [index(TILE_ROWS * TILE_BYTES * n)]), index(TILE_BYTES)])
    builder.call(declare(builder, "llvm.x86.tilerelease", void), [])
    return context.get_dummy_value()


def nf4_tiles(typingctx, widened, xt, group, span, sums):
    """The typing of intrinsic(widened, xt, group, (first step, steps), sums) (the module's docstring)."""
    if not c_arrays(widened, xt, sums) or not isinstance(group, types.Integer):
        return None
    if (widened.dtype, xt.dtype, sums.dtype) != (types.uint16, types.uint32, types.float32):
        return None
    return types.void(widened, xt, types.int64, types.UniTuple(types.int64, 2), sums), _tiles
