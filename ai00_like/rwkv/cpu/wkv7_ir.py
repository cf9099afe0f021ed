"""The LLVM IR of one row of v7's recurrence for one head of 64 (fused7_layer.wkv).

For row m and head h, with the head's state S [64 values, 64 keys] and the row's vectors
(r, decay w, k, v, a, b: 64 each),

    sa_i = Σ_j S_ij a_j;   S_ij ← S_ij w_j + sa_i b_j + v_i k_j;   y_i = Σ_j S_ij r_j,

each value row i of S in turn, as the reference orders it. numba's loops over j, of a
length known only at run time, were vectorised with checks for overlapping arrays and a
remainder each time round i, and the recurrence took 13.9 ms of a 512-token chunk at the
1.5B shape a layer. Here a head is 64 wide: the row's six vectors are four registers each,
loaded once for the 64 value rows, and S's row i is four more; each sum over j is two
chains of FMAs, added, then the 16 lanes added in a fixed tree, so the bits do not depend
on the batch or the chunk a row comes in.

`wkv7_head_row(Sh, rows, y, m, h)`: Sh [64, 64] float32 updated in place, rows = (r,
decay, k, v, a, b) each [M, C] float32, y [M, C] float32, head h's 64 of row m.
"""

from __future__ import annotations

from llvmlite import ir
from numba import types
from numba.core import cgutils

from .llvm_ir import I8, I32, broadcast, c_arrays, declare, fvec, index, ivec, row_pointer

HEAD = 64  # the head size this IR serves; fused7_layer.wkv runs numba's loops for others
LANES = 16
PARTS = HEAD // LANES
AHEAD = 2  # rows on whose lines a row asks for (prefetches past the arrays do not fault)


def _lanes_sum(builder, vector):
    """The 16 lanes added: halves, then quarters, ... (the same tree every time)."""
    width = LANES
    while width > 1:
        width //= 2
        low = builder.shuffle_vector(vector, vector, ir.Constant(ivec(width), list(range(width))))
        high = builder.shuffle_vector(vector, vector, ir.Constant(ivec(width), list(range(width, 2 * width))))
        vector = builder.fadd(low, high)
    return builder.extract_element(vector, ir.Constant(I32, 0))


class HeadRow:
    """The code of one wkv7_head_row call."""

    def __init__(self, context, builder, sig, args):
        self.builder = builder
        state_t, rows_t, y_t, _, _ = sig.args
        state, rows, y, m, h = args
        self.state = context.make_array(state_t)(context, builder, state).data
        first = builder.mul(h, index(HEAD))
        self.rows = [builder.gep(row_pointer(context, builder, t, value, m)[0], [first])
                     for t, value in zip(rows_t.types, cgutils.unpack_tuple(builder, rows, len(rows_t)))]
        self.y = builder.gep(row_pointer(context, builder, y_t, y, m)[0], [first])
        self.row_floats = cgutils.unpack_tuple(builder, context.make_array(y_t)(context, builder, y).shape)[1]
        self.fma = declare(builder, f"llvm.fma.v{LANES}f32", *[fvec(LANES)] * 4)

    def fetch_ahead(self):
        """Ask for the head's lines of the rows AHEAD further on: a task's rows are a row of
        the arrays apart (8 KiB at 1.5B), a stride the prefetchers do not follow."""
        builder = self.builder
        fetch = declare(builder, "llvm.prefetch.p0i8", ir.VoidType(), I8.as_pointer(), I32, I32, I32)
        ahead = builder.mul(self.row_floats, index(AHEAD))
        for pointer in (*self.rows, self.y):
            for line in range(0, HEAD, 16):
                address = builder.bitcast(builder.gep(pointer, [builder.add(ahead, index(line))]), I8.as_pointer())
                builder.call(fetch, [address, ir.Constant(I32, 0), ir.Constant(I32, 3), ir.Constant(I32, 1)])

    def vectors(self, pointer):
        builder = self.builder
        return [builder.load(builder.bitcast(builder.gep(pointer, [index(LANES * p)]), fvec(LANES).as_pointer()), align=4)
                for p in range(PARTS)]

    def dot(self, left, right):
        """Σ_j left_j right_j over the head: two chains of FMAs, added, then the lanes."""
        builder = self.builder
        chains = [builder.fmul(left[c], right[c]) for c in range(2)]
        for p in range(2, PARTS):
            chains[p % 2] = builder.call(self.fma, [left[p], right[p], chains[p % 2]])
        return _lanes_sum(builder, builder.fadd(chains[0], chains[1]))

    def emit(self):
        builder = self.builder
        self.fetch_ahead()
        r, decay, k, v, a, b = self.rows
        r, decay, k, a, b = (self.vectors(p) for p in (r, decay, k, a, b))
        with cgutils.for_range(builder, index(HEAD)) as loop:
            i = loop.index
            row = builder.gep(self.state, [builder.mul(i, index(HEAD))])
            s = self.vectors(row)
            sa = broadcast(builder, self.dot(s, a), LANES)
            vi = broadcast(builder, builder.load(builder.gep(v, [i])), LANES)
            for p in range(PARTS):
                s[p] = builder.call(self.fma, [vi, k[p], builder.call(self.fma, [sa, b[p], builder.fmul(s[p], decay[p])])])
                place = builder.bitcast(builder.gep(row, [index(LANES * p)]), fvec(LANES).as_pointer())
                builder.store(s[p], place, align=4)
            builder.store(self.dot(s, r), builder.gep(self.y, [i]))


def wkv7_head_row(typingctx, state, rows, y, m, h):
    """The typing of intrinsic(Sh, (r, decay, k, v, a, b), y, m, h)."""
    if not isinstance(rows, types.BaseTuple) or len(rows) != 6 or not c_arrays(state, y, *rows):
        return None
    if any(t.dtype != types.float32 for t in (state, y, *rows)):
        return None

    def codegen(context, builder, sig, args):
        HeadRow(context, builder, sig, args).emit()
        return context.get_dummy_value()
    return types.void(state, rows, y, types.intp, types.intp), codegen
