"""The unpacked decoding-batch product (rwkv/cpu/skinny.py) against float64 numpy."""

from __future__ import annotations

import numpy as np
import pytest

from ai00_like.rwkv.cpu import ops
from ai00_like.rwkv.cpu.skinny import skinny_matmul

pytestmark = pytest.mark.skipif(skinny_matmul is None, reason="numba is not installed")


@pytest.mark.parametrize("rows", [2, 3, 4, 5, 7, 16, 33, 64])
@pytest.mark.parametrize("out_dim,in_dim", [(768, 256), (13, 70), (4, 1), (1, 9)])
def test_matches_a_float64_product(rows, out_dim, in_dim):
    rng = np.random.default_rng(rows * 1000 + out_dim)
    x = rng.standard_normal((rows, in_dim), dtype=np.float32)
    w = rng.standard_normal((out_dim, in_dim), dtype=np.float32)
    got = skinny_matmul(x, w)
    want = x.astype(np.float64) @ w.astype(np.float64).T
    assert got.shape == (rows, out_dim) and got.dtype == np.float32
    # fp32 sums of `in_dim` products: error grows like sqrt(in_dim) ulps of the terms' scale
    assert np.abs(got - want).max() <= 1e-5 * np.sqrt(in_dim) * np.abs(x).max() * np.abs(w).max() * 4


def test_nan_and_inf_propagate_as_through_blas():
    x = np.ones((4, 8), dtype=np.float32)
    w = np.ones((8, 8), dtype=np.float32)
    x[1, 3], w[5, 0] = np.nan, np.inf
    got = skinny_matmul(x, w)
    want = x @ w.T
    assert np.array_equal(np.isnan(got), np.isnan(want)) and np.array_equal(np.isinf(got), np.isinf(want))


def test_linear_uses_it_for_a_decoding_batch_only(monkeypatch):
    calls = []
    monkeypatch.setattr(ops, "skinny_matmul", lambda x, w: calls.append(x.shape[0]) or x @ w.T)
    w = np.ones((8, 8), dtype=np.float32)
    for rows in (1, 2, ops.SKINNY_ROWS, ops.SKINNY_ROWS + 1):
        ops.linear(np.ones((rows, 8), dtype=np.float32), w)
    assert calls == [2, ops.SKINNY_ROWS]


def test_decoding_steps_run_on_numba_threads_and_a_prefill_on_blas_threads(monkeypatch):
    """A decoding step's products run in numba's kernels with BLAS on one thread (spinning
    OpenBLAS threads made a 1-row step 5x slower); a prefill chunk's run in BLAS on all of
    its threads with numba on one. A run of decoding steps leaves BLAS's count alone:
    setting it costs tens of microseconds a call right after a step."""
    import numba
    from threadpoolctl import threadpool_info

    from ai00_like.rwkv.batch import StepInput
    from engine_helpers import synthetic_model

    def blas_threads():
        return tuple(i["num_threads"] for i in threadpool_info() if i["user_api"] == "blas")

    ops._blas.use(None)  # BLAS's own count, whatever earlier steps in this process left
    at_start = blas_threads()
    model = synthetic_model("7", max_batch=2, n_layer=1, n_embd=64, head_size=32, vocab=300, seed=3)
    seen, changes = [], []
    layers, use = model._layers, ops._blas.use
    monkeypatch.setattr(model, "_layers", lambda ids, *a: seen.append((len(ids), blas_threads(),
                                                                       numba.get_num_threads())) or layers(ids, *a))
    monkeypatch.setattr(ops._blas, "use", lambda n: changes.append(n) or use(n))
    prompt = list(range(1, ops.SKINNY_ROWS + 10))
    model.forward(prompt)
    for token in (5, 6, 7):
        model.step([StepInput(0, [token]), StepInput(1, [token])])
    model.forward(prompt)
    prefill = (len(prompt), at_start, 1)
    decode = (2, (1,) * len(at_start), numba.config.NUMBA_NUM_THREADS)
    assert seen == [prefill, decode, decode, decode, prefill]
    assert numba.get_num_threads() == numba.config.NUMBA_NUM_THREADS
    # Asked for at each step's layers and head (a prompt's head is one row: a decoding product).
    assert changes == [None, 1, 1, 1, 1, 1, 1, 1, None, 1]


def test_blas_threads_are_set_only_when_they_change():
    class Library:
        num_threads = 2

        def set_num_threads(self, n):
            calls.append(n)

    calls = []
    blas = ops._BlasThreads()
    blas._libraries, blas._default, blas._now = [Library()], [2], [2]
    for threads in (None, 1, 1, 1, None, None, 1):
        blas.use(threads)
    assert calls == [1, 2, 1]


# ------------------------------------------------------------------ 16-bit weights, widened as read


def _bf16(w: np.ndarray) -> np.ndarray:
    """Round-to-nearest-even bf16 of float32 `w`, as the BF16 bit patterns a .pth file holds."""
    from ai00_like.rwkv.formats import f32_to_bf16

    return f32_to_bf16(w)


@pytest.mark.parametrize("in_dim", [7168, 7167])
@pytest.mark.parametrize("store", ["fp32", "bf16", "fp16"])
def test_a_long_row_of_x_is_multiplied_four_weight_rows_at_a_time(store, in_dim):
    # A row of x longer than ROW_X_BYTES (a 1.5B model's FFN value matrix takes 7,168
    # inputs) is read once for every four weight rows; 37 outputs end on a block of one
    # (and bf16's pairs of weights on an odd one out with 7,167 inputs).
    from ai00_like.rwkv.cpu.skinny import ROW_X_BYTES

    assert in_dim * 4 > ROW_X_BYTES
    rng = np.random.default_rng(11)
    x = rng.standard_normal((1, in_dim), dtype=np.float32)
    w32 = rng.standard_normal((37, in_dim), dtype=np.float32)
    w = {"fp32": w32, "bf16": _bf16(w32), "fp16": w32.astype(np.float16)}[store]
    got = ops.linear(x, w)
    want = x.astype(np.float64) @ _as_f64(w).T
    assert got.shape == (1, 37) and got.dtype == np.float32
    assert np.abs(got - want).max() <= 1e-5 * np.sqrt(in_dim) * np.abs(x).max() * np.abs(w32).max() * 4


