"""The OpenAI routes through the real server, with the official openai SDK and raw HTTP.

Every response body and every streamed chunk is validated against OpenAI's schemas.
A tiny synthetic model makes the replies gibberish but deterministic under greedy decoding.
"""

from __future__ import annotations

import asyncio
import base64
import http.client
import json
import socket

import numpy as np
import openai
import pytest

from ai00_like.rwkv.tokenizer import default_tokenizer_path, load_tokenizer
from api_helpers import SCHEMAS, InterceptedGenerates, ServerThread, config_for, payloads, write_state

GREEDY = {"temperature": 0}
HI = [{"role": "user", "content": "Hi! Who are you?"}]
STATE_ID = "3f1c4a50-1111-4222-8333-944455556666"


@pytest.fixture(scope="module")
def server(model_dir):
    write_state(model_dir / "tuned.state")
    extra = f"""aliases = ["gpt-3.5-turbo"]
[[state]]
path = "tuned.state"
name = "tuned"
id = "{STATE_ID}"
"""
    with ServerThread(config_for(model_dir, extra)) as s:
        yield s


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(default_tokenizer_path())


def chat(server, **body):
    body.setdefault("messages", HI)
    body.setdefault("max_tokens", 6)
    r = server.post("/v1/chat/completions", body)
    assert r.status == 200, r
    SCHEMAS.check("CreateChatCompletionResponse", r.json())
    return r.json()


def chat_stream(server, path="/v1/chat/completions", **body):
    body.setdefault("messages", HI)
    body.setdefault("max_tokens", 6)
    r = server.post(path, {**body, "stream": True})
    assert r.status == 200 and r.headers["content-type"].startswith("text/event-stream"), r
    chunks = r.chunks()
    for chunk in chunks:
        SCHEMAS.check("CreateChatCompletionStreamResponse", chunk)
    return chunks


# ------------------------------------------------------------------------------ models


def test_models_list_and_retrieve(server, client):
    raw = server.get("/v1/models")
    SCHEMAS.check("ListModelsResponse", raw.json())
    assert [m.id for m in client.models.list()] == ["tiny"]
    model = client.models.retrieve("tiny")
    SCHEMAS.check("Model", server.get("/v1/models/tiny").json())
    assert model.id == "tiny" and model.object == "model" and model.created > 0
    # The file name and the configured aliases name the same model.
    assert client.models.retrieve("tiny.st").id == "tiny"
    assert client.models.retrieve("gpt-3.5-turbo").id == "tiny"


def test_unknown_model_is_404_model_not_found(server, client):
    with pytest.raises(openai.NotFoundError) as e:
        client.chat.completions.create(model="gpt-4o", messages=HI, max_tokens=2)
    assert e.value.code == "model_not_found" and e.value.param == "model"
    with pytest.raises(openai.NotFoundError):
        client.models.retrieve("llama-3")
    raw = server.post("/v1/completions", {"model": "nope", "prompt": "x"})
    assert raw.status == 404
    SCHEMAS.check("ErrorResponse", raw.json())


@pytest.mark.parametrize("prefix", ["/v1", "/api/oai/v1", "/api/oai"])
def test_every_route_answers_under_every_prefix(server, prefix):
    assert server.get(f"{prefix}/models").status == 200
    assert server.get(f"{prefix}/models/tiny").status == 200
    assert chat_stream(server, path=f"{prefix}/chat/completions", max_tokens=2)
    assert server.post(f"{prefix}/completions", {"prompt": "a", "max_tokens": 2}).status == 200
    assert server.post(f"{prefix}/embeddings", {"input": "a"}).status == 200


# ------------------------------------------------------------------------------ chat


def test_chat_with_the_sdk(server, client):
    reply = client.chat.completions.create(model="tiny", messages=HI, max_tokens=5, **GREEDY)
    choice = reply.choices[0]
    assert reply.object == "chat.completion" and reply.model == "tiny" and reply.id.startswith("chatcmpl-")
    assert choice.message.role == "assistant" and choice.finish_reason == "length"
    assert choice.message.content and choice.message.content == choice.message.content.lstrip()
    assert reply.usage.completion_tokens == 5
    assert reply.usage.total_tokens == reply.usage.prompt_tokens + 5


