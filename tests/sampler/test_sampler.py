"""Samplers: Ai00's parameters and algorithms, penalties, bias, masks, seeds and batching."""

from __future__ import annotations

import math

import msgspec
import numpy as np
import pytest

from ai00_like.sampler import (
    Mirostat,
    Nucleus,
    RequestSampler,
    SamplerError,
    SamplingOptions,
    Typical,
    options_from_openai,
    sample_batch,
)
from ai00_like.sampler import TokenCounts
from ai00_like.sampler.draw import truncate
from ai00_like.sampler.penalties import PenaltyState
from ai00_like.sampler.topk import top_k_sorted

NO_PENALTY = dict(presence_penalty=0.0, frequency_penalty=0.0)


def opts(sampler=None, **kw) -> SamplingOptions:
    return SamplingOptions(sampler=sampler if sampler is not None else Nucleus(), **kw)


def lm_logits(rng: np.random.Generator, rows: int, vocab: int) -> np.ndarray:
    """Shaped like a language model's: a steep fall-off over a random token order."""
    base = -3.0 * np.log(np.arange(1, vocab + 1))
    out = np.empty((rows, vocab), dtype=np.float32)
    for r in range(rows):
        out[r, rng.permutation(vocab)] = base + rng.normal(0, 0.5, vocab)
    return out


def draw_many(options: SamplingOptions, logits_row: np.ndarray, draws: int) -> np.ndarray:
    """`draws` independent one-step samples of the same distribution, in one batch."""
    vocab = logits_row.shape[0]
    samplers = [RequestSampler(msgspec.structs.replace(options, seed=i), vocab) for i in range(draws)]
    return sample_batch(samplers, np.tile(logits_row, (draws, 1))).tokens


def assert_frequencies(tokens: np.ndarray, expected: np.ndarray) -> None:
    """Every token's frequency within 5 standard errors of its probability, and tokens
    with probability 0 never drawn."""
    n = tokens.size
    freq = np.bincount(tokens, minlength=expected.size) / n
    assert np.all(freq[expected == 0] == 0), freq
    sigma = np.sqrt(expected * (1 - expected) / n)
    assert np.all(np.abs(freq - expected) <= 5 * sigma + 1e-12), (freq, expected)


# ---- parameters: Ai00's JSON, validation, the OpenAI merge ------------------------------


def test_decodes_ai00_nucleus_example():
    raw = b'{"type":"Nucleus","top_p":0.5,"top_k":128,"temperature":1,"presence_penalty":0.3,"frequency_penalty":0.3,"penalty_decay":0.99654026}'
    assert msgspec.json.decode(raw, type=Nucleus | Typical | Mirostat) == Nucleus()


def test_every_field_defaults_on_its_own():
    decoded = msgspec.json.decode(b'{"type":"Typical","tau":0.9}', type=Nucleus | Typical | Mirostat)
    assert decoded == Typical(tau=0.9, top_k=128, temperature=1.0, presence_penalty=0.3, frequency_penalty=0.3)
    assert Nucleus(top_p=0.9).top_k == 128 and Nucleus(top_p=0.9).penalty_decay == 0.99654026
    assert Mirostat() == Mirostat(tau=3.0, rate=0.1)


def test_mirostat_learning_rate_alias():
    union = Nucleus | Typical | Mirostat
    assert msgspec.json.decode(b'{"type":"Mirostat","learning_rate":0.5}', type=union) == Mirostat(rate=0.5)
    assert msgspec.json.decode(b'{"type":"Mirostat","rate":0.2,"tau":4}', type=union) == Mirostat(tau=4, rate=0.2)
    encoded = msgspec.json.encode(Mirostat(learning_rate=0.5))
    assert b"learning_rate" not in encoded
    assert msgspec.json.decode(encoded, type=union) == Mirostat(rate=0.5)


