"""NF4 products on AMX's bf16 tiles: the weights widened to bf16 48 rows at a time, the
activations rounded to bf16 (`exact = false`).

Exact, an NF4 model's panels (panel_nf4.py) look each code up in the 16 fp32 levels and
run fp32 FMAs, 16 multiply-adds an instruction, and a prompt's chunk is bound by them.
AMX has no 4-bit product, and widening the codes to int8 for its int8 tiles would round the
levels to 1/127 of the block's absmax, which moved the demo model's logits by 2.5e-2 of
their spread. Here each call widens every 48 rows once to bf16, w = bf16(level · absmax)
(amx_nf4_ir.py): the numbers of the matrix dequantised to bf16, 8 bits of each kept. The
tiles multiply them with x rounded to bf16 per value (`tile_pairs`), as rounded_bf16.py
multiplies a bf16 matrix. Every row count, from a decoding step's one row (the tiles take
16) to a prompt's chunk, runs this code, so a row's result does not depend on its batch or
its prompt's chunking. The matrix stays NF4 in memory, in row blocks.

A model multiplies its NF4 matrices this way when the CPU has AMX's BF16 tiles and the
model is not `exact` (forms.keep_in_panels): they are then `RoundedNF4`, the weight form
ROUNDED_NF4. Elsewhere they stay exact.
"""

from __future__ import annotations

import functools
import numpy as np

from . import amx, panels
from .bf16_rounding import PARALLEL_ROUNDING_ROWS, nearest_bf16
from .panels import PANEL, Nf4Panels
from .weight_form import WeightForm

BLOCK, BLOCK_BYTES = 64, 32  # inputs of an NF4 block, and its bytes


class RoundedNF4(Nf4Panels):
    """An NF4 matrix of `rows` × K that a model multiplies widened to bf16 on AMX's tiles,
    in row blocks: q [N'/48, K/64, 48, 32] bytes, block b of each of a panel's 48 rows side
    by side (a pair's two codes a byte, the first in the low nibble), and absmax [N'/48,
    K/64, 48] fp16 bit patterns, N' = `rows` rounded up to whole 48 with zeros; and the 16
    levels. A panel's blocks are widened in the order they are stored, so that a decoding
    step reads the matrix as one stream (in rows, 48 streams a row apart, 2,048² at one row
    took 0.43-0.51 ms from memory on two cores, in row blocks 0.28-0.31)."""

    __slots__ = ()

    LAYOUT = "row blocks"

    @property
    def shape(self) -> tuple[int, int]:
        return self.rows, BLOCK * self.q.shape[1]

    @classmethod
    def of(cls, matrix):
        """An nf4.PackedNF4 (q [N, K/2] bytes, absmax [N, K/64]) in row blocks."""
        rows, blocks = matrix.absmax.shape
        count = -(-rows // PANEL)
        # On a cache line: numpy's arrays start 48 bytes past one here, and every other
        # block's 32 bytes then spanned two (2,048² at one row 0.31 → 0.42 ms on one core).
        q = panels.zeros_on_lines((count, blocks, PANEL, BLOCK_BYTES), np.uint8)
        absmax = np.zeros((count, blocks, PANEL), np.uint16)
        for p in range(count):
            part = slice(p * PANEL, (p + 1) * PANEL)
            held = len(matrix.q[part])
            q[p, :, :held] = matrix.q[part].reshape(held, blocks, BLOCK_BYTES).transpose(1, 0, 2)
            absmax[p, :, :held] = matrix.absmax[part].T
        return cls(panels.read_only(q), panels.read_only(absmax), rows, matrix.levels)

    def packed(self) -> tuple[np.ndarray, np.ndarray]:
        """(q [N, K/2], absmax [N, K/64]), as nf4.PackedNF4 holds them."""
        panels_count, blocks = self.q.shape[:2]
        q = self.q.transpose(0, 2, 1, 3).reshape(panels_count * PANEL, blocks * BLOCK_BYTES)
        absmax = self.absmax.transpose(0, 2, 1).reshape(panels_count * PANEL, blocks)
        return q[: self.rows], absmax[: self.rows]


# Module-level kernels, compiled below where numba and AVX-512 are (skinny.py says why not nested).
pair_rows_here = None


def pair_rows(x, xt):  # pragma: no cover - compiled by numba
    """x [M, K] rounded to bf16 (bf16_rounding's rule) into xt [groups, K/2, 16] in the
    order of the widened weights (amx_nf4_ir.py): pair j = 16·s + k of tile step s, for
    s = 2b + e, inputs 64b + 4k + e and that + 2, of each of 16 rows side by side."""
    M, K = x.shape
    bits = x.view(np.uint32)
    for group in prange(xt.shape[0]):
        for j in range(K // 2):
            step, k = j // 16, j % 16
            first = BLOCK * (step // 2) + 4 * k + step % 2
            for r in range(16):
                m = group * 16 + r
                if m < M:
                    xt[group, j, r] = np.uint32(nearest_bf16(np.int64(bits[m, first]))
                                                | (nearest_bf16(np.int64(bits[m, first + 2])) << 16))
                else:
                    xt[group, j, r] = 0


def tile_pairs(x):  # pragma: no cover - compiled by numba
    """x [M, K] as pair_rows puts it, its rows rounded up to whole groups of 16 with zeros:
    in the calling thread for a decoding step's few rows, on the cores for a prompt's."""
    M, K = x.shape
    xt = np.empty((-(-M // 16), K // 2, 16), dtype=np.uint32)
    if M >= PARALLEL_ROUNDING_ROWS:
        pair_rows(x, xt)
    else:
        pair_rows_here(x, xt)
    return xt


def product(W, x, out):  # pragma: no cover - compiled by numba
    """out = x · Wᵀ, W widened and x rounded to bf16: the kernel for compiled callers (fused7.py) and the entry's."""
    amx.nf4_tile_product(W.q, W.absmax, W.levels, tile_pairs(x), out)


def entry(W, x, out):  # pragma: no cover - compiled by numba
    product(W, x, out)


@functools.cache
def available() -> bool:
    """Whether an NF4 model that is not exact multiplies on AMX's bf16 tiles here."""
    return _entry is not None and amx.available("amx-bf16")


prange = panels.prange
_entry = None
if (_kernels := panels.compile_form(product, entry, pair_rows)) is not None:
    product, _entry, pair_rows_here, pair_rows = _kernels
    tile_pairs = panels.exact_jit(parallel=False, inline="always")(tile_pairs)

rounded_nf4_matmul = functools.partial(panels.matmul, _entry)  # x [M, K] · Wᵀ → [M, N], W widened, x rounded
ROUNDED_NF4 = WeightForm("nf4, widened to bf16 on tiles", RoundedNF4, panels.pack_for(RoundedNF4), rounded_nf4_matmul,
                         1 << 30, None, lambda w: w, product, None)
