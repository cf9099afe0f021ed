"""Fixtures of the API tier: the HTTP routes through real clients, each module's server in
this process (api_helpers.ServerThread, on a free loopback port).

A module defines its own `server` (its config is what it tests); `client` is the official
SDK pointed at whichever `server` the requesting module defines; `model_dir` (a folder of
the module's own with the tiny synthetic model) comes from tests/conftest.py."""

from __future__ import annotations

from pathlib import Path

import openai
import pytest
from api_helpers import ServerThread, config_for
from markers import mark_slow

HERE = Path(__file__).resolve().parent
DEMO = Path(__file__).resolve().parents[2] / "assets" / "models"  # the bundled demo model and its vocabulary


@pytest.fixture(scope="module")
def demo_server():
    """The bundled demo model (King James English) with its own vocabulary, batch 2."""
    tokenizer = f'[tokenizer]\npath = "{DEMO / "demo_vocab.txt"}"'
    with ServerThread(config_for(DEMO, tokenizer, model="demo.st", max_batch=2)) as s:
        yield s


@pytest.fixture(scope="module")
def client(server) -> openai.OpenAI:
    """The openai SDK on the module's `server`, without retries."""
    return openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0)


# The tests of this tier that take a second or more (--durations of the whole suite, a 2-core
# machine): marked `slow`, so that `scripts/test.sh --fast` leaves them out. The full suite
# and CI run them all. A module's own first test, which starts its shared server, is not
# counted slow for that.
SLOW = {
    "test_saved_states.py": {
        'test_a_restart_an_export_and_another_model',
        'test_without_a_store_the_routes_say_what_to_turn_on',
    },
    "test_many_models.py": {
        'test_every_model_is_listed_and_loads_on_first_use',
        'test_eight_concurrent_first_requests_load_the_model_once',
        'test_the_least_recently_used_idle_model_makes_room',
        'test_max_loaded_models_caps_the_count',
        'test_a_pinned_model_is_never_evicted',
        'test_a_busy_model_is_never_evicted',
        'test_keep_alive_zero_unloads_the_model_once_idle',
        'test_listings_and_health_checks_do_not_keep_a_model_alive',
        'test_unloading_under_load_loses_no_request',
        'test_two_models_stream_at_once_as_each_does_alone',
        'test_embeddings_and_stored_responses_stay_with_their_model',
    },
    "test_agents.py": {
        'test_a_conversation_continues_through_previous_response_id',
        'test_an_agent_calls_its_tool_and_answers',
        'test_langchain_bind_tools_with_a_forced_tool_round_trip',
    },
    "test_api_ai00.py": {
        'test_a_load_survives_its_client_disconnecting',
        'test_a_model_larger_than_the_free_memory_is_refused_with_the_sizes',
        'test_admin_key',
        'test_admin_load_swaps_the_model',
        'test_admin_save_writes_the_loaded_model_once',
        'test_admin_unload_then_load',
        'test_failed_load_keeps_the_old_model',
        'test_models_state_streams_the_status',
    },
    "test_api_config.py": {
        'test_ai00_like_without_a_command_serves',
        'test_model_ids_may_contain_slashes',
        'test_the_shipped_config_serves_the_demo_model',
        'test_the_pages_modules_are_all_served_as_javascript',
        'test_web_page_is_served_from_a_folder_or_zip',
    },
    "test_api_openai.py": {
        'test_chat_prompt_is_ai00s_template',
    },
    "test_defects.py": {
        'test_a_prompt_over_the_automatic_limit_is_400_saying_how_to_raise_it',
        'test_clients_that_leave_mid_stream_log_499_and_no_traceback',
        'test_max_prompt_tokens_minus_one_means_no_limit_and_a_number_is_used_as_given',
    },
    "test_fuzz.py": {
        'test_fuzzing_every_route_finds_no_server_error_and_no_hang',
    },
    "test_instructor.py": {
        'test_instructor_gets_its_object',
    },
    "test_operations.py": {
        'test_bodies_larger_than_the_limit_are_refused',
        'test_cors_answers_preflights_from_the_configured_origins',
        'test_cors_default_allows_only_the_servers_own_origins',
        'test_cors_star_allows_any_origin',
        'test_each_request_is_one_structured_log_line',
        'test_health_is_503_loading_while_the_model_loads_and_200_once_it_is_ready',
        'test_log_level_warning_hides_the_request_lines_that_info_shows',
        'test_metric_counters_survive_a_reload',
        'test_prompts_longer_than_the_limit_are_refused',
        'test_the_openai_client_sees_an_authentication_error',
        'test_tls_from_the_configured_certificate',
        'test_with_keys_set_nothing_but_health_and_the_page_answers_without_one',
        'test_without_an_admin_key_the_api_keys_guard_admin_routes',
    },
    "test_prefab.py": {
        'test_convert_writes_a_quantised_model',
        'test_quantised_logits_agree_between_the_backends',
        'test_saved_quantised_model_loads_back_without_quantising',
        'test_server_loads_quantised_and_saves_a_prefab',
        'test_the_head_quantised_is_kept_through_config_save_and_convert',
    },
    "test_response_trust.py": {
        'test_a_continuation_replies_as_the_explicit_history_does',
        'test_a_damaged_store_stops_the_start_with_one_line_or_is_left_off',
        'test_a_full_disk_keeps_the_reply_and_says_it_was_not_stored',
        'test_a_long_conversation_stores_each_turn_once',
        'test_a_read_only_store_is_one_line_naming_the_folder',
        'test_a_second_server_on_the_same_folder_is_refused',
        'test_records_expire_and_keep_within_their_cap',
    },
    "test_responses.py": {
        'test_a_server_without_a_store',
        'test_create_retrieve_list_delete',
        'test_the_store_survives_a_restart_and_keeps_its_cap',
    },
    "test_structured_output.py": {
        'test_auto_tool_choice_gives_text_or_valid_calls',
        'test_auto_tool_choice_with_a_response_format',
        'test_calls_released_together_stream_with_their_own_indices',
        'test_langchain_with_structured_output[synthetic]',
        'test_named_tool_choice_and_parallel_calls[demo]',
        'test_parallel_tool_calls_end_to_end',
        'test_parse_returns_a_pydantic_object',
    },
}


def pytest_collection_modifyitems(items):
    mark_slow(items, HERE, SLOW)