def test_decodes_sampling_options_with_string_token_keys():
    raw = b'{"sampler":{"type":"Mirostat","tau":2},"logit_bias":{"42":-100,"7":5.5},"seed":9,"top_logprobs":3,"logprobs":true}'
    decoded = msgspec.json.decode(raw, type=SamplingOptions)
    assert decoded == SamplingOptions(
        sampler=Mirostat(tau=2.0), logit_bias={42: -100.0, 7: 5.5}, seed=9, top_logprobs=3, logprobs=True
    )
    assert msgspec.json.decode(b"{}", type=SamplingOptions) == SamplingOptions()


@pytest.mark.parametrize(
    "build, field",
    [
        (lambda: Nucleus(temperature=-0.1), "temperature"),
        (lambda: Nucleus(top_p=1.5), "top_p"),
        (lambda: Nucleus(top_p=float("nan")), "top_p"),
        (lambda: Nucleus(top_k=-1), "top_k"),
        (lambda: Nucleus(penalty_decay=1.01), "penalty_decay"),
        (lambda: Nucleus(presence_penalty=float("inf")), "presence_penalty"),
        (lambda: Typical(tau=-0.5), "tau"),
        (lambda: Typical(temperature=float("inf")), "temperature"),
        (lambda: Mirostat(tau=-1.0), "tau"),
        (lambda: Mirostat(learning_rate=-0.1), "rate"),
        (lambda: SamplingOptions(top_logprobs=21), "top_logprobs"),
        (lambda: SamplingOptions(logit_bias={3: 150.0}), "logit_bias"),
        (lambda: SamplingOptions(logit_bias={-3: 1.0}), "logit_bias"),
        (lambda: RequestSampler(SamplingOptions(logit_bias={100: 1.0}), 100), "logit_bias"),
        (lambda: options_from_openai(temperature=-1.0), "temperature"),
        (lambda: options_from_openai(top_p=2.0), "top_p"),
        (lambda: options_from_openai(logit_bias={"x": 1}), "logit_bias"),
    ],
)
def test_invalid_parameters_raise_sampler_error_naming_the_field(build, field):
    with pytest.raises(SamplerError) as caught:
        build()
    assert caught.value.field == field
    assert field in str(caught.value)
    assert isinstance(caught.value, ValueError)


def test_invalid_json_names_the_field_and_path():
    with pytest.raises(msgspec.ValidationError, match=r"top_p.*\$\.sampler"):
        msgspec.json.decode(b'{"sampler":{"type":"Nucleus","top_p":3}}', type=SamplingOptions)


def test_openai_defaults_are_ai00s():
    assert options_from_openai() == SamplingOptions(sampler=Nucleus())


def test_openai_flat_fields_override_the_tagged_sampler():
    merged = options_from_openai(sampler=Nucleus(top_p=0.9, temperature=2.0), temperature=0.5, presence_penalty=0.0)
    assert merged.sampler == Nucleus(top_p=0.9, temperature=0.5, presence_penalty=0.0)


def test_openai_fields_a_sampler_lacks_are_ignored():
    assert options_from_openai(sampler=Mirostat(tau=4.0), temperature=0.0, top_p=0.1).sampler == Mirostat(tau=4.0)
    assert options_from_openai(sampler=Typical(), top_p=0.1, top_k=5).sampler == Typical(top_k=5)


def test_openai_logprobs_forms():
    chat = options_from_openai(logprobs=True, top_logprobs=4, logit_bias={"17": -100}, seed=-5)
    assert (chat.logprobs, chat.top_logprobs, chat.logit_bias, chat.seed) == (True, 4, {17: -100.0}, -5)
    legacy = options_from_openai(logprobs=3)
    assert (legacy.logprobs, legacy.top_logprobs) == (True, 3)
    assert options_from_openai(top_logprobs=2).logprobs is True
    assert options_from_openai(logprobs=False).logprobs is False


# ---- greedy ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "params",
    [Nucleus(temperature=0, **NO_PENALTY), Nucleus(top_k=1, **NO_PENALTY), Nucleus(top_p=0, **NO_PENALTY),
     Typical(temperature=0, **NO_PENALTY)],
)
def test_greedy_is_argmax(params):
    rng = np.random.default_rng(0)
    logits = rng.normal(0, 3, (6, 5000)).astype(np.float32)
    samplers = [RequestSampler(opts(params), 5000) for _ in range(6)]
    assert np.array_equal(sample_batch(samplers, logits).tokens, logits.argmax(axis=1))


