"""Int8, NF4 and bf16 weights in panels of 48 rows, and the loop that multiplies them (AVX-512).

Kept in rows (int8.py, nf4.py, skinny.py), a kernel's vector lanes run along a row's inputs, and
every output ends in a sum across a vector's lanes; a few rows of x then keep the cores
at half their rate. Kept in panels, a pair of inputs of each of 48 rows side by side (2
bytes a row for Int8, one for NF4's two codes, 4 for bf16), one load is a pair of 16 rows: the lanes
run along the outputs, x's values are broadcast, and the same kernel serves a decoding
step's one row and a prompt's chunk (panels_ir.py). Where the CPU has AVX-512 a model
keeps its Int8 and NF4 matrices this way (forms.keep_in_panels), and its bf16 projections
and head as its layers are built (panel_bf16.py), and multiplies them with fp32
activations (panel_int8.py, panel_nf4.py, panel_bf16.py: the default), or Int8 with
activations rounded to 16-bit integers (vnni.py, `exact = false`): each its weight form,
whose matrices are of a subclass of `Int8Panels`, `Nf4Panels` or `Bf16Panels` of its own.

`panel_product` is the loop they all run: each task a share of the panels, each panel's
block of weights (6 KiB of Int8, in L1) against up to GROUP_ROWS rows of x in register
blocks of 8, 4, 2 and 1 rows. A row's result is the same to the bit whichever register
block took it, so it does not depend on the other rows of its step or on its prompt's
chunking.
"""

from __future__ import annotations

import functools
from typing import NamedTuple

import numpy as np

from . import intrinsics, vector_dots
from .jit import launch, read_only

INT8_BLOCK = 128  # quant.py's Int8 block (not imported: forms.py imports this module, and quant.py is deep)
PANEL = 48  # weight rows a panel: panels_ir's 3 vectors of 16
CACHE_LINE = 64
# Rows of x the kernel takes through all the weight blocks before the next rows: their
# totals (24 KiB) stay in L1 and their x in L2.
GROUP_ROWS = 128
# A launch's share-outs of the panels, each with its totals: one a panel allocated 1,366 of
# them for a 65,536-row head at every decoding step.
MAX_TASKS = 64


