"""The prefix state cache on its own: longest prefix, partitions, reservations, LRU budget."""

from __future__ import annotations

import numpy as np

from ai00_like.backend.state_cache import StateCache


class FakeState:
    def __init__(self, nbytes=100):
        self.nbytes = nbytes


def test_longest_cached_prefix_wins_and_partitions_are_separate():
    cache = StateCache(10_000)
    cache.insert("", [1, 2, 3], FakeState(), np.zeros(4, np.float32))
    cache.insert("", [1, 2, 3, 4, 5], FakeState(), np.zeros(4, np.float32))
    assert cache.lookup("", [1, 2, 3, 4, 5, 6]).length == 5
    assert cache.lookup("", [1, 2, 3, 9]).length == 3
    assert cache.lookup("", [2, 3]) is None
    assert cache.lookup("other", [1, 2, 3, 4, 5, 6]) is None


def test_a_checkpoint_without_logits_never_covers_a_whole_prompt():
    cache = StateCache(10_000)
    cache.insert("", [1, 2], FakeState(), np.zeros(4, np.float32))
    cache.insert("", [1, 2, 3, 4], FakeState())  # mid-prompt checkpoint: no logits
    assert cache.lookup("", [1, 2, 3, 4]).length == 2  # the next token needs logits
    assert cache.lookup("", [1, 2, 3, 4, 5]).length == 4


def test_reservation_is_found_then_filled_and_hands_over_its_waiters():
    cache = StateCache(10_000)
    entry = cache.reserve("", [7, 8, 9])
    assert cache.reserve("", [7, 8, 9]) is None
    found = cache.lookup("", [7, 8, 9])
    assert found is entry and not found.ready
    entry.waiters.append("w")
    assert cache.fill(entry, FakeState(), np.ones(3, np.float32)) == ["w"]
    assert cache.lookup("", [7, 8, 9]).ready


def test_abandoned_reservation_disappears():
    cache = StateCache(10_000)
    entry = cache.reserve("", [1])
    entry.waiters.append("w")
    assert cache.abandon(entry) == ["w"]
    assert cache.lookup("", [1]) is None and len(cache) == 0


def test_budget_evicts_least_recently_used():
    logits = np.zeros(4, np.float32)  # 16 bytes each
    cache = StateCache(400)
    cache.insert("", [1], FakeState(100), logits)
    cache.insert("", [2], FakeState(100), logits)
    cache.lookup("", [1])  # [1] is now the most recent
    cache.insert("", [3], FakeState(200), logits)
    assert cache.lookup("", [2]) is None
    assert cache.lookup("", [1]) is not None and cache.lookup("", [3]) is not None
    assert cache.bytes <= 400