def test_tiny_top_p_picks_the_top_token():
    rng = np.random.default_rng(1)
    logits = lm_logits(rng, 1, 65536)[0]
    tokens = draw_many(opts(Nucleus(top_p=1e-6, **NO_PENALTY)), logits, 50)
    assert np.all(tokens == logits.argmax())


# ---- distributions ---------------------------------------------------------------------


def softmax(x: np.ndarray) -> np.ndarray:
    e = np.exp(x - x.max())
    return e / e.sum()


def test_nucleus_frequencies_match_truncated_tempered_distribution():
    logits = np.log(np.array([0.05, 0.30, 0.02, 0.25, 0.20, 0.08, 0.10], dtype=np.float32))
    # Sorted: 0.30, 0.25, 0.20, 0.10, ... top_p 0.6: mass before 0.20 is 0.55 <= 0.6, kept
    # (it crosses); mass before 0.10 is 0.75 > 0.6: dropped. Temperature 0.5 squares.
    expected = np.zeros(7)
    expected[[1, 3, 4]] = np.array([0.30, 0.25, 0.20]) ** 2
    expected /= expected.sum()
    tokens = draw_many(opts(Nucleus(top_p=0.6, top_k=10, temperature=0.5, **NO_PENALTY)), logits, 6000)
    assert_frequencies(tokens, expected)


def test_nucleus_top_k_limits_before_top_p():
    logits = np.log(np.array([0.1, 0.4, 0.3, 0.2], dtype=np.float32))
    expected = np.array([0, 0.4, 0.3, 0]) / 0.7
    tokens = draw_many(opts(Nucleus(top_p=1.0, top_k=2, temperature=1.0, **NO_PENALTY)), logits, 4000)
    assert_frequencies(tokens, expected)


def test_untruncated_sampling_follows_the_tempered_softmax():
    logits = np.array([1.0, 0.0, -1.0, 2.0, 0.5], dtype=np.float32)
    expected = softmax(logits.astype(np.float64) / 1.5)
    tokens = draw_many(opts(Nucleus(top_p=1.0, top_k=0, temperature=1.5, **NO_PENALTY)), logits, 6000)
    assert_frequencies(tokens, expected)


def test_typical_keeps_the_tokens_closest_to_the_entropy():
    p = np.array([0.5, 0.2, 0.15, 0.1, 0.05])
    # H = 1.333 nats; |-ln p - H| = 0.640, 0.276, 0.564, 0.970, 1.663: order 1, 2, 0, 3, 4.
    # tau 0.3: token 1 (mass before 0), token 2 (0.2 <= 0.3), then token 0 (0.35 > 0.3) stops.
    # The most likely token is not typical here, and is dropped.
    expected = np.array([0, 0.2, 0.15, 0, 0]) / 0.35
    tokens = draw_many(opts(Typical(tau=0.3, top_k=10, temperature=1.0, **NO_PENALTY)), np.log(p).astype(np.float32), 4000)
    assert_frequencies(tokens, expected)


def test_typical_top_k_counts_in_typicality_order():
    p = np.array([0.5, 0.2, 0.15, 0.1, 0.05])
    tokens = draw_many(opts(Typical(tau=1.0, top_k=1, **NO_PENALTY)), np.log(p).astype(np.float32), 200)
    assert np.all(tokens == 1)


def test_mirostat_keeps_tokens_up_to_the_first_surprising_one_and_updates_its_threshold():
    p = np.array([0.5, 0.25, 0.15, 0.1])  # surprises 1, 2, 2.74, 3.32 bits
    logits = np.log(p).astype(np.float32)
    params = Mirostat(tau=1.0, rate=0.1)  # threshold starts at 2 tau = 2 bits
    # Kept: 0 and 1 (surprise <= 2) and 2, the first above 2; never 3.
    tokens = draw_many(opts(params), logits, 4000)
    assert_frequencies(tokens, np.array([0.5, 0.25, 0.15, 0]) / 0.9)

    sampler = RequestSampler(opts(params, seed=3), 4)
    token = int(sample_batch([sampler], logits[None]).tokens[0])
    surprise = math.log2(0.9) - math.log2(p[token])
    assert sampler.max_surprise == pytest.approx(2.0 - 0.1 * (surprise - 1.0), rel=1e-5)


