"""Small numpy building blocks shared by every RWKV version (rwkv-spec §2.1), and `linear`,
the product with a projection in whichever weight form (forms.py) it is kept."""

from __future__ import annotations

import contextlib
import functools
import os
import threading

import numpy as np

from ..formats import as_float
from .batched import batched_matmul
from .jit import kernels_on
from .forms import DENSE, FORMS, form_of, kernel_form  # noqa: F401 - kernel_form: with linear, for the blocks
from .skinny import SKINNY_ROWS, skinny_matmul


def sigmoid(x: np.ndarray) -> np.ndarray:
    # 1/(1+e^-x) overflows harmlessly to 0 for very negative x; silence the warning only.
    with np.errstate(over="ignore"):
        return 1.0 / (1.0 + np.exp(-x))


def silu(x: np.ndarray) -> np.ndarray:
    return x * sigmoid(x)


def linear(x: np.ndarray, weight) -> np.ndarray:
    """x · Wᵀ for W stored [out, in] as in the checkpoints (no transposed copy is made).

    W is in one of the weight forms of forms.py: fp32, or fp16/bf16 kept at 16 bits
    (`keeps_16bit`), or packed Int8/NF4. A decoding step's rows (1 to SKINNY_ROWS) go
    through the form's direct kernel below its `direct_rows`, batched.py's from there
    (16-bit weights: skinny.py's, which widens them as it reads them). Without numba, one
    fp32 row goes through BLAS's matrix–vector product, and a few rows through W · xᵀ, the
    weights as the left operand, which OpenBLAS runs about twice as fast as x · Wᵀ. A
    prefill chunk's many rows go through x · Wᵀ, which is faster there once the transposed
    copies are counted; 16-bit and packed W are widened a tile of rows at a time into a
    reused buffer for it (`_tiled_linear`), except in a chunk short enough that
    `threads_for` gave numba the cores (COMPILED_ROWS): its products stay in the kernels.
    """
    form = form_of(weight)
    if form is DENSE and weight.dtype != np.float32 and not (keeps_16bit() and kernels_on()):
        weight = np.asarray(as_float(weight), dtype=np.float32)  # the model widens at load instead
    if form is DENSE and weight.dtype == np.float32:
        return _fp32_linear(x, weight)
    rows = x.shape[0]
    if rows > SKINNY_ROWS and not getattr(_cores, "numba", False) and form.widen is not None:
        return _tiled_linear(x, weight.shape, functools.partial(form.widen, weight), TILE_ROWS, _blas_product)
    if rows < form.direct_rows or form.widen_row is None:  # the latter: a form batched.py does not read
        return form.direct(x, weight)
    return batched_matmul(x, weight)


def _fp32_linear(x: np.ndarray, weight: np.ndarray) -> np.ndarray:
    rows = x.shape[0]
    if rows == 1 and not getattr(_cores, "numba", False):
        return (weight @ x[0])[None, :]
    if rows <= SKINNY_ROWS or getattr(_cores, "numba", False):
        if skinny_matmul is not None and weight.flags.c_contiguous and kernels_on():
            return skinny_matmul(x, weight)
        return np.ascontiguousarray((weight @ x.T).T)
    return x @ weight.T


def kernel_set(rows: int) -> tuple[bool, ...]:
    """Which of `linear`'s kernels a product of `rows` rows of x runs, as the thresholds it
    reaches: the first product of each set loads its kernels from numba's cache."""
    return tuple(rows >= threshold for threshold in (2, *PACKED_DIRECT_ROWS.values(), SKINNY_ROWS + 1))


# Where each packed form's decoding products go from its direct kernel to batched.py's.
PACKED_DIRECT_ROWS = {form.kind: form.direct_rows for form in FORMS if form.direct_rows <= SKINNY_ROWS}


def keeps_16bit() -> bool:
    """Whether fp16/bf16 weights can stay 16-bit: the kernels that read them need numba."""
    return skinny_matmul is not None


# Rows of a 16-bit or packed matrix widened at a time for a prefill product. Each tile is one
# x · tileᵀ product written straight into its columns of the result; smaller tiles cost
# more products (x is packed again for each), larger ones a larger buffer (768 inputs: 3 MB).
TILE_ROWS = 1024
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


# The most rows of a prompt's chunk that a model of 16-bit or packed weights multiplies in
# the compiled kernels, numba having the cores: there the widening of every tile for BLAS
# costs more than BLAS gains (1.5B bf16, a 128-token prompt on two Zen 3 cores: 31–34 →
# 36–41 tokens/s; 256 tokens about even, 0.1B too).
COMPILED_ROWS = 128


@contextlib.contextmanager
def threads_for(rows: int, compiled_rows: int = SKINNY_ROWS):
    """Who gets the two cores during a step of `rows` stacked tokens: BLAS or numba.

    OpenBLAS's threads spin for a while after each call, and numba's would fight them for
    the cores (measured: a 1-row decode step 5× slower with both on two threads). A
    decoding step (1..SKINNY_ROWS rows) does its products in numba's kernels, which read
    each weight row as it is stored: BLAS on one thread, numba on all. (For a single fp32
    row, OpenBLAS's matrix-vector product streamed the 0.1B shape's weights at about
    22 GB/s against the kernels' 27.) A prefill chunk does its products in BLAS: numba
    (the WKV kernel, the widening of 16-bit tiles) on one thread. BLAS keeps the count of
    the last step between steps, so a run of decoding steps changes nothing. A model whose
    weights BLAS would need widened keeps the products of up to `compiled_rows` rows
    (COMPILED_ROWS) in the compiled kernels too, and gives numba the cores for them.
    """
    if skinny_matmul is None or not kernels_on():
        yield
        return
    import numba

    if rows <= compiled_rows:
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
