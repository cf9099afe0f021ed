"""Without numba the engine runs on numpy and BLAS alone (wkv.py's chunked recurrences, BLAS
for decoding batches): the same conformance and invariance as with the compiled kernels."""

from __future__ import annotations

import pytest
import test_conformance
import test_invariance

from ai00_like.rwkv.cpu import blocks, model, ops


@pytest.fixture(autouse=True)
def without_numba(monkeypatch):
    for module, name in ((blocks, "wkv5_segments"), (blocks, "wkv7_segments"), (ops, "skinny_matmul"),
                         (model, "skinny_matmul")):
        monkeypatch.setattr(module, name, None)
    used = []
    for name in ("wkv5_sequence", "wkv7_sequence"):
        numpy_form = getattr(blocks, name)
        monkeypatch.setattr(blocks, name, lambda *a, f=numpy_form: used.append(1) or f(*a))
    yield
    assert used, "the numpy recurrence did not run"


@pytest.mark.parametrize("name", [n for n in sorted(test_conformance.CASES) if n.startswith(("v5.2", "v6", "v7"))])
def test_matches_golden_logits(name):
    test_conformance.test_matches_golden_logits(name, "numpy")


@pytest.mark.parametrize("version", ["5.2", "6", "7"])
def test_batch_of_unrelated_sequences_matches_alone(version):
    test_invariance.test_batch_of_unrelated_sequences_matches_alone(version, "numpy")


@pytest.mark.parametrize("version", ["5.2", "6", "7"])
def test_chunking_does_not_change_logits(version):
    test_invariance.test_chunking_does_not_change_logits(version, "numpy")
