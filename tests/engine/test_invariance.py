"""The same tokens give the same logits however they are chunked and batched, on both backends."""

from __future__ import annotations

import numpy as np
import pytest

from ai00_like.rwkv.batch import StepInput
from ai00_like.rwkv.cpu import blocks, forms, ops
from ai00_like.rwkv.cpu.model import CpuModel
from ai00_like.rwkv.cpu.ops import COMPILED_ROWS, SKINNY_ROWS
from ai00_like.rwkv.info import detect
from ai00_like.rwkv.quant import quantise_tensors
from ai00_like.rwkv.synthetic import make_checkpoint
from engine_helpers import BACKENDS, rel_err, synthetic_model

VERSIONS = ["4", "5.0", "5.1", "5.2", "6", "7"]
SAME = 1e-5


def same_for(version):
    """float32 products round a row's dot products differently depending on the kernel that
    runs them and how many rows share it (BLAS for one row or a prefill chunk, skinny.py for a
    few rows, the GPU's matrix–vector and tiled kernels); v5.0 (no gate, unsquashed
    receptance) amplifies that to ~5e-5 here, while the same chunks alone agree to 1e-6.
    Float64 products make all agree to 6e-7."""
    return 1e-4 if version == "5.0" else SAME


def model_for(version, max_batch=1, backend="numpy", head_size=32):
    return synthetic_model(version, max_batch=max_batch, backend=backend, n_layer=2, n_embd=2 * head_size,
                           head_size=head_size, vocab=500, seed=VERSIONS.index(version))


def tokens(seed, n, vocab=500):
    return np.random.default_rng(seed).integers(0, vocab, n).tolist()


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("version", VERSIONS)
def test_chunking_does_not_change_logits(version, backend):
    model = model_for(version, backend=backend)
    seq = tokens(1, 150)
    whole, _ = model.forward(seq, full_output=True)
    for chunk in (1, 7, 64):
        state, rows = None, []
        for start in range(0, len(seq), chunk):
            logits, state = model.forward(seq[start : start + chunk], state, full_output=True)
            rows.append(logits)
        assert rel_err(np.concatenate(rows), whole) < same_for(version), f"chunk {chunk}"


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("version", VERSIONS)
def test_batch_of_unrelated_sequences_matches_alone(version, backend):
    """8 slots with different lengths, prefilled in chunks and decoded together, in one step each."""
    model = model_for(version, max_batch=8, backend=backend)
    seqs = [tokens(10 + i, n) for i, n in enumerate([1, 5, 40, 77, 3, 120, 64, 9])]
    alone = [model.forward(s, full_output=True)[0] for s in seqs]
    # Feed every slot in chunks of a different size per slot, so prefill chunks and single
    # tokens of different slots share steps.
    pos = [0] * 8
    got = [[] for _ in range(8)]
    chunk = [1, 3, 16, 32, 1, 50, 64, 2]
    while any(p < len(s) for p, s in zip(pos, seqs)):
        inputs = []
        for slot, (p, s) in enumerate(zip(pos, seqs)):
            inputs.append(StepInput(slot, s[p : p + chunk[slot]], "all"))
            pos[slot] = min(len(s), p + chunk[slot])
        for slot, logits in enumerate(model.step(inputs)):
            if logits is not None:
                got[slot].append(logits)
    for slot in range(8):
        assert rel_err(np.concatenate(got[slot]), alone[slot]) < same_for(version), f"slot {slot}"


@pytest.mark.parametrize("version", ["5.2", "6", "7"])
def test_without_numba_batches_and_chunks_change_nothing(version, numpy_only):
    test_batch_of_unrelated_sequences_matches_alone(version, "numpy")
    test_chunking_does_not_change_logits(version, "numpy")


