"""bf16 products on AMX tiles, where the CPU has them (`exact = false`; Intel Sapphire Rapids on).

A rounded bf16 product (rounded_bf16.py) multiplies the same numbers on either kernel: x
rounded to bf16 per value, the panels' bf16 weights, fp32 sums. Where numba compiles for a
CPU with AMX-BF16 and Linux lets the process use the tiles, a panel's 48 outputs for 16
rows of x at a time are `tdpbf16ps` tile products (amx_ir.py): 32 times an fp32 FMA's
multiply-adds an instruction. Elsewhere, `vdpbf16ps` (panels_ir.Bf16DotBlock). On Intel's
cores vdpbf16ps issues at half an FMA's rate, so that without tiles the rounded product is
no faster than the exact one there.

Rows of x go to the tiles 16 at a time, the last ones padded with zeros, from one row
(a decoding step) up: every row count runs the same tile code, so a row's result does not
depend on its batch or its prompt's chunking.
"""

from __future__ import annotations

import functools

import numpy as np

from . import panels, vector_dots
from .jit import tiles_permitted

TILE_ROWS = 16  # rows of x a tile product takes (amx_ir.py's tiles: not imported before numba is configured)


def compiled_for() -> bool:
    """Whether numba compiles for a CPU with AMX-BF16 (this one, or NUMBA_CPU_FEATURES')."""
    features = vector_dots.cpu_features()
    return panels.exact_jit is not None and bool(features.get("amx-bf16") and features.get("amx-tile"))


@functools.cache
def available() -> bool:
    """Whether the rounded bf16 products run on AMX tiles: compiled for them, and let."""
    return tile_product is not None and tiles_permitted()


# Module-level kernels, compiled below where numba and AVX-512 are (skinny.py says why not nested).
prange = range
panel_tiles = None


def tile_product(q, xb, out):  # pragma: no cover - compiled by numba
    """out = x · Wᵀ for a bf16 matrix's panels q [panels, K/2, 96] and x as xb [M', K/2]
    bf16 pairs, M' the rows of out rounded up to whole tiles."""
    panels_count = q.shape[0]
    M, N = out.shape
    tasks = min(panels_count, panels.MAX_TASKS)
    for task in prange(tasks):
        sums = np.empty((TILE_ROWS, panels.PANEL), dtype=np.float32)
        for p in range(task * panels_count // tasks, (task + 1) * panels_count // tasks):
            first = p * panels.PANEL
            for row in range(0, M, TILE_ROWS):
                panel_tiles(q[p], xb, row, sums)
                for m in range(row, min(M, row + TILE_ROWS)):
                    for o in range(min(panels.PANEL, N - first)):
                        out[m, first + o] = sums[m - row, o]


def _build():
    """tile_product compiled (not run: it is for the tiles), or None where numba does not compile for AMX."""
    if not compiled_for():
        return None
    from numba.extending import intrinsic

    from . import amx_ir  # needs numba, configured by panels' build above

    global prange, panel_tiles
    prange, panel_tiles = panels.prange, intrinsic(amx_ir.panel_tiles)
    return panels.exact_jit()(tile_product)


tile_product = _build()