def panelled(pairs: np.ndarray, scales: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A matrix's pairs of inputs [N, K/2, width] and block scales [N, blocks, count] in
    panels: [panels, K/2, width · PANEL], pair p of each of a panel's rows side by side,
    and [panels, blocks, count, PANEL], a panel's rows side by side. Rows past N are zero.
    Written a panel at a time: no whole copy of the matrix on the way (a 1.5B model's bf16
    head is 256 MiB)."""
    rows, n_pairs, width = pairs.shape
    panels = -(-rows // PANEL)
    q = zeros_on_lines((panels, n_pairs, width * PANEL), pairs.dtype)
    kept_scales = np.zeros((panels, *scales.shape[1:], PANEL), scales.dtype)
    for p in range(panels):
        part = slice(p * PANEL, (p + 1) * PANEL)
        count = len(pairs[part])
        q[p].reshape(n_pairs, PANEL, width)[:, :count] = pairs[part].transpose(1, 0, 2)
        kept_scales[p, ..., :count] = scales[part].transpose(1, 2, 0)
    return read_only(q), read_only(kept_scales)


def zeros_on_lines(shape: tuple[int, ...], dtype) -> np.ndarray:
    """np.zeros starting on a cache line: numpy's large arrays start 16 bytes past one, and
    every other 64-byte load of a panel then spans two lines."""
    nbytes = int(np.prod(shape)) * np.dtype(dtype).itemsize
    raw = np.zeros(nbytes + CACHE_LINE, np.uint8)
    start = -raw.ctypes.data % CACHE_LINE
    return raw[start : start + nbytes].view(dtype).reshape(shape)


def in_rows(q: np.ndarray, scales: np.ndarray, rows: int) -> tuple[np.ndarray, np.ndarray]:
    """`panelled`'s arrays as rows again: bytes [N, K/2 · width], scales [N, blocks · count]."""
    panels, n_pairs = q.shape[:2]
    pairs = q.reshape(panels, n_pairs, PANEL, -1).transpose(0, 2, 1, 3).reshape(panels * PANEL, -1)
    scales = scales.transpose(0, 3, 1, 2).reshape(panels * PANEL, -1)
    return np.ascontiguousarray(pairs[:rows]), np.ascontiguousarray(scales[:rows])


class Int8Panels(NamedTuple):
    """An Int8 matrix of `rows` × K as the kernels read it (`panelled`): q [panels, K/G,
    G · PANEL] bytes, G = `GROUP` inputs of a row side by side (a pair; AMX's tiles take a
    quad), and bounds [panels, K/128, 2, PANEL], each block's low and high as fp16 bit
    patterns. A weight form's matrices are of a subclass of their own
    (panel_int8.PanelInt8, vnni.RoundedInt8): compiled code tells them apart by type, and
    the subclass's `of` makes one."""

    q: np.ndarray
    bounds: np.ndarray
    rows: int

    GROUP = 2  # inputs of a row side by side

    @property
    def shape(self) -> tuple[int, int]:
        return self.rows, self.q.shape[1] * self.q.shape[2] // PANEL

    @property
    def nbytes(self) -> int:
        return self.q.nbytes + self.bounds.nbytes

    @classmethod
    def of(cls, matrix):
        """An int8.PackedInt8 (q [N, K] bytes, bounds [N, 2·K/128]) in panels."""
        rows, cols = matrix.q.shape
        return cls(*panelled(matrix.q.reshape(rows, cols // cls.GROUP, cls.GROUP), matrix.bounds.reshape(rows, -1, 2)),
                   rows)

    @classmethod
    def like(cls, kept: Int8Panels):
        """Another form's panels as this one's: the same arrays where the layout is the same."""
        if kept.q.shape[2] == cls.GROUP * PANEL:
            return cls(*kept)
        q, bounds = kept.packed()
        return cls.of(_Rows(q, bounds))

    def packed(self) -> tuple[np.ndarray, np.ndarray]:
        """(q [N, K], bounds [N, 2·K/128]) in rows again, as int8.PackedInt8 holds them."""
        return in_rows(self.q, self.bounds, self.rows)


class _Rows(NamedTuple):
    """An Int8 matrix's bytes and bounds in rows, as int8.PackedInt8 holds them."""

    q: np.ndarray
    bounds: np.ndarray


class _Nf4Rows(NamedTuple):
    """An NF4 matrix's bytes, absmax and levels in rows, as nf4.PackedNF4 holds them."""

    q: np.ndarray
    absmax: np.ndarray
    levels: np.ndarray


class Bf16Panels(NamedTuple):
    """A bf16 matrix of `rows` × K as the kernels read it (`panelled`): q [panels, K/2,
    2 · PANEL] bit patterns (a row's pair of inputs, one 32-bit lane), and `scales`, none
    ([panels, K/64, 0, PANEL]: the loop's count of blocks). The form's matrices are
    panel_bf16.PanelBf16."""

    q: np.ndarray
    scales: np.ndarray
    rows: int

    BLOCK = 64  # inputs a block: panels_ir.Bf16Block's

    @property
    def shape(self) -> tuple[int, int]:
        return self.rows, 2 * self.q.shape[1]

    @property
    def nbytes(self) -> int:
        return self.q.nbytes

    @classmethod
    def of(cls, bits: np.ndarray):
        """A matrix's bf16 bit patterns [N, K] as uint16 in panels."""
        rows, cols = bits.shape
        no_scales = np.zeros((rows, cols // cls.BLOCK, 0), np.uint16)
        return cls(*panelled(bits.reshape(rows, cols // 2, 2), no_scales), rows)

    def packed(self) -> np.ndarray:
        """The bit patterns [N, K] in rows again."""
        return in_rows(self.q, self.scales, self.rows)[0]


class Nf4Panels(NamedTuple):
    """An NF4 matrix of `rows` × K as the kernels read it (`panelled`): q [panels, K/2,
    PANEL] bytes (a pair's two codes, the first in the low nibble), absmax [panels, K/64,
    1, PANEL] as fp16 bit patterns, and the 16 levels. The form's matrices are
    panel_nf4.PanelNF4; rounded_nf4.RoundedNF4 holds the same fields in row blocks."""

    q: np.ndarray
    absmax: np.ndarray
    rows: int
    levels: np.ndarray

    LAYOUT = "panels"  # how q and absmax hold the numbers: a form of another layout converts them

    @property
    def shape(self) -> tuple[int, int]:
        return self.rows, 2 * self.q.shape[1]

    @property
    def nbytes(self) -> int:
        return self.q.nbytes + self.absmax.nbytes

    @classmethod
    def of(cls, matrix):
        """An nf4.PackedNF4 (q [N, K/2] bytes, absmax [N, K/64]) in panels."""
        rows, pairs = matrix.q.shape
        q, absmax = panelled(matrix.q.reshape(rows, pairs, 1), matrix.absmax.reshape(rows, -1, 1))
        return cls(q, absmax, rows, matrix.levels)

    @classmethod
    def like(cls, kept: Nf4Panels):
        """Another NF4 form's matrix as this one's: the same arrays where the layout is the same."""
        if kept.LAYOUT == cls.LAYOUT:
            return cls(*kept)
        q, absmax = kept.packed()
        return cls.of(_Nf4Rows(q, absmax, kept.levels))

    def packed(self) -> tuple[np.ndarray, np.ndarray]:
        """(q [N, K/2], absmax [N, K/64]) in rows again, as nf4.PackedNF4 holds them."""
        return in_rows(self.q, self.absmax, self.rows)


# Module-level kernels, compiled below where numba and AVX-512 are (skinny.py says why not nested).
prange = range
block8 = block4 = block2 = block1 = None


def panel_product(q, scales, x_parts, out):  # pragma: no cover - compiled by numba
    """out = x · Wᵀ for W's panels (q, and its blocks' scales) and x as x_parts (one of
    panels_ir.py's kinds)."""
    panels = q.shape[0]
    M, N = out.shape
    blocks = scales.shape[1]
    tasks = min(panels, MAX_TASKS)
    for task in prange(tasks):
        totals = np.empty((min(M, GROUP_ROWS), PANEL), dtype=np.float32)
        for p in range(task * panels // tasks, (task + 1) * panels // tasks):
            panel, panel_scales = q[p], scales[p]
            first = p * PANEL
            for group in range(0, M, GROUP_ROWS):
                last = min(M, group + GROUP_ROWS)
                totals[:] = 0
                for b in range(blocks):
                    j = group
                    while j + 8 <= last:
                        block8(panel, panel_scales, x_parts, b, j, group, totals)
                        j += 8
                    if j + 4 <= last:
                        block4(panel, panel_scales, x_parts, b, j, group, totals)
                        j += 4
                    if j + 2 <= last:
                        block2(panel, panel_scales, x_parts, b, j, group, totals)
                        j += 2
                    if j < last:
                        block1(panel, panel_scales, x_parts, b, j, group, totals)
                for m in range(group, last):
                    for o in range(min(PANEL, N - first)):
                        out[m, first + o] = totals[m - group, o]


def matmul(entry, x: np.ndarray, w: Int8Panels | Nf4Panels | Bf16Panels) -> np.ndarray:
    """x [M, K] · Wᵀ → [M, N] through a form's compiled `entry(W, x, out)`."""
    x = np.ascontiguousarray(x, dtype=np.float32)
    out = np.empty((x.shape[0], w.shape[0]), dtype=np.float32)
    launch(entry, w, x, out)
    return out


def pack_for(kind: type):
    """A panel form's `pack`: the panels a model keeps a matrix in (forms.Panelled) where
    they are of this form's `kind`, else None."""
    def pack(matrix):
        kept = getattr(matrix, "panels", None)
        return kept if type(kept) is kind else None
    return pack


def compile_form(product, entry, prepare=None) -> tuple | None:
    """A panel form's kernels, compiled without fast-math: `product(W, x, out)` for compiled
    callers, `entry(W, x, out)` for Python's, and `prepare` (x made ready for the blocks,
    row by row) in the calling thread and on the cores; None without numba or AVX-512. The
    module's `prange` must be this module's by then."""
    if exact_jit is None:
        return None
    compiled = exact_jit(parallel=False)(product), exact_jit(parallel=False)(entry)
    if prepare is None:
        return compiled
    # Rows in turn in the calling thread for a decoding step's few rows (no launch on the
    # cores); the same code, so the same bits.
    return *compiled, exact_jit(parallel=False, inline="always")(prepare), exact_jit()(prepare)


@functools.cache
def available() -> bool:
    """Whether numba compiles for a CPU with AVX-512 (this one, or NUMBA_CPU_FEATURES')."""
    features = vector_dots.cpu_features()
    return exact_jit is not None and bool(features.get("avx512f") and features.get("avx512bw"))


def available_with(feature: str) -> bool:
    """Whether numba compiles for a CPU with AVX-512 and `feature` (LLVM's name, e.g.
    avx512vnni): the rounded forms' instructions."""
    return available() and bool(vector_dots.cpu_features().get(feature))


def _build():
    """The compilers of the panels' kernels (jit, prange), or None without numba or AVX-512."""
    built = intrinsics.build()
    if built is None or vector_dots.vector_width() != 16:
        return None
    from numba.extending import intrinsic

    from . import panels_ir  # needs numba, configured by intrinsics.build() above

    global prange, block8, block4, block2, block1, panel_product
    prange = built.prange
    block8, block4, block2, block1 = (intrinsic(panels_ir.panel_block(rows)) for rows in (8, 4, 2, 1))
    # No fast-math flags: numba would put them on the kernels' IR too, and LLVM then
    # reassociates each kernel's fold its own way (the bits differed between row counts).
    exact = functools.partial(built.jit, fastmath=False)
    panel_product = exact()(panel_product)
    return exact


exact_jit = _build()  # numba.njit without fast-math, for the kernels calling panel_product (panel_int8.py, vnni.py)
