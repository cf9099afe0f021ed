"""The serving core through its message API: batching, FIFO, cancellation, the state cache, reloads."""

from __future__ import annotations

from ai00_like.messages import Cancel, Failed, GetInfo, Loaded, ModelInfoEvent, ModelSpec, TextPiece
from ai00_like.rwkv.formats.safetensors import write_safetensors
from ai00_like.rwkv.synthetic import make_checkpoint
from api_helpers import write_model
from serving_helpers import Reply, generate, load

PROMPTS = [f"User: question number {i} about {'cats' if i % 2 else 'dogs'}?\n\nAssistant:" for i in range(16)]


def spec(path, **kwargs):
    kwargs.setdefault("max_batch", 4)
    return ModelSpec(path=path, **kwargs)


def test_requests_fail_at_once_without_a_model(middleware):
    result = generate(middleware, "hello").wait()
    assert isinstance(result.failed, Failed) and result.failed.kind == "no_model"


def test_concurrent_requests_match_each_alone(middleware, model_files):
    assert isinstance(load(middleware, spec(model_files[0], max_batch=4, cache_bytes=0)), Loaded)
    alone = [generate(middleware, p, max_tokens=12).wait() for p in PROMPTS]
    replies = [generate(middleware, p, max_tokens=12) for p in PROMPTS]
    together = [r.wait() for r in replies]
    for a, b in zip(alone, together):
        assert a.failed is None and b.failed is None
        assert b.tokens == a.tokens and b.text == a.text
        assert b.finish == ["length"] and len(b.tokens[0]) == 12


def test_admission_is_first_in_first_out(middleware, model_files):
    load(middleware, spec(model_files[0], max_batch=1))
    order: list[str] = []
    replies = [generate(middleware, p, max_tokens=3, reply=Reply(order, str(i))) for i, p in enumerate(PROMPTS[:6])]
    for r in replies:
        assert r.wait().finish == ["length"]
    assert order == [str(i) for i in range(6)]


def test_cancel_frees_the_slot(middleware, model_files):
    load(middleware, spec(model_files[0], max_batch=1))
    cancel = Cancel()
    long = generate(middleware, PROMPTS[0], max_tokens=100_000, cancel=cancel, stop=())
    while not isinstance(long.next(), TextPiece):
        pass
    queued = generate(middleware, PROMPTS[1], max_tokens=4)  # waits: the only slot is busy
    cancel.set()
    assert long.wait().finish == ["cancelled"]
    assert queued.wait().finish == ["length"]


def test_cache_hit_reproduces_the_cold_result(middleware, model_files):
    load(middleware, spec(model_files[0]))
    cold = generate(middleware, PROMPTS[2], max_tokens=10).wait()
    hot = generate(middleware, PROMPTS[2], max_tokens=10).wait()
    assert cold.started[0].cached_tokens == 0
    assert hot.started[0].cached_tokens == hot.started[0].prompt_tokens
    assert hot.tokens == cold.tokens and hot.text == cold.text


def test_multi_turn_chat_only_computes_the_new_turn(middleware, model_files):
    load(middleware, spec(model_files[0]))
    first = generate(middleware, PROMPTS[3], max_tokens=8).wait()
    second_prompt = PROMPTS[3] + first.text[0] + "\n\nUser: and then?\n\nAssistant:"
    second = generate(middleware, second_prompt, max_tokens=4).wait()
    # Everything the model read in the first turn is cached (prompt + reply but its last token).
    assert second.started[0].cached_tokens >= first.usage[0][0] + first.usage[0][1] - 1 - 2


def test_identical_prompts_share_one_prefill_and_n_choices(middleware, model_files):
    load(middleware, spec(model_files[0], max_batch=4))
    result = generate(middleware, PROMPTS[4], max_tokens=6, n=3).wait(3)
    assert result.finish == ["length"] * 3
    cached = sorted(s.cached_tokens for s in result.started)
    assert cached == [0, result.started[0].prompt_tokens, result.started[0].prompt_tokens]
    assert result.tokens[0] == result.tokens[1] == result.tokens[2]  # greedy: all the same