@pytest.mark.skipif(blocks.chunk_heads is None, reason="the compiled heads need numba")
@pytest.mark.parametrize("head_size", [32, 64])
def test_prompts_through_the_compiled_heads_match_numpys(monkeypatch, head_size):
    """A step with prompts runs v7's work between the products (the WKV's inputs, the
    recurrence, the gated heads) in one compiled call per layer; the numpy form, which runs
    while the kernels compile, must give the same logits and leave the same states. Heads
    of 64, every released model's, run a recurrence of their own (wkv7_ir.py)."""
    def run(heads):
        model = model_for("7", max_batch=3, head_size=head_size)
        monkeypatch.setattr(blocks, "chunk_heads", heads)
        prompts = [StepInput(0, tokens(20, 100), "all"), StepInput(1, tokens(21, 70), "all"), StepInput(2, [7], "all")]
        logits = model.step(prompts)
        logits += model.step([StepInput(slot, [slot + 3]) for slot in range(3)])  # from the states left
        return np.concatenate([np.atleast_2d(rows) for rows in logits])

    compiled_heads, calls = blocks.chunk_heads, []
    compiled = run(lambda *args: calls.append(1) or compiled_heads(*args))
    assert len(calls) == 2, "the compiled heads did not run on each layer's prompt step"
    assert rel_err(compiled, run(None)) < SAME


@pytest.mark.skipif(blocks.chunk_heads is None, reason="the compiled kernels need numba")
@pytest.mark.parametrize("kind", ["bf16", "nf4"])
def test_a_short_prompt_through_the_compiled_products_matches_blas(kind, monkeypatch):
    """A model of 16-bit or packed weights multiplies a chunk of up to COMPILED_ROWS rows in
    the compiled kernels (BLAS would need each tile widened first), a longer one in BLAS:
    the same prompt must give the same logits either way."""
    tensors = make_checkpoint("7", n_layer=2, n_embd=128, head_size=32, vocab=500, seed=5)
    info = detect({name: a.shape for name, a in tensors.items()})
    if kind == "nf4":
        # In rows, as without AVX-512: in panels every product stays compiled (test_panels.py).
        monkeypatch.setattr(forms, "panels_available", lambda: False)
        model = CpuModel(quantise_tensors(tensors, info.n_layer, "nf4"), info)
    else:
        model = CpuModel(tensors, info, precision="bf16")
    assert model.compiled_rows == COMPILED_ROWS
    widened = []
    tiled = ops._tiled_linear
    monkeypatch.setattr(ops, "_tiled_linear", lambda *args: widened.append(1) or tiled(*args))
    prompt = tokens(3, COMPILED_ROWS - 20)
    compiled, _ = model.forward(prompt, full_output=True)
    assert not widened, "a short prompt's products went to BLAS"
    model.compiled_rows = SKINNY_ROWS  # as a longer chunk's
    through_blas, _ = model.forward(prompt, full_output=True)
    assert widened
    assert rel_err(compiled, through_blas) < SAME


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("version", VERSIONS)
def test_saved_state_continues_identically(version, backend):
    model = model_for(version, max_batch=2, backend=backend)
    prefix, rest = tokens(3, 30), tokens(4, 20)
    model.step([StepInput(0, prefix, "none")])
    saved = model.read_state(0)
    want = model.step([StepInput(0, rest, "all")])[0]
    model.reset(0)
    model.write_state(1, saved)
    got = model.step([StepInput(1, rest, "all")])[0]
    np.testing.assert_array_equal(got, want)
    # and the single-sequence API continues from the same state
    np.testing.assert_allclose(model.forward(rest, saved, full_output=True)[0], want, rtol=0, atol=1e-5 * want.std())


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("version", VERSIONS)
def test_reset_gives_a_fresh_state(version, backend):
    model = model_for(version, max_batch=1, backend=backend)
    seq = tokens(5, 10)
    first = model.step([StepInput(0, seq)])[0]
    model.reset(0)
    np.testing.assert_array_equal(model.step([StepInput(0, seq)])[0], first)


@pytest.mark.parametrize("backend", BACKENDS)
def test_want_selects_logits(backend):
    model = model_for("7", max_batch=3, backend=backend)
    out = model.step([StepInput(0, [1, 2, 3], "all"), StepInput(1, [4, 5], "none"), StepInput(2, [6], "last"),])
    assert out[0].shape == (3, 500) and out[1] is None and out[2].shape == (500,)
    assert model.step([StepInput(0, [], "last")]) == [None]


@pytest.mark.parametrize("backend", BACKENDS)
def test_bad_step_inputs_are_refused(backend):
    model = model_for("7", max_batch=2, backend=backend)
    with pytest.raises(ValueError, match="slot"):
        model.step([StepInput(2, [1])])
    with pytest.raises(ValueError, match="twice"):
        model.step([StepInput(0, [1]), StepInput(0, [2])])
    with pytest.raises(ValueError, match="token ids"):
        model.step([StepInput(0, [500])])