def test_chat_prompt_is_ai00s_template(server, tokenizer):
    messages = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi!\n\n\nThere"}]
    body = chat(server, messages=messages, max_tokens=1, **GREEDY)
    expected = "System: Be brief.\n\nUser: Hi!\nThere\n\nAssistant:"
    assert body["usage"]["prompt_tokens"] == len(tokenizer.encode(expected))
    # Ai00's names and template fields change the rendering.
    template = {"record": "<{role}> {content}", "prefix": "<{assistant}>", "sep": "\n"}
    body = chat(server, messages=messages, names={"user": "Bob", "assistant": "Alice"}, template=template,
                max_tokens=1, **GREEDY)
    expected = "<System> Be brief.\n<Bob> Hi!\nThere\n<Alice>"
    assert body["usage"]["prompt_tokens"] == len(tokenizer.encode(expected))


def test_content_parts_and_developer_role_render_like_strings(server):
    plain = chat(server, messages=[{"role": "system", "content": "Be brief."}, *HI], **GREEDY)
    parts = chat(server, messages=[{"role": "developer", "content": [{"type": "text", "text": "Be brief."}]},
                                   {"role": "user", "content": [{"type": "text", "text": HI[0]["content"]}]}],
                 **GREEDY)
    assert parts["choices"][0]["message"] == plain["choices"][0]["message"]
    assert parts["usage"]["prompt_tokens"] == plain["usage"]["prompt_tokens"]


def test_chat_stream_follows_the_contract(server, client):
    chunks = chat_stream(server, max_tokens=6, stream_options={"include_usage": True}, **GREEDY)
    assert len({c["id"] for c in chunks}) == 1 and len({c["created"] for c in chunks}) == 1
    assert chunks[0]["choices"][0]["delta"] == {"role": "assistant", "content": ""}
    *body, finish, usage = chunks
    assert finish["choices"][0]["finish_reason"] == "length" and finish["choices"][0]["delta"] == {}
    assert all(c["choices"][0]["finish_reason"] is None for c in body)
    assert all(c["usage"] is None for c in chunks[:-1])
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 6
    text = "".join(c["choices"][0]["delta"].get("content", "") for c in body)
    whole = chat(server, max_tokens=6, **GREEDY)
    assert text == whole["choices"][0]["message"]["content"]  # stream and non-stream agree
    # Without include_usage there is no usage field at all.
    assert all("usage" not in c for c in chat_stream(server, max_tokens=3, **GREEDY))
    # The SDK reads the same stream.
    pieces = [c.choices[0].delta.content or "" for c in
              client.chat.completions.create(model="tiny", messages=HI, max_tokens=6, stream=True, **GREEDY)
              if c.choices]
    assert "".join(pieces) == text


def test_sse_framing_is_exact(server):
    raw = server.post("/v1/chat/completions", {"messages": HI, "max_tokens": 3, "stream": True})
    text = raw.body.decode()
    assert text.startswith("data: {") and text.endswith("\n\ndata: [DONE]\n\n")
    assert all(e == "[DONE]" or e.startswith("{") for e in payloads(raw.events()))
    assert raw.headers["cache-control"] == "no-cache"


def test_async_clients_run_concurrently(server):
    async def run():
        client = openai.AsyncOpenAI(base_url=server.base_url, api_key="unused", max_retries=0)
        prompts = [f"Question {i}: what is {i} + {i}?" for i in range(6)]

        async def one(p):
            return await client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": p}],
                                                        max_tokens=4, **GREEDY)

        async def streamed(p):
            stream = await client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": p}],
                                                          max_tokens=4, stream=True, **GREEDY)
            return "".join([c.choices[0].delta.content or "" async for c in stream if c.choices])

        together = await asyncio.gather(*(one(p) for p in prompts), *(streamed(p) for p in prompts))
        await client.close()
        return together

    together = asyncio.run(run())
    replies, streams = together[:6], together[6:]
    for reply, text in zip(replies, streams):
        assert reply.choices[0].finish_reason == "length"
        assert reply.choices[0].message.content == text  # batching does not change greedy output


