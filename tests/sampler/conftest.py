"""The sampler tier: sampling, penalties and grammars (ai00_like/sampler), on logits made in
the tests themselves; no model, no server. Its modules share no fixture yet: one used by
several of them belongs here."""

from __future__ import annotations

from pathlib import Path

from markers import mark_slow

HERE = Path(__file__).resolve().parent


# The tests of this tier that take a second or more (--durations of the whole suite, a 2-core
# machine): marked `slow`, so that `scripts/test.sh --fast` leaves them out. The full suite
# and CI run them all. A module's own first test, which starts its shared server, is not
# counted slow for that.
SLOW = {
    "test_sampler.py": {
        'test_mirostat_keeps_tokens_up_to_the_first_surprising_one_and_updates_its_threshold',
        'test_nucleus_frequencies_match_truncated_tempered_distribution',
        'test_seeded_request_is_reproducible_whatever_shares_its_batch',
    },
}


def pytest_collection_modifyitems(items):
    mark_slow(items, HERE, SLOW)
