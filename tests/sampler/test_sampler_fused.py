"""The compiled sampler (sampler/fused.py) picks what the numpy path picks, row for row,
and leaves the same penalties behind; rows it cannot take go to the numpy path."""

from __future__ import annotations

import msgspec
import numpy as np
import pytest

from ai00_like.sampler import Nucleus, RequestSampler, SamplingOptions, Typical, fused, sample_batch

pytestmark = pytest.mark.skipif(not fused.fits(65536), reason="the compiled sampler needs numba")

VOCAB = 65536
CONFIGS = {
    "ai00 default": SamplingOptions(),
    "greedy with penalties": SamplingOptions(sampler=Nucleus(temperature=0.0)),
    "top_k 40, top_p 0.95, cool": SamplingOptions(sampler=Nucleus(top_k=40, top_p=0.95, temperature=0.7)),
    "top_k 512, no mass limit, hot": SamplingOptions(
        sampler=Nucleus(top_k=512, top_p=1.0, temperature=1.3, presence_penalty=0.0, frequency_penalty=0.0)),
    "no decay": SamplingOptions(sampler=Nucleus(top_k=64, top_p=0.8, penalty_decay=1.0)),
    "greedy Typical": SamplingOptions(sampler=Typical(temperature=0.0)),
}


def flat_logits(rng, rows: int, vocab: int = VOCAB) -> np.ndarray:
    """Logits with many plausible tokens, so top_p and top_k both cut inside the list."""
    return rng.normal(0.0, 2.5, (rows, vocab)).astype(np.float32)


def run(options_per_row, steps: int, logits, *, compiled: bool, monkeypatch, vocab: int = VOCAB):
    with monkeypatch.context() as patch:
        if not compiled:
            patch.setattr(fused, "fits", lambda vocab: False)
        samplers = [RequestSampler(msgspec.structs.replace(o, seed=i), vocab) for i, o in enumerate(options_per_row)]
        picked = [sample_batch(samplers, logits[step]).tokens for step in range(steps)]
    return np.array(picked), samplers


# The World vocabulary's width, and the demo model's (4,096: four tokens a block).
@pytest.mark.parametrize("vocab", [VOCAB, 4096])
@pytest.mark.parametrize("rows", [12, 1], ids=["batch", "one row"])
@pytest.mark.parametrize("name", CONFIGS)
def test_same_tokens_and_penalties_as_numpy(name, rows, vocab, monkeypatch):
    rng = np.random.default_rng(7)
    steps = 6 if rows > 1 else 24  # one row: its own path (fused.sample_one), over more steps
    logits = [flat_logits(rng, rows, vocab) for _ in range(steps)]
    options = [CONFIGS[name]] * rows
    fast, fast_samplers = run(options, steps, logits, compiled=True, monkeypatch=monkeypatch, vocab=vocab)
    slow, slow_samplers = run(options, steps, logits, compiled=False, monkeypatch=monkeypatch, vocab=vocab)
    np.testing.assert_array_equal(fast, slow)
    assert len(set(fast[:, 0].tolist())) > 3  # the rows really sampled (or steps: one row), not one argmax
    for a, b in zip(fast_samplers, slow_samplers):
        if a.penalties is not None:
            np.testing.assert_allclose(a.penalties.values, b.penalties.values, rtol=1e-6)
            np.testing.assert_array_equal(a.penalties.seen, b.penalties.seen)


def test_kernel_takes_the_plain_rows_and_leaves_the_rest(monkeypatch):
    """Plain rows run compiled; logprobs, logit_bias, Typical and a non-finite row run in
    numpy; every row gets what it gets when sampled alone."""
    rng = np.random.default_rng(3)
    logits = flat_logits(rng, 6)
    logits[4, 17] = np.nan
    options = [SamplingOptions(), SamplingOptions(logprobs=True, top_logprobs=3),
               SamplingOptions(logit_bias={5: 100.0}), SamplingOptions(sampler=Typical()),
               SamplingOptions(sampler=Nucleus(temperature=0.0)), SamplingOptions(sampler=Nucleus(top_k=8))]
    samplers = [RequestSampler(msgspec.structs.replace(o, seed=i), VOCAB) for i, o in enumerate(options)]
    assert [s.fused_top_k() for s in samplers] == [128, 0, 0, 0, 1, 8]
    calls = []
    kernel_sample = fused.sample
    monkeypatch.setattr(fused, "sample", lambda rows, *a: calls.append(len(rows)) or kernel_sample(rows, *a))
    together = sample_batch(samplers, logits)
    assert calls == [3]  # rows 0, 4 and 5; row 4 is sent back for its NaN
    assert together.tokens[2] == 5
    assert len(together.top_logprobs[1]) == 3
    for i, o in enumerate(options):
        alone = sample_batch([RequestSampler(msgspec.structs.replace(o, seed=i), VOCAB)], logits[i : i + 1])
        assert alone.tokens[0] == together.tokens[i], i


def test_ties_go_to_the_lowest_token_id():
    logits = np.full((2, VOCAB), -5.0, dtype=np.float32)
    logits[:, [40000, 3000, 9000]] = 4.0
    greedy = RequestSampler(SamplingOptions(sampler=Nucleus(temperature=0.0)), VOCAB)
    first_only = RequestSampler(SamplingOptions(sampler=Nucleus(top_k=2, top_p=0.0)), VOCAB)
    assert sample_batch([greedy, first_only], logits).tokens.tolist() == [3000, 3000]


def test_rows_given_as_a_list_of_views(monkeypatch):
    """The serving loop hands over the model's rows as they are: views, read-only ones too."""
    rng = np.random.default_rng(5)
    logits = flat_logits(rng, 4)
    frozen = logits.copy()
    frozen.flags.writeable = False
    rows = [logits[0], frozen[1], logits[2][::1], frozen[3]]
    picked, _ = run([SamplingOptions()] * 4, 1, [rows], compiled=True, monkeypatch=monkeypatch)
    expected, _ = run([SamplingOptions()] * 4, 1, [logits], compiled=False, monkeypatch=monkeypatch)
    np.testing.assert_array_equal(picked, expected)
    np.testing.assert_array_equal(frozen, logits)  # not modified
    # A lone read-only row (a cached prompt's logits) too.
    alone, _ = run([SamplingOptions()], 1, [[frozen[1]]], compiled=True, monkeypatch=monkeypatch)
    expected, _ = run([SamplingOptions()], 1, [[logits[1]]], compiled=False, monkeypatch=monkeypatch)
    np.testing.assert_array_equal(alone, expected)