def test_mirostat_threshold_is_capped_at_four_tau():
    sampler = RequestSampler(opts(Mirostat(tau=1.0, rate=10.0), seed=0), 3)
    sample_batch([sampler], np.array([[20.0, 0.0, 0.0]], dtype=np.float32))
    assert sampler.max_surprise == 4.0


# ---- penalties ---------------------------------------------------------------------------


def test_penalties_start_from_model_tokens_walked_backwards():
    params = Nucleus(temperature=0, presence_penalty=0.5, frequency_penalty=0.2, penalty_decay=0.9)
    sampler = RequestSampler(opts(params), 10, model_tokens=[3, 5, 3])
    # Last token first, i = 0: token 3 -> 0.5 + 0.2; i = 1: token 5 -> 0.5 + 0.2*0.9;
    # i = 2: token 3 again -> 0.7 + 0.2*0.81.
    expected = np.zeros(10)
    expected[3] = 0.7 + 0.2 * 0.81
    expected[5] = 0.5 + 0.2 * 0.9
    np.testing.assert_allclose(sampler.penalties.values, expected, rtol=1e-6)


def test_penalties_decay_then_grow_with_each_token():
    params = Nucleus(temperature=0, presence_penalty=0.5, frequency_penalty=0.2, penalty_decay=0.9)
    sampler = RequestSampler(opts(params), 10, model_tokens=[3, 5, 3])
    logits = np.zeros((1, 10), dtype=np.float32)
    logits[0, 7] = 10.0
    sample_batch([sampler], logits)  # picks 7, new: decay all, 7 gets presence
    values = sampler.penalties.values
    assert values[3] == pytest.approx(0.862 * 0.9) and values[5] == pytest.approx(0.68 * 0.9)
    assert values[7] == pytest.approx(0.5)
    sample_batch([sampler], logits)  # 7 again: decay, then + frequency
    values = sampler.penalties.values
    assert values[7] == pytest.approx(0.5 * 0.9 + 0.2)
    assert values[3] == pytest.approx(0.862 * 0.81)


def test_penalty_changes_the_choice_and_the_reported_logprob():
    params = Nucleus(temperature=0, presence_penalty=1.0, frequency_penalty=0.0, penalty_decay=1.0)
    logits = np.array([[0.0, 2.0, 1.5, 0.0]], dtype=np.float32)
    fresh = RequestSampler(opts(params, logprobs=True), 4)
    repeated = RequestSampler(opts(params, logprobs=True), 4, model_tokens=[1])
    assert sample_batch([fresh], logits).tokens[0] == 1
    step = sample_batch([repeated], logits)
    assert step.tokens[0] == 2
    adjusted = logits[0].astype(np.float64) - np.array([0, 1.0, 0, 0])
    assert step.logprobs[0] == pytest.approx(np.log(softmax(adjusted)[2]), rel=1e-5)


def test_repeated_token_becomes_less_likely():
    params = Nucleus(top_p=1.0, top_k=0, presence_penalty=0.3, frequency_penalty=0.3)
    sampler = RequestSampler(opts(params, seed=1, logprobs=True, top_logprobs=4), 4)
    logits = np.zeros((1, 4), dtype=np.float32)
    first = sample_batch([sampler], logits)
    token = int(first.tokens[0])
    second = sample_batch([sampler], logits)
    probs = dict(second.top_logprobs[0])
    assert probs[token] < min(lp for t, lp in probs.items() if t != token)


def test_accept_records_tokens_that_were_not_sampled():
    sampler = RequestSampler(opts(Nucleus(presence_penalty=0.4)), 8)
    sampler.accept(6)
    assert sampler.penalties.values[6] == pytest.approx(0.4)


