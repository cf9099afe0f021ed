"""Small numpy building blocks shared by every RWKV version (rwkv-spec §2.1)."""

from __future__ import annotations

import contextlib
import functools
import os
import threading

import numpy as np

from ..formats import as_float
from ..quant import QuantisedMatrix
from .batched import batched_matmul
from .int8 import PackedInt8, int8_matmul, int8_rows
from .nf4 import PackedNF4, nf4_matmul, nf4_rows
from .skinny import skinny_matmul, widen_rows

LN_EPS = 1e-5
GN_EPS = 64e-5  # GroupNorm(x/8, 1e-5) as trained == GroupNorm(x, 64e-5)


def layer_norm(x: np.ndarray, weight: np.ndarray, bias: np.ndarray, eps: float = LN_EPS) -> np.ndarray:
    mean = x.mean(axis=-1, keepdims=True)
    centred = x - mean
    var = np.einsum("...i,...i->...", centred, centred)[..., None] / x.shape[-1]
    return centred * (1.0 / np.sqrt(var + eps)) * weight + bias


def group_norm(x: np.ndarray, n_head: int, weight: np.ndarray, bias: np.ndarray, eps: float = GN_EPS) -> np.ndarray:
    """Normalise each head's slice of the last axis on its own, then one affine over all."""
    shape = x.shape
    grouped = x.reshape(*shape[:-1], n_head, shape[-1] // n_head)
    mean = grouped.mean(axis=-1, keepdims=True)
    centred = grouped - mean
    var = (centred * centred).mean(axis=-1, keepdims=True)
    return (centred / np.sqrt(var + eps)).reshape(shape) * weight + bias


def sigmoid(x: np.ndarray) -> np.ndarray:
    # 1/(1+e^-x) overflows harmlessly to 0 for very negative x; silence the warning only.
    with np.errstate(over="ignore"):
        return 1.0 / (1.0 + np.exp(-x))


def silu(x: np.ndarray) -> np.ndarray:
    return x * sigmoid(x)


SKINNY_ROWS = 64


def kernel_form(weight):
    """A projection in the form `linear` multiplies fastest: Int8 and NF4 blocks stay packed
    where the kernels read them (int8.py, nf4.py), others are dequantised to fp32."""
    if isinstance(weight, QuantisedMatrix):
        return PackedInt8.of(weight) or PackedNF4.of(weight) or np.asarray(weight, dtype=np.float32)
    return weight


# The packed forms: their direct product, and their rows widened to fp32 for a tile.
_PACKED = {PackedInt8: (int8_matmul, int8_rows), PackedNF4: (nf4_matmul, nf4_rows)}


def linear(x: np.ndarray, weight: np.ndarray | PackedInt8 | PackedNF4) -> np.ndarray:
    """x · Wᵀ for W stored [out, in] as in the checkpoints (no transposed copy is made).

    W is fp32, or fp16/bf16 kept at 16 bits (`keeps_16bit`), or packed Int8/NF4. A decoding
    step's rows (1 to SKINNY_ROWS) go through the unpacked kernel of skinny.py, which widens
    16-bit weights as it reads them; packed blocks through int8.py's and nf4.py's below
    PACKED_DIRECT_ROWS rows, batched.py's from there. Without numba, one fp32 row goes through BLAS's
    matrix–vector product, and a few rows through W · xᵀ, the weights as the left operand,
    which OpenBLAS runs about twice as fast as x · Wᵀ. A prefill chunk's many rows go
    through x · Wᵀ, which is faster there once the transposed copies are counted; 16-bit and packed W are widened a tile of rows at a time
    into a reused buffer for it (`_tiled_linear`).
    """
    rows = x.shape[0]
    if type(weight) in _PACKED:
        matmul, widen = _PACKED[type(weight)]
        if rows < PACKED_DIRECT_ROWS[type(weight)]:
            return matmul(x, weight)
        if rows <= SKINNY_ROWS:
            return batched_matmul(x, weight)
        return _tiled_linear(x, weight.shape, lambda first, out: widen(weight, first, out), TILE_ROWS, _blas_product)
    if weight.dtype != np.float32 and not keeps_16bit():
        weight = np.asarray(as_float(weight), dtype=np.float32)  # the model widens at load instead
    if weight.dtype != np.float32:
        if rows <= SKINNY_ROWS:
            return skinny_matmul(x, weight)
        return _tiled_linear(x, weight.shape, lambda first, out: widen_rows(weight[first : first + len(out)], out),
                             TILE_ROWS, _blas_product)
    if rows == 1 and not getattr(_cores, "numba", False):
        return (weight @ x[0])[None, :]
    if rows <= SKINNY_ROWS:
        if skinny_matmul is not None and weight.flags.c_contiguous:
            return skinny_matmul(x, weight)
        return np.ascontiguousarray((weight @ x.T).T)
    return x @ weight.T


def kernel_set(rows: int) -> tuple[bool, ...]:
    """Which of `linear`'s kernels a product of `rows` rows of x runs, as the thresholds it
    reaches: the first product of each set loads its kernels from numba's cache."""
    return tuple(rows >= threshold for threshold in (2, *PACKED_DIRECT_ROWS.values(), SKINNY_ROWS + 1))


def keeps_16bit() -> bool:
    """Whether fp16/bf16 weights can stay 16-bit: the kernels that read them need numba."""
    return skinny_matmul is not None


# Rows of a 16-bit or packed matrix widened at a time for a prefill product. Each tile is one
# x · tileᵀ product written straight into its columns of the result; smaller tiles cost
# more products (x is packed again for each), larger ones a larger buffer (768 inputs: 3 MB).
TILE_ROWS = 1024
# Below this many rows of x, packed weights are multiplied where they are stored (int8.py's
# and nf4.py's direct kernels, which widen each weight again for every 8 rows of x); from
# it, by batched.py's kernel, which widens each 4 weight rows once into an L1 scratch. On
# two Zen 4 cores, 3,072 × 768: at 4 rows direct 128 / 121-166 µs (Int8 / NF4) against
# 167 / 165, at 5 rows 233 / 192 against 198 / 195, at 16 rows 789 / 744 against 451 / 456.
# Without the vector kernels (no AVX2) the direct ones are slower still.
PACKED_DIRECT_ROWS = {PackedInt8: 5, PackedNF4: 5}
_tiles = threading.local()


def _blas_product(x: np.ndarray, tile: np.ndarray, out: np.ndarray) -> None:
    np.matmul(x, tile.T, out=out)


def _tiled_linear(x: np.ndarray, shape: tuple[int, int], widen_tile, tile_rows: int, product) -> np.ndarray:
    """x · Wᵀ → [rows, out] for W of `shape` stored narrower than fp32, `tile_rows` rows of W
    at a time: `widen_tile(first, out)` writes rows [first, first + len(out)) into `out`,
    `product(x, tile, out)` writes x · tileᵀ into the result's columns `out`."""
    n_out, n_in = shape
    buffer = getattr(_tiles, "buffer", None)
    if buffer is None or buffer.size < tile_rows * n_in:
        buffer = _tiles.buffer = np.empty(tile_rows * n_in, dtype=np.float32)
    out = np.empty((x.shape[0], n_out), dtype=np.float32)
    for start in range(0, n_out, tile_rows):
        count = min(tile_rows, n_out - start)
        tile = widen_tile(start, buffer[: count * n_in].reshape(count, n_in))
        product(x, tile, out[:, start : start + count])
    return out


_cores = threading.local()  # .numba: whether threads_for gave the step's cores to numba


class _BlasThreads:
    """BLAS's thread count, set through threadpoolctl only when it changes: a call reads
    /proc and walks the loaded libraries (about 12 µs, and 70–80 µs right after a decoding
    step has streamed the weights through every cache), and a step used to make four."""

    def __init__(self):
        self._libraries = None
        self._default = self._now = None

    def use(self, threads: int | None) -> None:
        """`threads` for BLAS from now on; None: as many as it had at the start."""
        if self._libraries is None:
            from threadpoolctl import ThreadpoolController

            self._libraries = ThreadpoolController().select(user_api="blas").lib_controllers
            self._default = self._now = [lib.num_threads for lib in self._libraries]
        wanted = self._default if threads is None else [threads] * len(self._libraries)
        if wanted != self._now:
            for lib, n in zip(self._libraries, wanted):
                lib.set_num_threads(n)
            self._now = wanted


_blas = _BlasThreads()


@contextlib.contextmanager
def threads_for(rows: int):
    """Who gets the two cores during a step of `rows` stacked tokens: BLAS or numba.

    OpenBLAS's threads spin for a while after each call, and numba's would fight them for
    the cores (measured: a 1-row decode step 5× slower with both on two threads). A
    decoding step (1..SKINNY_ROWS rows) does its products in numba's kernels, which read
    each weight row as it is stored: BLAS on one thread, numba on all. (For a single fp32
    row, OpenBLAS's matrix-vector product streamed the 0.1B shape's weights at about
    22 GB/s against the kernels' 27.) A prefill chunk does its products in BLAS: numba
    (the WKV kernel, the widening of 16-bit tiles) on one thread. BLAS keeps the count of
    the last step between steps, so a run of decoding steps changes nothing.
    """
    if skinny_matmul is None:
        yield
        return
    import numba

    if rows <= SKINNY_ROWS:
        _blas.use(1)
        _cores.numba = True
        try:
            yield
        finally:
            _cores.numba = False
        return
    _blas.use(None)
    numba_threads = numba.get_num_threads()
    numba.set_num_threads(1)
    try:
        yield
    finally:
        numba.set_num_threads(numba_threads)


def token_shift(z: np.ndarray, shift_state: np.ndarray, plan) -> np.ndarray:
    """The previous token's normalised input for every stacked row (rwkv-spec §2.1, §4.2).

    Within a segment it is the row above; a segment's first row takes the slot's saved
    row. The slot then saves the segment's last row for the next step.
    """
    prev = np.empty_like(z)
    prev[1:] = z[:-1]
    prev[plan.first_rows] = shift_state[plan.slots]
    shift_state[plan.slots] = z[plan.last_rows]
    return prev


# OpenBLAS kernel sets that use AVX-512 (the others top out at AVX2).
_AVX512_CORETYPES = {"skylakex", "cooperlake", "sapphirerapids", "zen4", "zen5"}


@functools.cache
def pinned_blas_note() -> str | None:
    """A warning when OPENBLAS_CORETYPE holds OpenBLAS to AVX2 kernels on an AVX-512 CPU.

    The variable overrides OpenBLAS's own CPU detection and can only be read before
    numpy loads, so all we can do is say so: on such a CPU the AVX-512 kernels run the
    prefill's matrix products about 1.7× faster.
    """
    pinned = os.environ.get("OPENBLAS_CORETYPE", "").strip()
    if not pinned or pinned.lower() in _AVX512_CORETYPES:
        return None
    try:
        with open("/proc/cpuinfo") as f:
            has_avx512 = any(line.startswith("flags") and " avx512f" in line for line in f)
    except OSError:
        return None
    if not has_avx512:
        return None
    return (f"OPENBLAS_CORETYPE={pinned} keeps numpy's OpenBLAS on kernels without AVX-512 on this "
            "AVX-512 CPU: prompts are processed about 1.7x slower than with it unset")
