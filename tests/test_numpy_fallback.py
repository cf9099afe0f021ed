"""Without numba the engine runs on numpy and BLAS alone (wkv.py's chunked recurrences, BLAS
for decoding batches): the same conformance and invariance as with the compiled kernels."""

from __future__ import annotations

import pytest

import test_conformance
import test_invariance
from ai00_like.rwkv.cpu import blocks, model, ops


@pytest.fixture(autouse=True)
def without_numba(monkeypatch):
    for module, name in ((blocks, "wkv7_segments"), (ops, "skinny_matmul"), (model, "skinny_matmul")):
        monkeypatch.setattr(module, name, None)
    used = []
    sequence = blocks.wkv7_sequence
    monkeypatch.setattr(blocks, "wkv7_sequence", lambda *a: used.append(1) or sequence(*a))
    yield
    assert used, "the numpy recurrence did not run"


@pytest.mark.parametrize("name", [n for n in sorted(test_conformance.CASES) if n.startswith("v7")])
def test_v7_matches_golden_logits(name):
    test_conformance.test_matches_golden_logits(name)


def test_v7_batch_of_unrelated_sequences_matches_alone():
    test_invariance.test_batch_of_unrelated_sequences_matches_alone("7")


def test_v7_chunking_does_not_change_logits():
    test_invariance.test_chunking_does_not_change_logits("7")