def test_stop_string_ends_the_reply_without_emitting_it(middleware, model_files):
    load(middleware, spec(model_files[0]))
    free = generate(middleware, PROMPTS[5], max_tokens=20).wait()
    stop = free.text[0][len(free.text[0]) // 2 :][:3]
    assert stop
    stopped = generate(middleware, PROMPTS[5], max_tokens=20, stop=[stop]).wait()
    assert stopped.finish == ["stop"]
    assert stopped.text[0] == free.text[0][: free.text[0].index(stop)]


def test_max_tokens_emits_the_last_tokens_text(middleware, model_files):
    from ai00_like.rwkv.tokenizer import default_tokenizer_path, load_tokenizer

    load(middleware, spec(model_files[0]))
    result = generate(middleware, PROMPTS[6], max_tokens=7).wait()
    assert result.finish == ["length"] and result.usage[0][1] == 7
    assert result.text[0] == load_tokenizer(default_tokenizer_path()).decode(result.tokens[0])


def test_long_prefill_does_not_stall_other_streams(middleware, model_files):
    load(middleware, spec(model_files[0], max_batch=2, token_chunk_size=16))
    timeline: list = []
    long = generate(middleware, "word " * 600, max_tokens=1, reply=Reply(name="long", timeline=timeline))
    short = generate(middleware, PROMPTS[7], max_tokens=8, reply=Reply(name="short", timeline=timeline))
    assert short.wait().finish == ["length"] and long.wait().finish == ["length"]
    # The 600-token prompt is prefilled 16 tokens a step; the short request, admitted beside
    # it, produced its whole reply meanwhile.
    kinds = [(name, type(event).__name__) for name, event in timeline]
    assert kinds.index(("short", "Finished")) < kinds.index(("long", "TextPiece"))


def test_reload_under_load_ends_running_requests_and_serves_new_ones(middleware, model_files):
    load(middleware, spec(model_files[0], max_batch=2))
    running = generate(middleware, PROMPTS[8], max_tokens=100_000)
    while not isinstance(running.next(), TextPiece):
        pass
    # Loaded under the same served name, the new file replaces the model that runs.
    loaded = load(middleware, spec(model_files[1], max_batch=2, name="a"))
    assert isinstance(loaded, Loaded) and loaded.info.info.version == "6" and loaded.info.name == "a"
    result = running.wait()
    assert result.failed is not None and result.failed.kind == "unloaded"
    after = generate(middleware, PROMPTS[9], max_tokens=3).wait()
    assert after.failed is None and after.finish == ["length"]


def test_failed_load_keeps_the_old_model_serving(middleware, model_files, tmp_path):
    load(middleware, spec(model_files[0]))
    bad = tmp_path / "broken.st"
    bad.write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json}")
    failed = load(middleware, spec(str(bad)))
    assert isinstance(failed, Failed) and failed.kind == "load_failed" and "broken.st" in failed.message
    assert generate(middleware, PROMPTS[10], max_tokens=2).wait().finish == ["length"]
    info = []
    middleware.send(GetInfo(info.append))
    reply = Reply()
    middleware.send(GetInfo(reply))
    assert isinstance(reply.next(), ModelInfoEvent)


def test_embeddings_are_normalised_and_tell_texts_apart(middleware, model_files):
    import numpy as np

    from ai00_like.messages import Embed, Embeddings

    load(middleware, spec(model_files[0], token_chunk_size=8))
    reply = Reply()
    texts = ("the cat sat on the mat " * 4, "the cat sat on the mat " * 4, "quantum chromodynamics")
    middleware.send(Embed(texts, reply))
    result = reply.next()
    assert isinstance(result, Embeddings) and len(result.vectors) == 3
    a, b, c = result.vectors
    assert np.allclose([np.linalg.norm(v) for v in result.vectors], 1.0, atol=1e-5)
    np.testing.assert_allclose(a, b, atol=1e-6)  # chunking (8 tokens) does not change the result
    assert float(a @ c) < 0.999


def test_choose_ranks_choices_by_perplexity(middleware, model_files):
    import numpy as np

    from ai00_like.messages import Choose, Chosen
    from ai00_like.rwkv import load_model
    from ai00_like.rwkv.tokenizer import default_tokenizer_path, load_tokenizer

    load(middleware, spec(model_files[0], token_chunk_size=4))
    tok = load_tokenizer(default_tokenizer_path())
    prompt, choices = "The sky is", (" blue today", " green", "")
    reply = Reply()
    middleware.send(Choose(prompt, choices, reply))
    chosen = reply.next()
    assert isinstance(chosen, Chosen) and chosen.perplexities[2] == float("inf")

    model = load_model(model_files[0])  # the same computation by hand
    logits, state = model.forward(tok.encode(prompt))
    for choice, got in zip(choices[:2], chosen.perplexities):
        ids = tok.encode(choice)
        rows = np.vstack([logits[None], model.forward(ids[:-1], state, full_output=True)[0]]) if len(ids) > 1 else logits[None]
        logp = rows - np.log(np.exp(rows - rows.max(-1, keepdims=True)).sum(-1, keepdims=True)) - rows.max(-1, keepdims=True)
        want = -np.mean(logp[np.arange(len(ids)), ids])
        assert abs(got - want) < 1e-3 * max(1.0, abs(want))

    reply = Reply()
    middleware.send(Choose(prompt, choices[:2], reply, calibrate=True))
    calibrated = reply.next().perplexities
    assert calibrated != chosen.perplexities[:2]


