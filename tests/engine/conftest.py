"""Fixtures of the engine tier: the model code, its kernels and its file loaders."""

from __future__ import annotations

import pytest

from ai00_like.rwkv.cpu import blocks, model, ops


@pytest.fixture
def numpy_only(monkeypatch):
    """The engine as it runs without numba: wkv.py's chunked recurrences and BLAS for decoding
    batches. Fails the test if the numpy recurrence never ran."""
    for module, name in ((blocks, "wkv5_segments"), (blocks, "wkv7_segments"), (ops, "skinny_matmul"),
                         (model, "skinny_matmul")):
        monkeypatch.setattr(module, name, None)
    used = []
    for name in ("wkv5_sequence", "wkv7_sequence"):
        numpy_form = getattr(blocks, name)
        monkeypatch.setattr(blocks, name, lambda *a, f=numpy_form: used.append(1) or f(*a))
    yield
    assert used, "the numpy recurrence did not run"