def test_n_choices(server):
    body = chat(server, n=3, max_tokens=4, **GREEDY)
    assert [c["index"] for c in body["choices"]] == [0, 1, 2]
    assert len({c["message"]["content"] for c in body["choices"]}) == 1  # greedy: all equal
    assert body["usage"]["completion_tokens"] == 12
    chunks = chat_stream(server, n=2, max_tokens=3, **GREEDY)
    finishes = [c["choices"][0]["index"] for c in chunks if c["choices"][0]["finish_reason"]]
    assert sorted(finishes) == [0, 1]
    roles = [c["choices"][0]["index"] for c in chunks if c["choices"][0]["delta"].get("role")]
    assert roles == [0, 1]


def test_max_completion_tokens_and_stop(server):
    body = chat(server, max_completion_tokens=7, **GREEDY)
    assert body["usage"]["completion_tokens"] == 7 and body["choices"][0]["finish_reason"] == "length"
    text = chat(server, max_tokens=12, **GREEDY)["choices"][0]["message"]["content"]
    stop = text[len(text) // 2:][:2]
    stopped = chat(server, max_tokens=12, stop=stop, **GREEDY)["choices"][0]
    assert stopped["finish_reason"] == "stop" and stopped["message"]["content"] == text[: text.index(stop)]
    listed = chat(server, max_tokens=12, stop=["zzzz-never", stop, "qqq1", "qqq2", "qqq3"], **GREEDY)["choices"][0]
    assert listed["message"]["content"] == stopped["message"]["content"]  # more than 4 stops are fine


def test_seed_makes_sampling_reproducible(server):
    first = chat(server, temperature=1.0, top_p=1.0, seed=1234, max_tokens=8)
    again = chat(server, temperature=1.0, top_p=1.0, seed=1234, max_tokens=8)
    other = chat(server, temperature=1.0, top_p=1.0, seed=99, max_tokens=8)
    assert first["choices"][0]["message"] == again["choices"][0]["message"]
    assert other["choices"][0]["message"] != first["choices"][0]["message"]


def test_logit_bias_forces_a_token(server, tokenizer):
    token = tokenizer.encode(" yes")
    assert len(token) == 1
    body = chat(server, logit_bias={str(token[0]): 100}, max_tokens=4, stop=None, **GREEDY)
    assert body["choices"][0]["message"]["content"] == "yes yes yes yes"
    banned = chat(server, bias={str(token[0]): -100}, max_tokens=4, **GREEDY)  # Ai00's name
    assert "yes" not in banned["choices"][0]["message"]["content"]


def test_logprobs(server, client):
    body = chat(server, logprobs=True, top_logprobs=3, max_tokens=5, **GREEDY)
    content = body["choices"][0]["logprobs"]["content"]
    assert len(content) == 5 and all(len(t["top_logprobs"]) == 3 for t in content)
    for t in content:  # greedy: the chosen token is the most likely one
        assert t["logprob"] == pytest.approx(max(a["logprob"] for a in t["top_logprobs"]), abs=1e-6)
        assert bytes(t["bytes"]).decode("utf-8", "backslashreplace") == t["token"]
    assert chat(server, max_tokens=2)["choices"][0]["logprobs"] is None
    streamed = chat_stream(server, logprobs=True, max_tokens=3, **GREEDY)
    assert sum(len(c["choices"][0]["logprobs"]["content"]) for c in streamed[1:-1]
               if c["choices"][0]["logprobs"]) == 3
    reply = client.chat.completions.create(model="tiny", messages=HI, max_tokens=2, logprobs=True, top_logprobs=1)
    assert len(reply.choices[0].logprobs.content) == 2


def test_ai00_sampler_fields(server):
    for sampler in ({"type": "Nucleus", "top_p": 0.1, "temperature": 0.5},
                    {"type": "Typical", "tau": 0.3}, {"type": "Mirostat", "tau": 2.0}):
        body = chat(server, sampler=sampler, max_tokens=3)
        assert body["usage"]["completion_tokens"] == 3
    # The flat fields beat the tagged sampler: temperature 0 is greedy whatever it says.
    greedy = chat(server, max_tokens=5, **GREEDY)
    assert chat(server, sampler_override={"type": "Nucleus", "temperature": 2}, max_tokens=5,
                **GREEDY)["choices"][0]["message"] == greedy["choices"][0]["message"]
    # Ai00 ignored the top-level penalties (always 0.3/0.3); they reach the sampler now.
    with InterceptedGenerates(server.serving) as spy:
        chat(server, max_tokens=1, presence_penalty=-1.5, frequency_penalty=2, penalty_decay=0.9)
        chat(server, max_tokens=1)
    given, default = (g.options.sampler for g in spy.sent)
    assert (given.presence_penalty, given.frequency_penalty, given.penalty_decay) == (-1.5, 2, 0.9)
    assert (default.presence_penalty, default.frequency_penalty) == (0.3, 0.3)  # Ai00's defaults


def test_state_field_picks_a_configured_state(server):
    def reply(**fields):
        return chat(server, messages=[{"role": "user", "content": "Hi"}], max_tokens=4, **GREEDY,
                    **fields)["choices"][0]["message"]["content"]

    default = reply()
    by_name, by_id, by_object = reply(state="tuned"), reply(state=STATE_ID), reply(state={"id": STATE_ID})
    assert by_name == by_id == by_object != default
    assert reply(state="00000000-0000-0000-0000-000000000000") == default  # Ai00's "no state"
    bad = server.post("/v1/chat/completions", {"messages": HI, "state": "nope"})
    assert bad.status == 400 and bad.json()["error"]["param"] == "state"


# ------------------------------------------------------------------------------ completions


def test_completions_with_the_sdk(server, client):
    reply = client.completions.create(model="tiny", prompt="The cat", max_tokens=5, **GREEDY)
    assert reply.object == "text_completion" and reply.choices[0].finish_reason == "length"
    assert reply.usage.completion_tokens == 5
    raw = server.post("/v1/completions", {"prompt": ["The cat", "A dog"], "max_tokens": 3, "n": 2, **GREEDY})
    SCHEMAS.check("CreateCompletionResponse", raw.json())
    choices = raw.json()["choices"]
    assert [c["index"] for c in choices] == [0, 1, 2, 3]
    assert choices[0]["text"] == choices[1]["text"] == reply.choices[0].text[: len(choices[0]["text"])]
    default = server.post("/v1/completions", {"prompt": "x"}).json()
    assert default["usage"]["completion_tokens"] == 16  # OpenAI's default max_tokens


def test_completions_echo_and_stream(server, client):
    whole = server.post("/v1/completions", {"prompt": "Once upon", "max_tokens": 4, "echo": True, **GREEDY}).json()
    assert whole["choices"][0]["text"].startswith("Once upon")
    raw = server.post("/v1/completions", {"prompt": "Once upon", "max_tokens": 4, "echo": True, "stream": True,
                                          "stream_options": {"include_usage": True}, **GREEDY})
    chunks = raw.chunks()
    *body, usage = chunks
    for chunk in body:
        # Streamed completion chunks have the response's shape; only the not-yet-final
        # finish_reason is null (OpenAI sends that too, the schema does not list it).
        final = dict(chunk, choices=[dict(c, finish_reason=c["finish_reason"] or "stop") for c in chunk["choices"]])
        SCHEMAS.check("CreateCompletionResponse", final)
        assert "usage" not in chunk
    SCHEMAS.check("CreateCompletionResponse", usage)
    assert usage["choices"] == [] and usage["usage"]["completion_tokens"] == 4
    assert "".join(c["choices"][0]["text"] for c in body) == whole["choices"][0]["text"]
    assert body[-1]["choices"][0]["finish_reason"] == "length"
    sdk = "".join(c.choices[0].text for c in client.completions.create(
        model="tiny", prompt="Once upon", max_tokens=4, stream=True, **GREEDY) if c.choices)
    assert "Once upon" + sdk == whole["choices"][0]["text"]


def test_completions_logprobs_and_zero_tokens(server, tokenizer):
    body = server.post("/v1/completions", {"prompt": "Hello", "max_tokens": 3, "logprobs": 2, **GREEDY}).json()
    SCHEMAS.check("CreateCompletionResponse", body)
    lp = body["choices"][0]["logprobs"]
    assert len(lp["tokens"]) == len(lp["token_logprobs"]) == len(lp["top_logprobs"]) == 3
    assert lp["text_offset"][0] == 0 and all(len(t) == 2 for t in lp["top_logprobs"])
    echoed = server.post("/v1/completions", {"prompt": "Hello there", "max_tokens": 0, "echo": True}).json()
    SCHEMAS.check("CreateCompletionResponse", echoed)
    assert echoed["choices"][0]["text"] == "Hello there"
    assert echoed["usage"]["prompt_tokens"] == len(tokenizer.encode("Hello there"))


def test_completions_echo_with_logprobs_scores_the_prompt(server, tokenizer):
    """lm-eval's log-likelihood request: the prompt's own token log-probabilities."""
    import numpy as np

    from ai00_like.rwkv import load_model

    prompt = "The quick brown fox jumps"
    ids = tokenizer.encode(prompt)
    body = server.post("/v1/completions", {"prompt": prompt, "max_tokens": 0, "echo": True, "logprobs": 2}).json()
    lp = body["choices"][0]["logprobs"]
    assert "".join(lp["tokens"]) == prompt and body["choices"][0]["text"] == prompt
    assert lp["token_logprobs"][0] is None and lp["top_logprobs"][0] is None  # as OpenAI: nothing before it
    assert all(len(t) == 2 for t in lp["top_logprobs"][1:])
    assert lp["text_offset"] == [len(tokenizer.decode(ids[:k])) for k in range(len(ids))]
    # The same numbers by hand, from the model file the server loaded.
    model = load_model(server.config.model_dir / "tiny.st")
    rows, _ = model.forward(ids, full_output=True)
    logp = rows - rows.max(-1, keepdims=True)
    logp -= np.log(np.exp(logp).sum(-1, keepdims=True))
    want = logp[np.arange(len(ids) - 1), ids[1:]]
    np.testing.assert_allclose(lp["token_logprobs"][1:], want, atol=1e-4)
    # The schema allows only numbers; OpenAI itself sends null for the first token.
    SCHEMAS.check("CreateCompletionResponse", {**body, "choices": [{**body["choices"][0], "logprobs": None}]})

    more = server.post("/v1/completions", {"prompt": prompt, "max_tokens": 2, "echo": True, "logprobs": 1,
                                           **GREEDY}).json()
    both = more["choices"][0]["logprobs"]
    assert len(both["tokens"]) == len(ids) + 2 and both["token_logprobs"][: len(ids)] == lp["token_logprobs"]
    assert both["text_offset"][len(ids)] == len(prompt)


# ------------------------------------------------------------------------------ embeddings


def test_embeddings(server, client):
    reply = client.embeddings.create(model="tiny", input=["the cat sat", "quantum chromodynamics"])
    assert [d.index for d in reply.data] == [0, 1] and reply.usage.prompt_tokens > 0
    vectors = np.array([d.embedding for d in reply.data])
    assert vectors.shape == (2, 64)
    np.testing.assert_allclose(np.linalg.norm(vectors, axis=1), 1.0, atol=1e-5)
    raw = server.post("/v1/embeddings", {"input": "the cat sat"}).json()
    SCHEMAS.check("CreateEmbeddingResponse", raw)
    encoded = server.post("/v1/embeddings", {"input": "the cat sat", "encoding_format": "base64"}).json()
    decoded = np.frombuffer(base64.b64decode(encoded["data"][0]["embedding"]), dtype="<f4")
    np.testing.assert_array_equal(decoded, np.float32(raw["data"][0]["embedding"]))
    encoded["data"][0]["embedding"] = decoded.tolist()  # what the SDK hands its user
    SCHEMAS.check("CreateEmbeddingResponse", encoded)
    # The SDK asks for base64 by default and decodes it itself.
    np.testing.assert_allclose(client.embeddings.create(model="tiny", input="the cat sat").data[0].embedding,
                               raw["data"][0]["embedding"], atol=1e-7)


# ------------------------------------------------------------------------------ peers' request shapes


def test_langchain_request_shape(server):
    # ChatOpenAI: max_completion_tokens, developer role for o-models, stream_usage → include_usage.
    chunks = chat_stream(server, model="tiny", messages=[{"role": "developer", "content": "Be terse."},
                                                         {"role": "user", "content": "hi"}],
                         max_completion_tokens=4, n=1, temperature=0.7, stream_options={"include_usage": True})
    assert chunks[-1]["usage"]["completion_tokens"] == 4


def test_open_webui_request_shape(server):
    body = chat(server, model="tiny", messages=[{"role": "system", "content": "You are helpful."},
                                                {"role": "user", "content": "hello"}],
                temperature=0.8, top_p=0.9, min_p=0.05, max_tokens=5, frequency_penalty=0.1,
                presence_penalty=0.1, reasoning_effort="low", seed=42, stop=["\\n\\nUser:", "</s>"],
                logit_bias={"0": -100}, response_format={"type": "text"}, custom_param="kept out",
                metadata={"chat_id": "1"})
    assert body["choices"][0]["finish_reason"] in ("stop", "length")


def test_lobechat_request_shape(server):
    chunks = chat_stream(server, model="tiny", user="someone", max_tokens=4,
                         stream_options={"include_usage": True}, frequency_penalty=0, presence_penalty=0,
                         temperature=0.6, top_p=1,
                         messages=[{"role": "user", "content": [{"type": "text", "text": "hi"}]},
                                   {"role": "assistant", "content": "Hello!"},
                                   {"role": "user", "content": "and?"}])
    assert chunks[-1]["choices"] == [] and chunks[-1]["usage"]["total_tokens"] > 0


# ------------------------------------------------------------------------------ cancellation, pings


def open_request(server, body) -> http.client.HTTPConnection:
    conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=30)
    conn.request("POST", "/v1/chat/completions", body=json.dumps(body), headers={"Content-Type": "application/json"})
    return conn


