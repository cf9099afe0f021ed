"""The rounded products on AMX tiles, where the CPU has them (`exact = false`; Intel Sapphire Rapids on).

Each multiplies the same numbers as the AVX-512 kernel it stands in for:

* bf16 (rounded_bf16.py): x rounded to bf16 per value, the panels' bf16 weights, fp32
  sums. A panel's 48 outputs for 16 rows of x are `tdpbf16ps` tile products (amx_ir.py),
  32 times an fp32 FMA's multiply-adds an instruction; elsewhere `vdpbf16ps`
  (panels_ir.Bf16DotBlock), which on Intel's cores issues at half an FMA's rate, so that
  without tiles the rounded product is no faster than the exact one there.
* Int8 (vnni.py): x rounded per row and block to 16-bit integers, split into its high and
  low bytes for `tdpbsud` and `tdpbuud` (amx_int8_ir.py), the panels holding quads of
  inputs; the block sums are the integers vpdpwssd makes, folded the same way, so the
  result is the same to the bit.
* NF4 (rounded_nf4.py), on tiles only: 48 rows at a time widened to bf16 (amx_nf4_ir.py)
  and multiplied with x rounded to bf16 as for bf16 weights.
  Without tiles an NF4 model's products stay exact.

They run where numba compiles for a CPU with AMX (and its BF16 or INT8 part) and Linux lets
the process use the tiles (jit.tiles_permitted). Rows of x go to the tiles 16 at a time,
the last ones padded with zeros, from one row (a decoding step) up: every row count runs
the same tile code, so a row's result does not depend on its batch or its prompt's chunking.
"""

from __future__ import annotations

import functools

import numpy as np

from . import panels, vector_dots
from .jit import tiles_permitted

# bf16 past each widened row of an NF4 matrix: rows a multiple of 4 KiB apart share L1's sets
WIDENED_PADDING = 32
NF4_BLOCK_INPUTS = 64
TILE_ROWS = 16  # rows of x a tile product takes (amx_ir.py's tiles: not imported before numba is configured)


def compiled_for(feature: str = "amx-bf16") -> bool:
    """Whether numba compiles for a CPU with AMX and its `feature` (amx-bf16, amx-int8):
    this one, or NUMBA_CPU_FEATURES'."""
    features = vector_dots.cpu_features()
    return panels.exact_jit is not None and bool(features.get(feature) and features.get("amx-tile"))


@functools.cache
def available(feature: str = "amx-bf16") -> bool:
    """Whether the rounded products of `feature`'s kind run on AMX tiles: compiled for them, and let."""
    return tile_product is not None and compiled_for(feature) and tiles_permitted()


# Module-level kernels, compiled below where numba and AVX-512 are (skinny.py says why not nested).
prange = range
panel_tiles = widen_rows = nf4_tiles = nf4_panel_one_group = None


