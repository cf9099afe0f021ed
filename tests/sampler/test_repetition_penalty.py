"""The multiplicative repetition penalty (llama.cpp's `repeat_penalty`, vLLM's
`repetition_penalty`): which tokens it reaches (the last `window`, prompt included, each
once), its order with Ai00's penalties, that 1.0 changes nothing and that a row's result
does not depend on the rest of its batch."""

from __future__ import annotations

import msgspec
import numpy as np
import pytest

from ai00_like.api.errors import ApiError
from ai00_like.api.oai.generation import sampling_options
from ai00_like.api.oai.types import ChatCompletionRequest
from ai00_like.sampler import (
    Nucleus,
    RequestSampler,
    SamplerError,
    SamplingOptions,
    Typical,
    fused,
    options_from_openai,
    sample_batch,
)

VOCAB = 1000
SEEN, OTHER, THIRD = 5, 9, 12
GREEDY = Nucleus(temperature=0.0, presence_penalty=0.0, frequency_penalty=0.0)


def greedy(penalty: float = 1.0, window: int = 64, sampler=GREEDY) -> RequestSampler:
    options = SamplingOptions(sampler=sampler, repetition_penalty=penalty, repetition_window=window)
    return RequestSampler(options, VOCAB)


def favouring(seen_logit: float, other_logit: float) -> np.ndarray:
    """Logits where SEEN is the best token and OTHER the runner-up; the rest far below."""
    row = np.full(VOCAB, min(seen_logit, other_logit) - 5.0, dtype=np.float32)
    row[SEEN], row[OTHER] = seen_logit, other_logit
    return row


def pick(sampler: RequestSampler, row: np.ndarray) -> int:
    return int(sample_batch([sampler], row[None, :]).tokens[0])


@pytest.mark.parametrize(("seen_logit", "other_logit"), [(2.0, 1.8), (-1.0, -1.1)])
def test_a_recent_token_loses_to_the_runner_up(seen_logit, other_logit):
    """Positive logits are divided, negative ones multiplied: either way the seen token drops."""
    row = favouring(seen_logit, other_logit)
    plain, penalised = greedy(), greedy(1.25)
    for sampler in (plain, penalised):
        sampler.accept(SEEN)
    assert pick(plain, row) == SEEN
    assert pick(penalised, row) == OTHER


def test_the_prompts_tail_counts_but_not_beyond_the_window():
    row = favouring(2.0, 1.8)
    tail = greedy(1.25)
    tail.read_prompt([1, 2, SEEN, 3])
    assert pick(tail, row) == OTHER
    long_ago = greedy(1.25)
    long_ago.read_prompt([SEEN] + [1] * 64)  # SEEN is the 65th token back
    assert pick(long_ago, row) == SEEN
    whole = greedy(1.25, window=-1)
    whole.read_prompt([SEEN] + [1] * 1000)
    assert pick(whole, row) == OTHER
    off = greedy(1.25, window=0)
    off.read_prompt([SEEN])
    assert pick(off, row) == SEEN


def test_the_reply_slides_the_window():
    """The reply's own tokens push the prompt's out of the window: SEEN, penalised at the
    first step, is free at the second with a window of 3 and still penalised with 4."""
    row = favouring(2.0, 1.8)
    row[THIRD] = 1.7
    for window, second in ((3, SEEN), (4, THIRD)):
        sampler = greedy(1.25, window=window)
        sampler.read_prompt([SEEN, 1, 1])
        assert pick(sampler, row) == OTHER  # 2.0 / 1.25 = 1.6 < 1.8
        assert pick(sampler, row) == second  # OTHER is 1.44 now; SEEN 2.0 or 1.6 against 1.7


def test_each_distinct_token_is_penalised_once():
    """Three occurrences are penalised as one: 2.0 / 1.25 = 1.6 still beats 1.5 (three
    times over it would be 1.02)."""
    sampler = greedy(1.25)
    sampler.read_prompt([SEEN, SEEN, SEEN])
    assert pick(sampler, favouring(2.0, 1.5)) == SEEN


def test_it_comes_before_ai00s_penalties():
    """llama.cpp's order: 2.0 / 2 - 0.5 = 0.5 loses to 0.6; the other way round,
    (2.0 - 0.5) / 2 = 0.75 would win."""
    both = greedy(2.0, sampler=Nucleus(temperature=0.0, presence_penalty=0.5, frequency_penalty=0.0))
    both.accept(SEEN)
    assert pick(both, favouring(2.0, 0.6)) == OTHER


def test_clones_keep_their_own_window():
    row = favouring(2.0, 1.8)
    first = greedy(1.25)
    twin = first.clone(1)
    first.read_prompt([SEEN])
    assert pick(twin, row) == SEEN  # the first's prompt did not reach its clone
    assert pick(first, row) == OTHER