def test_pings_while_waiting_for_the_first_token(server):
    # The stream is open but no token comes yet (as during a long prefill): comments flow.
    with InterceptedGenerates(server.serving, hold=True) as held:
        conn = open_request(server, {"messages": HI, "max_tokens": 2, "stream": True})
        resp = conn.getresponse()
        assert resp.status == 200
        seen = b""
        while seen.count(b": ping\n\n") < 2:
            seen += resp.read1(4096)
        held.release()
        seen += resp.read()
        conn.close()
    events = [e for e in seen.decode().split("\n\n") if e]
    assert json.loads(events[0][6:])["choices"][0]["delta"]["role"] == "assistant"  # headers and role at once
    assert events[1] == events[2] == ": ping" and events[-1] == "data: [DONE]"


@pytest.mark.parametrize("stream", [True, False])
def test_client_disconnect_cancels_generation(server, stream):
    with InterceptedGenerates(server.serving) as spy:
        conn = open_request(server, {"messages": HI, "max_tokens": 4000, "stop": None, "stream": stream})
        if stream:
            conn.getresponse().read1(100)  # the stream is running
        else:
            assert spy.arrived.wait(30)  # the generation is running
        conn.sock.shutdown(socket.SHUT_RDWR)
        conn.close()
        assert spy.sent[0].cancel._event.wait(30), "the generation was not cancelled"
    # The slots are free again: a full batch of requests still completes.
    assert chat(server, n=4, max_tokens=2)["usage"]["completion_tokens"] == 8


