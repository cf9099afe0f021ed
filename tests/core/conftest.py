"""Fixtures of the core tier: the serving core (middleware and backend threads) driven
through its message API, without HTTP."""

from __future__ import annotations

from pathlib import Path

import pytest
from api_helpers import write_model
from markers import mark_slow

from ai00_like.middleware import Middleware

HERE = Path(__file__).resolve().parent


@pytest.fixture(scope="module")
def model_files(tmp_path_factory) -> tuple[str, str]:
    """Two tiny synthetic models of the World vocabulary: a v7 (a.st) and a v6 (b.st)."""
    d = tmp_path_factory.mktemp("models")
    return str(write_model(d / "a.st", seed=3)), str(write_model(d / "b.st", version="6", seed=4))


@pytest.fixture
def middleware():
    """A fresh middleware (its backend thread with no model loaded), closed after the test."""
    mw = Middleware()
    yield mw
    mw.close()


# The tests of this tier that take a second or more (--durations of the whole suite, a 2-core
# machine): marked `slow`, so that `scripts/test.sh --fast` leaves them out. The full suite
# and CI run them all. A module's own first test, which starts its shared server, is not
# counted slow for that.
SLOW = {
    "test_unload_releases_memory.py": {
        'test_unloading_a_gpu_model_frees_its_buffers',
    },
    "test_serving.py": {
        'test_a_prompt_sharing_part_of_a_long_one_resumes_from_the_deepest_checkpoint',
        'test_a_tokenizer_that_does_not_fit_the_model_is_a_clear_error',
        'test_admission_is_first_in_first_out',
        'test_choose_ranks_choices_by_perplexity',
        'test_concurrent_requests_match_each_alone',
        'test_embeddings_are_normalised_and_tell_texts_apart',
        'test_failed_load_keeps_the_old_model_serving',
        'test_initial_state_from_a_file_in_the_models_folder_or_inline',
        'test_long_prefill_does_not_stall_other_streams',
        'test_max_tokens_emits_the_last_tokens_text',
        'test_read_state_continues_like_the_whole_text',
        'test_reload_under_load_ends_running_requests_and_serves_new_ones',
    },
}


def pytest_collection_modifyitems(items):
    mark_slow(items, HERE, SLOW)