def test_mirostat_and_zero_penalties_keep_no_penalty_state():
    assert RequestSampler(opts(Mirostat()), 8).penalties is None
    assert RequestSampler(opts(Nucleus(**NO_PENALTY)), 8).penalties is None


# ---- logit_bias and masks ------------------------------------------------------------------


def test_logit_bias_minus_100_bans_and_plus_100_forces():
    rng = np.random.default_rng(2)
    logits = lm_logits(rng, 1, 4096)[0]
    top = int(logits.argmax())
    banned = draw_many(opts(Nucleus(top_p=0.3), logit_bias={top: -100}), logits, 300)
    assert top not in banned
    low = int(logits.argmin())
    forced = draw_many(opts(Nucleus(), logit_bias={low: 100}), logits, 300)
    assert np.all(forced == low)
    greedy = RequestSampler(opts(Nucleus(temperature=0), logit_bias={top: -100}), 4096)
    assert sample_batch([greedy], logits[None]).tokens[0] != top


@pytest.mark.filterwarnings("error")
def test_all_but_one_token_banned():
    vocab = 65536
    logits = np.random.default_rng(3).normal(0, 5, (3, vocab)).astype(np.float32)
    samplers = [RequestSampler(opts(p, seed=1), vocab) for p in (Nucleus(), Typical(), Mirostat())]
    for s in samplers:
        s.allowed = np.zeros(vocab, dtype=bool)
        s.allowed[1234] = True
    step = sample_batch(samplers, logits)
    assert np.all(step.tokens == 1234)


def test_mask_hook_is_respected():
    vocab = 1000
    logits = np.random.default_rng(4).normal(0, 2, (1, vocab)).astype(np.float32)
    allowed = np.zeros(vocab, dtype=bool)
    allowed[[10, 20, 30]] = True
    sampler = RequestSampler(opts(Nucleus(top_p=1.0, top_k=0), seed=0), vocab)
    greedy = RequestSampler(opts(Nucleus(temperature=0, **NO_PENALTY)), vocab)
    seen = set()
    for _ in range(60):
        sampler.allowed = allowed
        greedy.allowed = allowed
        step = sample_batch([sampler, greedy], np.repeat(logits, 2, axis=0))
        seen.add(int(step.tokens[0]))
        assert step.tokens[1] == [10, 20, 30][int(np.argmax(logits[0, [10, 20, 30]]))]
    assert seen <= {10, 20, 30}


@pytest.mark.filterwarnings("error")
def test_every_token_impossible_falls_back_to_the_raw_argmax():
    logits = np.array([[0.0, 3.0, 1.0]], dtype=np.float32)
    sampler = RequestSampler(opts(Nucleus(), logit_bias={0: -100, 1: -100, 2: -100}, logprobs=True), 3)
    step = sample_batch([sampler], logits)
    assert step.tokens[0] == 1 and step.logprobs[0] == -np.inf


@pytest.mark.filterwarnings("error")
def test_nan_and_inf_logits_do_not_break_a_step():
    logits = np.zeros((3, 2048), dtype=np.float32)
    logits[0, :100] = np.nan
    logits[0, 500] = 4.0
    logits[1, 7] = np.inf
    logits[2, :] = -np.inf
    logits[2, 9] = 1.0
    samplers = [RequestSampler(opts(Nucleus(top_p=0.01), seed=i, logprobs=True), 2048) for i in range(3)]
    step = sample_batch(samplers, logits)
    assert step.tokens.tolist() == [500, 7, 9]
    assert np.all(np.isfinite(step.logprobs))


# ---- logprobs ----------------------------------------------------------------------------