def tile_product(q, scales, x_parts, out):  # pragma: no cover - compiled by numba
    """out = x · Wᵀ for a matrix's panels q and their blocks' scales, x as x_parts with the
    rows of out rounded up to whole tiles: bf16 panels [panels, K/2, 96] with (xb [M', K/2]
    bf16 pairs,), or Int8 quad panels [panels, K/4, 192] with (xh, xl, x_scale, x_sum)."""
    panels_count = q.shape[0]
    M, N = out.shape
    tasks = min(panels_count, panels.MAX_TASKS)
    for task in prange(tasks):
        totals = np.empty((TILE_ROWS, panels.PANEL), dtype=np.float32)
        for p in range(task * panels_count // tasks, (task + 1) * panels_count // tasks):
            first = p * panels.PANEL
            for row in range(0, M, TILE_ROWS):
                count = min(M - row, TILE_ROWS)
                totals[:] = 0
                panel_tiles(q[p], scales[p], x_parts, (row, count), totals)
                for m in range(count):
                    for o in range(min(panels.PANEL, N - first)):
                        out[row + m, first + o] = totals[m, o]


def nf4_tile_product(q, absmax, levels, xt, out):  # pragma: no cover - compiled by numba
    """out = x · Wᵀ for an NF4 matrix in row blocks, q [N'/48, K/64, 48, 32] and absmax
    (rounded_nf4.RoundedNF4), x as bf16 pairs xt [groups, K/2, 16] (rounded_nf4.tile_pairs):
    each 48 rows widened to bf16 (amx_nf4_ir.py) once a call and multiplied by every group
    of 16 rows of x; for one group, a block at a time into one of two slots, the tiles
    multiplying the block before from the other (amx_nf4_ir.nf4_panel_one_group)."""
    M, N = out.shape
    panels_count, blocks = q.shape[0], q.shape[1]
    tasks = min(panels_count, panels.MAX_TASKS)
    whole = xt.shape[0] > 1
    slots, width = (1, NF4_BLOCK_INPUTS * blocks) if whole else (2, NF4_BLOCK_INPUTS)
    for task in prange(tasks):
        sums = np.empty((panels.PANEL, TILE_ROWS), dtype=np.float32)
        widened = np.empty((slots, panels.PANEL, width + WIDENED_PADDING), dtype=np.uint16)
        for p in range(task * panels_count // tasks, (task + 1) * panels_count // tasks):
            first = p * panels.PANEL
            if whole:
                widen_rows(q, absmax, levels, p, (0, blocks), widened[0])
                for group in range(xt.shape[0]):
                    nf4_tiles(widened[0], xt, group, (0, 2 * blocks), sums)
                    nf4_rows_out(sums, group, first, out)
            else:
                nf4_panel_one_group(q, absmax, levels, p, xt, widened, sums)
                nf4_rows_out(sums, 0, first, out)


def nf4_rows_out(sums, group, first, out):  # pragma: no cover - compiled by numba
    """Rows 16·group … of out, outputs first … first + 47, from the tiles' sums [48, 16] (by output)."""
    M, N = out.shape
    for m in range(min(M - group * TILE_ROWS, TILE_ROWS)):
        for o in range(min(panels.PANEL, N - first)):
            out[group * TILE_ROWS + m, first + o] = sums[o, m]


def byte_parts(xq, x_scale, x_sum):  # pragma: no cover - compiled by numba
    """x rounded to 16-bit integers xq [blocks, M', 128] (vnni.round_rows) as the Int8
    tiles take it: (xh, xl, x_scale, x_sum), xq = 256 · xh + xl, xh signed and xl unsigned."""
    high = np.empty(xq.shape, dtype=np.int8)
    low = np.empty(xq.shape, dtype=np.uint8)
    blocks, M, width = xq.shape
    for b in range(blocks):
        for m in range(M):
            for k in range(width):
                value = np.int32(xq[b, m, k])
                high[b, m, k] = np.int8(value >> 8)
                low[b, m, k] = np.uint8(value & 0xFF)
    return high, low, x_scale, x_sum


def _build():
    """The tile products compiled (not run: they are for the tiles), or Nones where numba does
    not compile for AMX."""
    if not compiled_for():
        return None, None
    from numba.extending import intrinsic

    from . import amx_int8_ir, amx_nf4_ir  # need numba, configured by panels' build above

    global prange, panel_tiles, widen_rows, nf4_tiles, nf4_panel_one_group, byte_parts, nf4_rows_out
    prange, panel_tiles = panels.prange, intrinsic(amx_int8_ir.panel_tiles)
    widen_rows, nf4_tiles = intrinsic(amx_nf4_ir.widen_rows), intrinsic(amx_nf4_ir.nf4_tiles)
    nf4_panel_one_group = intrinsic(amx_nf4_ir.nf4_panel_one_group)
    inline = panels.exact_jit(parallel=False, inline="always")
    byte_parts, nf4_rows_out = inline(byte_parts), inline(nf4_rows_out)
    return panels.exact_jit()(tile_product), panels.exact_jit()(nf4_tile_product)


tile_product, nf4_tile_product = _build()