def sampled_run(options: SamplingOptions, logits: np.ndarray, *, prompt=(), company=()) -> list:
    """Tokens and logprobs of one row over the steps, sampled beside the `company` rows."""
    mine = RequestSampler(options, logits.shape[-1])
    mine.read_prompt(prompt)
    others = [RequestSampler(o, logits.shape[-1]) for o in company]
    out = []
    for step in logits:
        rows = np.concatenate([step[None, :], np.repeat(step[None, :] * 0.5, len(others), axis=0)])
        picked = sample_batch([mine, *others], rows)
        out.append((int(picked.tokens[0]), float(picked.logprobs[0])))
    return out


NUCLEUS = SamplingOptions(sampler=Nucleus(top_k=40, top_p=0.9, temperature=0.8), seed=11, logprobs=True)


def test_penalty_one_changes_nothing(monkeypatch):
    """1.0 gives bit-identical tokens and logprobs to no field at all, and the row keeps
    the compiled path; any other value leaves it for numpy."""
    logits = np.random.default_rng(1).normal(0, 2.5, (8, 65536)).astype(np.float32)
    fast = SamplingOptions(sampler=NUCLEUS.sampler, seed=11)
    assert RequestSampler(msgspec.structs.replace(fast, repetition_penalty=1.0), 65536).fused_top_k() == 40
    assert RequestSampler(msgspec.structs.replace(fast, repetition_penalty=1.1), 65536).fused_top_k() == 0
    off = msgspec.structs.replace(NUCLEUS, repetition_penalty=1.0, repetition_window=-1)
    assert sampled_run(off, logits, prompt=[1, 2, 3]) == sampled_run(NUCLEUS, logits, prompt=[1, 2, 3])


def test_a_penalised_reply_repeats_less():
    """Sampled from a peaked distribution, a strong penalty spreads the reply over more
    distinct tokens (the same seed, the same logits)."""
    rng = np.random.default_rng(2)
    peaked = np.tile(rng.normal(0, 1.0, 65536).astype(np.float32), (48, 1))
    peaked[:, :4] += 6.0
    options = SamplingOptions(sampler=Nucleus(top_k=64, top_p=1.0, presence_penalty=0.0, frequency_penalty=0.0),
                              seed=3)
    plain = {t for t, _ in sampled_run(options, peaked)}
    penalised = {t for t, _ in sampled_run(msgspec.structs.replace(options, repetition_penalty=3.0), peaked)}
    assert len(penalised) > len(plain) + 10


@pytest.mark.parametrize("sampler", [Nucleus(top_k=40, top_p=0.9), Typical(), GREEDY])
def test_a_row_gets_the_same_whatever_shares_its_step(sampler, monkeypatch):
    logits = np.random.default_rng(4).normal(0, 2.5, (6, 65536)).astype(np.float32)
    options = SamplingOptions(sampler=sampler, seed=5, logprobs=True, repetition_penalty=1.3, repetition_window=8)
    company = [SamplingOptions(seed=6), SamplingOptions(seed=7, repetition_penalty=0.8, repetition_window=-1),
               SamplingOptions(sampler=Typical(), seed=8)]
    alone = sampled_run(options, logits, prompt=[7, 8, 9])
    assert sampled_run(options, logits, prompt=[7, 8, 9], company=company) == alone
    with monkeypatch.context() as patch:
        patch.setattr(fused, "fits", lambda vocab: False)  # no compiled rows beside it
        assert sampled_run(options, logits, prompt=[7, 8, 9], company=company) == alone


@pytest.mark.parametrize(("fields", "names"), [
    ({"repetition_penalty": 0.0}, "repetition_penalty"),
    ({"repetition_penalty": -1.1}, "repetition_penalty"),
    ({"repetition_penalty": float("nan")}, "repetition_penalty"),
    ({"repetition_penalty": float("inf")}, "repetition_penalty"),
    ({"repetition_window": -2}, "repetition_window"),
])
def test_bad_values_are_refused_naming_the_field(fields, names):
    with pytest.raises(SamplerError) as refused:
        options_from_openai(**fields)
    assert refused.value.field == names


def test_the_openai_field_reaches_the_sampler():
    req = msgspec.convert({"repetition_penalty": 1.15}, ChatCompletionRequest)
    options = sampling_options(req, logprobs=None, top_logprobs=None)
    assert (options.repetition_penalty, options.repetition_window) == (1.15, 64)
    assert sampling_options(ChatCompletionRequest(), logprobs=None, top_logprobs=None) == SamplingOptions()
    with pytest.raises(ApiError) as refused:
        sampling_options(msgspec.convert({"repetition_penalty": 0}, ChatCompletionRequest), logprobs=None,
                         top_logprobs=None)
    assert refused.value.status == 400 and refused.value.param == "repetition_penalty"