def test_logprobs_are_of_the_adjusted_distribution_before_truncation():
    rng = np.random.default_rng(5)
    logits = rng.normal(0, 2, (2, 300)).astype(np.float32)
    asking = RequestSampler(opts(Nucleus(top_p=0.2, temperature=0.3, **NO_PENALTY), seed=0, logit_bias={5: 2.0}, top_logprobs=5, logprobs=True), 300)
    silent = RequestSampler(opts(Nucleus(), seed=0), 300)
    step = sample_batch([asking, silent], logits)
    adjusted = logits[0].astype(np.float64)
    adjusted[5] += 2.0
    log_p = adjusted - np.log(np.exp(adjusted).sum())
    assert step.logprobs[0] == pytest.approx(log_p[step.tokens[0]], abs=1e-5)
    best = np.argsort(-log_p)[:5]
    assert [t for t, _ in step.top_logprobs[0]] == best.tolist()
    np.testing.assert_allclose([lp for _, lp in step.top_logprobs[0]], log_p[best], atol=1e-5)
    assert np.isnan(step.logprobs[1]) and step.top_logprobs[1] == []


def test_top_logprobs_leave_out_impossible_tokens():
    logits = np.array([[1.0, 2.0, 3.0, 0.5]], dtype=np.float32)
    sampler = RequestSampler(opts(Nucleus(), logit_bias={2: -100, 3: -100}, top_logprobs=4, logprobs=True), 4)
    step = sample_batch([sampler], logits)
    assert [t for t, _ in step.top_logprobs[0]] == [1, 0]


# ---- seeds, batching, clones ----------------------------------------------------------------


def generate(samplers: list[RequestSampler], logits_for, steps: int) -> np.ndarray:
    out = []
    for step in range(steps):
        out.append(sample_batch(samplers, logits_for(step)).tokens)
    return np.array(out)


@pytest.mark.parametrize("position", [0, 4, 8])
def test_seeded_request_is_reproducible_whatever_shares_its_batch(position):
    vocab, steps = 65536, 12
    rows = {step: lm_logits(np.random.default_rng(100 + step), 9, vocab) for step in range(steps)}
    ours = SamplingOptions(sampler=Nucleus(top_p=0.9, top_k=0, temperature=1.2), seed=1234)
    alone = generate([RequestSampler(ours, vocab)], lambda s: rows[s][position : position + 1], steps)[:, 0]

    others = [
        SamplingOptions(sampler=Nucleus(temperature=0)),
        SamplingOptions(),
        SamplingOptions(sampler=Typical(), seed=1),
        SamplingOptions(sampler=Mirostat(), top_logprobs=3, logprobs=True),
        SamplingOptions(sampler=Nucleus(top_k=0, top_p=1.0)),
        SamplingOptions(sampler=Nucleus(top_k=5), logit_bias={0: 100}),
        SamplingOptions(sampler=Typical(top_k=0, tau=0.95)),
        SamplingOptions(sampler=Nucleus(top_k=600, top_p=0.99)),
    ]
    batch = [RequestSampler(o, vocab) for o in others]
    batch.insert(position, RequestSampler(ours, vocab))
    together = generate(batch, lambda s: rows[s], steps)[:, position]
    assert np.array_equal(alone, together)
    assert len(set(alone.tolist())) > 1  # it really sampled


def test_same_seed_same_tokens_different_seed_different_tokens():
    vocab = 4096
    rows = {s: lm_logits(np.random.default_rng(s), 1, vocab) for s in range(20)}
    a, b, c = (RequestSampler(SamplingOptions(sampler=Nucleus(top_p=0.95, top_k=0), seed=s), vocab) for s in (7, 7, 8))
    ta, tb, tc = (generate([x], rows.__getitem__, 20)[:, 0] for x in (a, b, c))
    assert np.array_equal(ta, tb)
    assert not np.array_equal(ta, tc)


def test_clone_copies_state_and_derives_its_own_stream():
    options = SamplingOptions(sampler=Nucleus(top_p=1.0, top_k=0), seed=42)
    base = RequestSampler(options, 16, model_tokens=[1, 2, 2])
    flat = np.zeros((1, 16), dtype=np.float32)
    for _ in range(3):
        sample_batch([base], flat)
    same = base.clone(0)
    other = base.clone(2)
    np.testing.assert_array_equal(other.penalties.values, base.penalties.values)
    other.accept(5)
    assert other.penalties.values[5] != base.penalties.values[5]

    # clone(0) continues the original's stream; clone(2) is choice 2's stream at the same
    # position, as if it had been built for choice 2 from the start.
    direct = RequestSampler(options, 16, choice_index=2)
    for _ in range(3):
        direct.next_uniform()
    expected_base = [base.next_uniform() for _ in range(5)]
    assert [same.next_uniform() for _ in range(5)] == expected_base
    assert [other.next_uniform() for _ in range(5)] == [direct.next_uniform() for _ in range(5)]
    assert expected_base[0] != direct.next_uniform()


