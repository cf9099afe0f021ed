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