# ------------------------------------------------------------------------------ Ai00's chooses and states


def test_chooses_ranks_by_perplexity(server, tokenizer):
    # The most likely next token, with its log-probability, from a greedy completion.
    top = server.post("/v1/completions", {"prompt": "The cat sat on the", "max_tokens": 1, "logprobs": 1,
                                          **GREEDY}).json()["choices"][0]["logprobs"]
    best, best_lp = top["tokens"][0], top["token_logprobs"][0]
    assert len(tokenizer.encode(best)) == 1
    choices = [" zebra crossing", best, "", " mat"]
    body = server.post("/api/oai/chooses", {"input": ["The cat sat", " on the"], "choices": choices}).json()
    data = body["data"]
    assert body["object"] == "list" and body["model"] == "tiny"
    assert [d["rank"] for d in data] == [0, 1, 2, 3]
    assert sorted(d["index"] for d in data) == [0, 1, 2, 3]
    assert all(d["choice"] == choices[d["index"]] for d in data)
    scores = [d["perplexity"] for d in data]
    assert scores[:3] == sorted(scores[:3]) and data[-1]["choice"] == "" and scores[-1] is None
    # A one-token choice scores its negative log-probability, the same the sampler reports.
    assert data[0]["choice"] == best and data[0]["perplexity"] == pytest.approx(-best_lp, abs=1e-4)
    calibrated = server.post("/v1/chooses", {"input": "The cat sat on the", "choices": choices,
                                             "calibrate": True}).json()["data"]
    assert {d["index"]: d["perplexity"] for d in calibrated} != {d["index"]: d["perplexity"] for d in data}
    assert server.post("/v1/chooses", {"input": "x", "choices": []}).status == 400


