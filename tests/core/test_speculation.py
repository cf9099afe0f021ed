"""Speculative decoding (backend/speculation.py, drafts.py): a reply with prompt-lookup drafts
is the reply without them, token for token, for the demo model, whatever the sampler asks."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from ai00_like.backend.drafts import PAUSE, Drafter
from ai00_like.backend.speculation import StepCosts, best_draft
from ai00_like.messages import Loaded, ModelSpec
from ai00_like.middleware import Middleware
from ai00_like.sampler import Nucleus, SamplingOptions
from engine_helpers import NEEDS_GPU
from serving_helpers import generate, load

MODELS = Path(__file__).resolve().parents[2] / "assets" / "models"
DOC = ("The quick brown fox jumps over the lazy dog. The rain in Spain stays mainly in the plain. "
       "She sells sea shells by the sea shore. Peter Piper picked a peck of pickled peppers. ") * 3
# The demo model goes on copying the text it has begun to repeat: drafts from the prompt pass.
COPY = f"User: Repeat this text exactly: {DOC}\n\nAssistant: {DOC[:60]}"
CHAT = "User: Tell me about the sea.\n\nAssistant:"


@pytest.fixture(scope="module")
def middleware():
    mw = Middleware()
    spec = ModelSpec(path=str(MODELS / "demo.st"), tokenizer=str(MODELS / "demo_vocab.txt"), max_batch=4)
    assert isinstance(load(mw, spec), Loaded)
    # Every draft pays: the checks below are of the mechanics, whatever this machine's steps cost.
    speculation(mw).costs.of = lambda rows: 1.0
    yield mw
    mw.close()


def speculation(mw):
    return next(iter(mw.models.values())).backend.speculation


def both(mw, prompt, **kwargs):
    """The reply without drafts and with them (and the draft tokens checked for it)."""
    plain = generate(mw, prompt, speculative=False, **kwargs).wait(kwargs.get("n", 1))
    before = speculation(mw).drafted
    drafted = generate(mw, prompt, **kwargs).wait(kwargs.get("n", 1))
    return plain, drafted, speculation(mw).drafted - before


def test_drafts_follow_the_latest_earlier_occurrence():
    drafter = Drafter([5, 6, 7, 8, 1, 5, 6, 7, 9, 2, 5, 6])
    assert drafter.draft(3) == [7, 9, 2]  # after "5 6": the latest earlier one continued "7 9 2"
    assert drafter.draft(1) == [7]
    assert Drafter([1, 2, 3]).draft(4) == []  # nothing to look up


def test_drafts_go_on_where_the_source_goes_on():
    # Look-alike lines: "0 5 1", "0 5 2", "0 5 3" handed back in order. After "0 5" the latest
    # occurrence says 3, but a sequence that has followed the first line's source goes on there.
    source = [9, 0, 5, 1, 8, 0, 5, 2, 8, 0, 5, 3, 8, 7]
    drafter = Drafter(source + [9, 0])
    assert drafter.draft(4) == [5, 1, 8, 0]
    drafter.extend([5, 1, 8, 0, 5])  # the draft accepted, and the model's own next token
    assert drafter.draft(3) == [2, 8, 0]  # the source's next line, not the latest "0 5 3"
    drafter.extend([4])  # a token the source does not have: the lookup again
    assert drafter.draft(2) == []
    drafter.extend([8, 0, 5])
    assert drafter.draft(1) == [4]  # following nothing: the latest occurrence of "8 0 5", its own


def test_drafts_go_where_they_pay():
    drafter = Drafter([1, 2, 3, 1, 2])
    start = drafter.chance
    for _ in range(4):
        drafter.checked(4, 0)
    assert drafter.chance < start / 3
    costs = StepCosts()
    for rows, seconds in ((1, 0.010), (2, 0.016), (3, 0.019), (5, 0.021), (16, 0.150), (20, 0.190)):
        costs.observe(rows, seconds)
    assert best_draft(drafter.chance, costs, 1, 4) == 0  # failing drafts cost more than they save
    assert best_draft(0.95, costs, 1, 4) == 4
    assert best_draft(0.95, costs, 16, 4) == 0  # a batch bound by its rows: none
    drafter.pause()
    assert drafter.draft(2) == [] and drafter.chance == start
    drafter.extend([3] * PAUSE)
    assert drafter.draft(2) != []


def test_step_costs_learn_the_steps_by_their_rows():
    costs = StepCosts()
    assert costs.of(3) == pytest.approx(1.5)  # before any step: a quarter of a step a row
    for _ in range(50):
        costs.observe(1, 0.010)
        costs.observe(5, 0.018)
    assert costs.of(5) == pytest.approx(0.018, rel=1e-3)
    assert costs.of(3) == pytest.approx(0.014, rel=1e-3)  # between the two
    assert costs.of(7) == pytest.approx(0.022, rel=1e-3)  # along their slope


@pytest.mark.parametrize("prompt", [COPY, CHAT])
def test_greedy_replies_are_the_same_tokens(middleware, prompt):
    plain, drafted, checked = both(middleware, prompt, max_tokens=120)
    assert drafted.tokens == plain.tokens and drafted.finish == plain.finish
    assert drafted.usage == plain.usage
    if prompt is COPY:
        assert checked > 0 and speculation(middleware).accepted > 0


def test_a_seeded_sample_draws_the_same_tokens(middleware):
    options = SamplingOptions(sampler=Nucleus(temperature=1.0, top_p=0.9), seed=7)
    plain, drafted, checked = both(middleware, COPY, max_tokens=80, options=options)
    assert checked > 0
    assert drafted.tokens == plain.tokens


def test_stop_strings_max_tokens_and_logprobs_are_unchanged(middleware):
    options = SamplingOptions(sampler=Nucleus(temperature=0), logprobs=True, top_logprobs=2)
    plain, drafted, _ = both(middleware, COPY, max_tokens=37, options=options)
    assert drafted.tokens == plain.tokens and len(plain.tokens[0]) == 37
    stop = generate(middleware, COPY, max_tokens=120).wait().text[0][50:58]  # a piece of what it copies
    plain, drafted, _ = both(middleware, COPY, max_tokens=120, stop=[stop])
    assert drafted.text == plain.text and drafted.finish == plain.finish == ["stop"]
    assert stop not in drafted.text[0]


def test_a_grammar_gives_the_same_reply(middleware):
    from ai00_like.sampler.grammar import compile_grammar, json_rule

    loaded = next(iter(middleware.models.values()))
    schema = {"type": "object", "properties": {"text": {"type": "string", "maxLength": 80}}, "required": ["text"]}
    grammar = compile_grammar(f"start: answer\nanswer: {json_rule(schema)}", loaded.tokenizer, loaded.model.info.vocab)
    options = SamplingOptions(sampler=Nucleus(temperature=0), grammar=grammar)
    plain, drafted, _ = both(middleware, COPY + ' {"text": "' + DOC[:40], max_tokens=60, options=options)
    assert drafted.tokens == plain.tokens and drafted.finish == plain.finish


def test_n_choices_with_drafts(middleware):
    plain, drafted, _ = both(middleware, COPY, max_tokens=40, n=2)
    assert drafted.tokens == plain.tokens


def test_the_state_left_behind_holds_what_was_read(middleware):
    """keep_state (the Responses API's next turn): the same tokens and state as without drafts."""
    from ai00_like.messages import Finished

    def finished(speculative):
        events = []
        reply = generate(middleware, COPY, max_tokens=50, keep_state=True, speculative=speculative)
        while not any(isinstance(e, Finished) for e in events):
            events.append(reply.next())
        return next(e for e in events if isinstance(e, Finished))

    plain, drafted = finished(False), finished(True)
    assert drafted.fed == plain.fed and drafted.unfed == plain.unfed
    for part in ("att_shift", "wkv", "ffn_shift"):
        a, b = getattr(drafted.state, part), getattr(plain.state, part)
        assert np.abs(a - b).max() <= 1e-4 * np.abs(b).max(), part


@NEEDS_GPU
def test_the_gpu_backend_rolls_back_too():
    mw = Middleware()
    spec = ModelSpec(path=str(MODELS / "demo.st"), tokenizer=str(MODELS / "demo_vocab.txt"), max_batch=2,
                     device="gpu")
    try:
        assert isinstance(load(mw, spec), Loaded)
        speculation(mw).costs.of = lambda rows: 1.0
        plain, drafted, checked = both(mw, COPY, max_tokens=40)
        assert checked > 0 and drafted.tokens == plain.tokens
    finally:
        mw.close()