def test_batch_size_mismatch_is_an_error():
    with pytest.raises(ValueError):
        sample_batch([RequestSampler(SamplingOptions(), 8)], np.zeros((2, 8), dtype=np.float32))
    with pytest.raises(ValueError):
        sample_batch([RequestSampler(SamplingOptions(), 8)], np.zeros((1, 9), dtype=np.float32))


# ---- the fast machinery against plain numpy ----------------------------------------------


def plain_top_k(x: np.ndarray, k: int):
    order = [np.lexsort((np.arange(r.size), -r))[:k] for r in x]
    return np.array(order), np.array([r[o] for r, o in zip(x, order)])


@pytest.mark.parametrize("vocab, k", [(65536, 128), (65536, 20), (65536, 700), (50277, 64), (1000, 10), (1000, 1000)])
def test_top_k_matches_a_full_sort(vocab, k):
    rng = np.random.default_rng(vocab + k)
    x = rng.normal(0, 3, (4, vocab)).astype(np.float32)
    x[1, : vocab // 2] = -np.inf
    x[2] = np.round(x[2])  # many ties: order by id
    x[3, 5:] = -np.inf  # fewer finite entries than k
    ids, vals = top_k_sorted(x, k)
    ref_ids, ref_vals = plain_top_k(x, k)
    assert np.array_equal(vals, ref_vals)
    finite = ref_vals > -np.inf
    assert np.array_equal(ids[finite], ref_ids[finite])


@pytest.mark.parametrize("top_k, top_p", [(128, 0.5), (0, 0.9), (0, 0.999), (3000, 0.999), (40, 0.0)])
def test_truncation_matches_the_plain_walk(top_k, top_p):
    vocab = 65536
    logits = lm_logits(np.random.default_rng(top_k), 3, vocab)
    logits[1] /= 8  # flat: needs many candidates
    log_norm = np.log(np.exp(logits.astype(np.float64)).sum(axis=1))
    k_limit = np.full(3, top_k if top_k else vocab)
    ids, _, keep = truncate(logits, logits, log_norm, k_limit, np.full(3, top_p))
    for row in range(3):
        p = np.exp(logits[row].astype(np.float64) - log_norm[row])
        order = np.lexsort((np.arange(vocab), -logits[row]))[: k_limit[row]]
        before = np.cumsum(p[order]) - p[order]
        expected = set(order[before <= top_p].tolist())
        assert set(ids[row][keep[row]].tolist()) == expected


def test_token_counts_of_two_turns_are_the_counts_of_their_joined_text():
    """A stored conversation keeps its assistant turns' decayed counts instead of their text:
    extending them by the next turn gives what counting the whole text would, and penalties
    started from them equal penalties started from the tokens."""
    rng = np.random.default_rng(0)
    first, second = rng.integers(0, 50, 300), rng.integers(20, 80, 120)
    decay = 0.99654026
    joined = TokenCounts.of(np.concatenate([first, second]), decay)
    extended = TokenCounts.of(first, decay).then(second, decay)
    assert extended.ids == joined.ids
    np.testing.assert_allclose(extended.counts, joined.counts, rtol=1e-12)
    assert TokenCounts.from_bytes(extended.to_bytes()) == extended
    from_tokens = PenaltyState(0.3, 0.3, decay, 100, np.concatenate([first, second]))
    from_counts = PenaltyState(0.3, 0.3, decay, 100, extended)
    np.testing.assert_allclose(from_counts.values, from_tokens.values, rtol=1e-6)
    assert TokenCounts().then(second, decay) == TokenCounts.of(second, decay)