def test_states_round_trip_through_the_state_field(server, tokenizer):
    assert tokenizer.encode("Hello world") == tokenizer.encode("Hello") + tokenizer.encode(" world")
    body = server.post("/api/oai/states", {"input": "Hello"}).json()
    item = body["data"][0]
    assert body["object"] == "list" and item["object"] == "states" and item["shape"] == [64, 34, 2, 1]
    assert len(item["data"]) == 64 * 34 * 2 and body["usage"]["prompt_tokens"] == 1
    whole = server.post("/v1/completions", {"prompt": "Hello world", "max_tokens": 6, **GREEDY}).json()
    resumed = server.post("/v1/completions", {"prompt": " world", "max_tokens": 6, **GREEDY,
                                              "state": {"data": item["data"], "shape": item["shape"]}}).json()
    assert resumed["choices"][0]["text"] == whole["choices"][0]["text"]
    packed = server.post("/v1/states", {"input": "Hello", "encoding_format": "base64"}).json()["data"][0]
    again = server.post("/v1/completions", {"prompt": " world", "max_tokens": 6, **GREEDY,
                                            "state": {"data": packed["data"]}}).json()
    assert again["choices"][0]["text"] == whole["choices"][0]["text"]


def test_state_field_takes_a_state_file_of_the_models_folder(server):
    def reply(state):
        return chat(server, messages=[{"role": "user", "content": "Hi"}], max_tokens=4, state=state,
                    **GREEDY)["choices"][0]["message"]["content"]

    assert reply("tuned.state") == reply("tuned")  # the same file as the configured state
    assert reply({"path": "tuned.state"}) == reply("tuned")
    missing = server.post("/v1/chat/completions", {"messages": HI, "state": "missing.state"})
    assert missing.status == 400 and missing.json()["error"]["param"] == "state"
