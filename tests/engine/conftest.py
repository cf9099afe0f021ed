"""Fixtures of the engine tier: the model code, its kernels and its file loaders."""

from __future__ import annotations

from pathlib import Path

import pytest
from markers import mark_slow

from ai00_like.rwkv.cpu import blocks, model, ops

HERE = Path(__file__).resolve().parent


@pytest.fixture
def numpy_only(monkeypatch):
    """The engine as it runs without numba: wkv.py's chunked recurrences and BLAS for decoding
    batches. Fails the test if the numpy recurrence never ran."""
    for module, name in ((blocks, "wkv5_segments"), (blocks, "chunk_heads"), (ops, "skinny_matmul"),
                         (model, "skinny_matmul")):
        monkeypatch.setattr(module, name, None)
    used = []
    for name in ("wkv5_sequence", "wkv7_sequence"):
        numpy_form = getattr(blocks, name)
        monkeypatch.setattr(blocks, name, lambda *a, f=numpy_form: used.append(1) or f(*a))
    yield
    assert used, "the numpy recurrence did not run"


# The tests of this tier that take a second or more (--durations of the whole suite, a 2-core
# machine): marked `slow`, so that `scripts/test.sh --fast` leaves them out. The full suite
# and CI run them all. A module's own first test, which starts its shared server, is not
# counted slow for that.
SLOW = {
    "test_arena.py": {
        'test_a_matrix_converted_at_load_is_written_into_huge_pages',
        'test_streamed_matrices_move_to_huge_pages_with_the_same_numbers',
    },
    "test_conformance.py": {
        'test_matches_golden_logits[v4-L3-D96-gpu]',
        'test_matches_golden_logits[v5.2-L3-D128-N64-gpu]',
        'test_matches_golden_logits[v6-L2-D64-N32-gpu]',
        'test_matches_golden_logits[v6-L3-D128-N64-gpu]',
        'test_matches_golden_logits[v6-L3-D128-N64-numpy]',
        'test_matches_golden_logits[v7-L2-D64-N32-gpu]',
        'test_matches_golden_logits[v7-L3-D128-N64-gpu]',
        'test_matches_golden_logits[v7-L4-D128-N32-gpu]',
        'test_matches_reference_live',
    },
    "test_demo_model.py": {
        'test_engine_matches_golden_reference_logits',
        'test_engine_matches_reference_live',
        'test_g1_tool_calls_name_an_offered_tool',
        'test_greedy_continuations_of_held_out_text_are_real_words',
    },
    "test_tokenizer_discovery.py": {
        'test_generate_refuses_the_demo_model_alone_in_one_line',
        'test_generate_finds_the_vocabulary_beside_the_model',
    },
    "test_file_forms.py": {
        'test_every_file_form_matches_the_reference',
    },
    "test_gpu.py": {
        'test_a_prefab_gives_the_same_logits_on_both_backends[int8-False]',
        'test_a_prefab_gives_the_same_logits_on_both_backends[nf4-True]',
        'test_load_model_picks_the_device',
        'test_long_prompts_run_in_chunks_with_the_same_result',
        'test_lower_precisions_stay_close_to_fp32',
        'test_matrices_larger_than_a_binding_are_split_by_rows',
        'test_matrix_vector_reductions_agree',
        'test_mixed_step_and_states_match_numpy_for_every_version[5.2]',
        'test_prompt_and_greedy_steps_match_numpy',
        'test_quantised_kernels_compute_with_the_dequantised_weights',
        'test_the_demo_model_runs_as_on_numpy',
    },
    "test_invariance.py": {
        'test_batch_of_unrelated_sequences_matches_alone',
        'test_chunking_does_not_change_logits',
        'test_reset_gives_a_fresh_state[5.0-numpy]',
        'test_reset_gives_a_fresh_state[5.1-numpy]',
        'test_reset_gives_a_fresh_state[5.2-numpy]',
        'test_reset_gives_a_fresh_state[6-numpy]',
        'test_reset_gives_a_fresh_state[7-numpy]',
        'test_saved_state_continues_identically[4-numpy]',
        'test_saved_state_continues_identically[5.0-numpy]',
        'test_saved_state_continues_identically[5.1-numpy]',
        'test_saved_state_continues_identically[5.2-gpu]',
        'test_saved_state_continues_identically[5.2-numpy]',
        'test_saved_state_continues_identically[6-gpu]',
        'test_saved_state_continues_identically[6-numpy]',
        'test_saved_state_continues_identically[7-numpy]',
        'test_without_numba_batches_and_chunks_change_nothing[7]',
    },
    "test_kernel_cache.py": {
        'test_a_change_to_a_module_a_kernel_inlines_compiles_it_again',
        'test_a_second_process_loads_every_kernel_from_the_cache',
    },
    "test_load_model.py": {
        'test_a_model_loaded_in_a_living_thread_leaves_no_kernel_workers_behind',
        'test_a_prompt_does_not_leave_the_embedding_resident',
        'test_any_storage_gives_the_model_of_its_widened_weights',
    },
    "test_loader.py": {
        'test_cli_convert',
        'test_torch_loads_what_we_write',
    },
    "test_one_row.py": {
        'test_one_row_steps_equal_the_layer_by_layer_ones[int8 prefab of layer 0]',
        'test_one_row_steps_equal_the_layer_by_layer_ones[nf4 prefab of layers 0-1]',
    },
    "test_packed_weights.py": {
        'test_the_vector_kernels_equal_the_scalar_ones[1-int8-640]',
        'test_the_vector_kernels_equal_the_scalar_ones[1-nf4-640]',
    },
    "test_resident_memory.py": {
        'test_a_state_slot_takes_memory_once_a_sequence_uses_it',
        'test_llvm_leaves_memory_once_the_kernels_are_loaded',
        'test_quantising_at_load_leaves_none_of_the_file_resident',
        'test_slots_start_from_a_nonzero_initial_state',
    },
    "test_skinny.py": {
        'test_the_vector_block_gives_the_loops_sums[4-bf16]',
        'test_the_vector_block_gives_the_loops_sums[4-fp16]',
        'test_the_vector_block_gives_the_loops_sums[4-fp32]',
    },
    "test_tokenizer.py": {
        'test_load_tokenizer_picks_by_file',
        'test_matches_naive_greedy_on_mixed_corpus',
        'test_matches_reference_trie_tokenizer',
    },
}


def pytest_collection_modifyitems(items):
    mark_slow(items, HERE, SLOW)