def test_read_state_continues_like_the_whole_text(middleware, model_files):
    import numpy as np

    from ai00_like.messages import ReadState, StateRead
    from ai00_like.rwkv import load_model
    from ai00_like.rwkv.tokenizer import default_tokenizer_path, load_tokenizer

    load(middleware, spec(model_files[0], token_chunk_size=4))
    tok = load_tokenizer(default_tokenizer_path())
    reply = Reply()
    middleware.send(ReadState("Once upon a time", reply))
    read = reply.next()
    assert isinstance(read, StateRead) and read.prompt_tokens == len(tok.encode("Once upon a time"))
    model = load_model(model_files[0])
    more = tok.encode(" there was")
    continued, _ = model.forward(more, read.state)
    whole, _ = model.forward(tok.encode("Once upon a time") + more)
    np.testing.assert_allclose(continued, whole, atol=1e-5 * whole.std())


def test_initial_state_from_a_file_in_the_models_folder_or_inline(middleware, tmp_path):
    from ai00_like.rwkv import load_state
    from ai00_like.rwkv.formats.safetensors import write_safetensors
    from ai00_like.rwkv.info import detect
    from ai00_like.rwkv.synthetic import make_state

    models = tmp_path / "models"
    models.mkdir()
    path = str(write_model(models / "m.st", seed=8))
    write_safetensors(make_state(2, 64, 32, seed=9), models / "tuned.state", layout="web-rwkv")
    (tmp_path / "outside.state").write_bytes((models / "tuned.state").read_bytes())
    load(middleware, spec(path))
    plain = generate(middleware, PROMPTS[11], max_tokens=6).wait()
    tuned = generate(middleware, PROMPTS[11], max_tokens=6, state="tuned.state").wait()
    assert tuned.failed is None and tuned.tokens != plain.tokens
    info = detect({k: a.shape for k, a in make_checkpoint("7", n_layer=2, n_embd=64, head_size=32, vocab=65536).items()})
    inline = generate(middleware, PROMPTS[11], max_tokens=6, state=load_state(models / "tuned.state", info)).wait()
    assert inline.tokens == tuned.tokens
    for bad in ("../outside.state", str(tmp_path / "outside.state"), "missing.state", "no-such-id"):
        result = generate(middleware, PROMPTS[11], max_tokens=2, state=bad).wait()
        assert result.failed is not None and result.failed.kind == "bad_request", bad


def test_a_prompt_sharing_part_of_a_long_one_resumes_from_the_deepest_checkpoint(middleware, model_files):
    from ai00_like.rwkv.tokenizer import default_tokenizer_path, load_tokenizer

    load(middleware, spec(model_files[0], checkpoint_interval=16, token_chunk_size=64))
    words = [f"w{i}" for i in range(120)]
    first = " ".join(words)
    generate(middleware, first, max_tokens=1).wait()
    second = " ".join(words[:70]) + " and now something else entirely"
    result = generate(middleware, second, max_tokens=1).wait()
    tok = load_tokenizer(default_tokenizer_path())
    a, b = tok.encode(first), tok.encode(second)
    shared = next(i for i, (x, y) in enumerate(zip(a, b)) if x != y)
    cached = result.started[0].cached_tokens
    assert cached % 16 == 0 and shared - 16 < cached <= shared


def test_a_tokenizer_that_does_not_fit_the_model_is_refused_at_load(middleware, tmp_path):
    small = tmp_path / "small.st"
    write_safetensors(make_checkpoint("7", n_layer=1, n_embd=64, head_size=32, vocab=300, seed=1), small)
    refused = load(middleware, spec(str(small)))  # the World vocabulary's ids do not fit 300 rows
    assert isinstance(refused, Failed) and refused.kind == "load_failed", refused
    assert "\n" not in refused.message and "small.st" in refused.message and "300" in refused.message
    assert "does not belong to this model" in refused.message
    assert generate(middleware, "hello", max_tokens=2).wait().failed.kind == "no_model"