@pytest.mark.parametrize("in_dim", [64, 9, 1])
@pytest.mark.parametrize("store", ["fp32", "bf16", "fp16"])
def test_weights_read_in_pairs_give_the_widened_product(store, in_dim):
    # bf16's one-row products read weights two by two (intrinsics.weight_pair: one 32-bit
    # word for bf16); the pairs of the other forms are the same two weights widened.
    from ai00_like.rwkv.cpu.skinny import kernel_view, pair_row_times_row

    rng = np.random.default_rng(in_dim)
    x = rng.standard_normal((1, in_dim), dtype=np.float32)
    w32 = rng.standard_normal((5, in_dim), dtype=np.float32)
    w = {"fp32": w32, "bf16": _bf16(w32), "fp16": w32.astype(np.float16)}[store]
    x_even, x_odd = np.ascontiguousarray(x[0, 0:in_dim - in_dim % 2:2]), np.ascontiguousarray(x[0, 1::2])
    got = np.zeros((1, 5), dtype=np.float32)
    for n in range(5):
        pair_row_times_row(kernel_view(w), n, x, x_even, x_odd, got, n)
    want = x.astype(np.float64) @ _as_f64(w).T
    assert np.abs(got - want).max() <= 1e-5 * np.sqrt(in_dim) * np.abs(x).max() * np.abs(w32).max() * 4


def _as_f64(w: np.ndarray) -> np.ndarray:
    from ai00_like.rwkv.formats import as_float

    return np.asarray(as_float(w), dtype=np.float64)


@pytest.mark.parametrize("store", ["bf16", "fp16"])
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 16, 64, 65, 300])
@pytest.mark.parametrize("out_dim,in_dim", [(768, 256), (13, 70), (1, 9), (600, 40)])
def test_linear_with_16_bit_weights_matches_their_widened_product(store, rows, out_dim, in_dim):
    # 1..64 rows go through the decode kernel, more through tiles widened for BLAS (300 rows
    # and 600 outputs cross a tile boundary when TILE_ROWS is small enough; see below).
    rng = np.random.default_rng(rows * 7 + out_dim)
    x = rng.standard_normal((rows, in_dim), dtype=np.float32)
    w32 = rng.standard_normal((out_dim, in_dim), dtype=np.float32)
    w = _bf16(w32) if store == "bf16" else w32.astype(np.float16)
    got = ops.linear(x, w)
    want = x.astype(np.float64) @ _as_f64(w).T
    assert got.shape == (rows, out_dim) and got.dtype == np.float32
    assert np.abs(got - want).max() <= 1e-5 * np.sqrt(in_dim) * np.abs(x).max() * np.abs(w32).max() * 4


def test_prefill_tiles_cover_every_row(monkeypatch):
    monkeypatch.setattr(ops, "TILE_ROWS", 7)  # 100 outputs: 14 full tiles and a last one of 2
    rng = np.random.default_rng(3)
    x = rng.standard_normal((80, 24), dtype=np.float32)
    w = rng.standard_normal((100, 24), dtype=np.float32).astype(np.float16)
    want = x.astype(np.float64) @ w.astype(np.float64).T
    assert np.abs(ops.linear(x, w) - want).max() < 1e-4


def test_every_16_bit_pattern_widens_exactly():
    from ai00_like.rwkv.cpu.skinny import widen_rows
    from ai00_like.rwkv.formats import BF16, bf16_to_f32

    bits = np.arange(1 << 16, dtype=np.uint16).reshape(256, 256)
    for as_16, exact in [(bits.view(np.float16), bits.view(np.float16).astype(np.float32)),
                         (bits.view(BF16), bf16_to_f32(bits.view(BF16)))]:
        got = widen_rows(as_16, np.empty((256, 256), dtype=np.float32))
        same = (got.view(np.uint32) == exact.view(np.uint32)) | (np.isnan(got) & np.isnan(exact))
        assert same.all(), f"{as_16.dtype}: {np.count_nonzero(~same)} patterns differ"


@pytest.mark.parametrize("store", ["fp32", "fp16", "bf16"])
def test_a_row_of_x_gets_the_same_sums_whichever_rows_share_its_product(store):
    """A decoding batch's rows go through the vector blocks 4 at a time (4 weight rows with
    AVX-512, 3 with AVX2), and the rows past the last 4 through a block of one row of x.
    Each row's sums run along K in the same lanes either way, so a request's logits do not
    depend on how many others share its step; and they are the float64 product's."""
    rng = np.random.default_rng(7)
    w32 = rng.standard_normal((40, 256), dtype=np.float32)  # tasks of 12 rows: the last one partial
    w = {"fp32": w32, "fp16": w32.astype(np.float16), "bf16": _bf16(w32)}[store]
    x = rng.standard_normal((16, 256), dtype=np.float32)
    full = skinny_matmul(x, w)
    assert np.abs(full - x.astype(np.float64) @ _as_f64(w).T).max() < 1e-4
    for rows in (2, 3, 5, 6, 7, 9, 13):
        for first in (0, 16 - rows):
            np.testing.assert_array_equal(skinny_matmul(x[first : first + rows], w), full[first : first + rows],
                                          err_msg=f"{rows} rows from {first}")
