"""Ollama's API (api/ollama/) through Ollama's own clients: the `ollama` package and
LangChain's ChatOllama, on the bundled demo model (and the tiny synthetic one where a
thinking model is needed). Every body and streamed line is checked against a schema
written from Ollama's docs/api.md (tests/data/ollama/api-schema.json).

The models are too small to call a tool of their own accord, and Ollama's API has no
tool_choice to force one: the tool tests script the model's reply (`scripted`), so
that what is tested, the call read out of the reply and sent in Ollama's shape, is certain."""

from __future__ import annotations

import json
from contextlib import contextmanager
from pathlib import Path

import jsonschema
import ollama
import pytest
from api_helpers import InterceptedGenerates, ServerThread, config_for, write_model

from ai00_like.messages import Finished, Generate, Started, TextPiece

SCHEMA = json.loads((Path(__file__).resolve().parents[1] / "data" / "ollama" / "api-schema.json").read_text())
FAST = {"num_predict": 6, "temperature": 0, "top_k": 1, "seed": 7}
WEATHER = {"type": "function", "function": {
    "name": "get_weather", "description": "The weather in a city",
    "parameters": {"type": "object", "properties": {"city": {"type": "string"}}, "required": ["city"]}}}


def check(kind: str, instance) -> None:
    jsonschema.validate(instance, {"$ref": f"#/$defs/{kind}", **SCHEMA})


def lines(raw) -> list[dict]:
    return [json.loads(line) for line in raw.body.decode().splitlines() if line.strip()]


@pytest.fixture(scope="module")
def server(demo_server):
    return demo_server


@pytest.fixture(scope="module")
def client(server) -> ollama.Client:
    return ollama.Client(host=server.running.url)


@pytest.fixture(scope="module")
def thinker(model_dir):
    """The tiny synthetic model as a thinking model, and a second file served from its folder."""
    write_model(model_dir / "spare.st", seed=5)
    with ServerThread(config_for(model_dir, 'thinking = "effort"\nreasoning_effort = "low"')) as s:
        yield s


@contextmanager
def scripted(serving, reply: str):
    """The model's next replies are `reply`: the Generate is answered here, not by the model."""

    def answer(message):
        if not isinstance(message, Generate):
            return spy._send(message)
        spy.sent.append(message)
        message.reply(Started(0, 5, 0))
        message.reply(TextPiece(0, reply, (1, 2, 3)))
        message.reply(Finished(0, "stop", 5, 3))

    with InterceptedGenerates(serving) as spy:
        serving.middleware.send = answer
        yield spy


# ------------------------------------------------------------------------------ listings


def test_version_tags_show_and_ps(server, client):
    version = server.get("/api/version").json()
    check("version", version)
    # Apps refuse an Ollama too old for what they use (VS Code's Copilot: 0.6.4 or newer).
    assert tuple(int(n) for n in version["version"].split(".")) >= (0, 6, 4)
    assert client.list().models[0].model == "demo"
    check("tags", server.get("/api/tags").json())
    shown = client.show("demo")
    assert set(shown.capabilities) == {"completion", "tools", "embedding"}  # not a thinking model
    assert shown.modelinfo["rwkv.context_length"] > 0 and shown.modelinfo["rwkv.block_count"] > 0
    check("show", server.post("/api/show", {"model": "demo:latest"}).json())  # the tag clients add
    running = client.ps().models
    assert [m.model for m in running] == ["demo"] and running[0].size > 0 and running[0].size_vram == 0
    check("ps", server.get("/api/ps").json())


# ------------------------------------------------------------------------------ chat


def test_chat_whole_and_streamed_agree(server, client):
    messages = [{"role": "system", "content": "Answer briefly."}, {"role": "user", "content": "Who made the heaven?"}]
    whole = client.chat("demo", messages=messages, options=FAST)
    assert whole.message.content and whole.done and whole.done_reason in ("stop", "length")
    assert whole.eval_count > 0 and whole.prompt_eval_count > 5 and whole.total_duration >= whole.eval_duration
    parts = list(client.chat("demo", messages=messages, options=FAST, stream=True))
    assert "".join(p.message.content for p in parts) == whole.message.content
    assert [p.done for p in parts] == [False] * (len(parts) - 1) + [True]
    assert parts[-1].eval_count == whole.eval_count


def test_streamed_lines_are_ndjson_in_ollamas_shape(server):
    raw = server.post("/api/chat", {"model": "demo", "messages": [{"role": "user", "content": "In the"}],
                                    "options": FAST})
    assert raw.status == 200 and raw.headers["content-type"].startswith("application/x-ndjson")
    objects = lines(raw)
    for obj in objects:
        check("chat", obj)
    jsonschema.validate(objects[-1], SCHEMA["$defs"]["final"])
    whole = server.post("/api/chat", {"model": "demo", "messages": [{"role": "user", "content": "In the"}],
                                      "options": FAST, "stream": False})
    check("chat", whole.json())
    jsonschema.validate(whole.json(), SCHEMA["$defs"]["final"])


def test_num_predict_and_stop_options(server, client):
    cut = client.chat("demo", messages=[{"role": "user", "content": "Tell a long story"}],
                      options={**FAST, "num_predict": 3})
    assert cut.done_reason == "length" and cut.eval_count == 3
    free = client.chat("demo", messages=[{"role": "user", "content": "Tell a long story"}],
                       options={**FAST, "num_predict": 12})
    word = free.message.content.split()[1]
    stopped = client.chat("demo", messages=[{"role": "user", "content": "Tell a long story"}],
                          options={**FAST, "num_predict": 12, "stop": [word]})
    assert word not in stopped.message.content and stopped.done_reason == "stop"


def test_format_schema_gives_an_object_of_that_schema(server, client):
    schema = {"type": "object", "properties": {"name": {"type": "string", "maxLength": 8}}, "required": ["name"]}
    reply = client.chat("demo", messages=[{"role": "user", "content": "Name a king"}], format=schema,
                        options={**FAST, "num_predict": 40})
    jsonschema.validate(json.loads(reply.message.content), schema)
    raw = client.generate("demo", prompt="A king:", format="json", options={**FAST, "num_predict": 40})
    assert isinstance(json.loads(raw.response), dict)


def test_a_tool_round_trip(server, client):
    with scripted(server.serving, '<tool_call>{"name": "get_weather", "arguments": {"city": "Tokyo"}}</tool_call>'):
        reply = client.chat("demo", messages=[{"role": "user", "content": "Weather in Tokyo?"}], tools=[WEATHER])
        streamed = list(client.chat("demo", messages=[{"role": "user", "content": "Weather in Tokyo?"}],
                                    tools=[WEATHER], stream=True))
    call = reply.message.tool_calls[0].function
    assert (call.name, call.arguments) == ("get_weather", {"city": "Tokyo"}) and reply.done_reason == "stop"
    with_calls = [p for p in streamed if p.message.tool_calls]
    assert len(with_calls) == 1 and with_calls[0].message.tool_calls[0].function.arguments == {"city": "Tokyo"}
    history = [{"role": "user", "content": "Weather in Tokyo?"}, reply.message,
               {"role": "tool", "content": "22 degrees and sunny", "tool_name": "get_weather"}]
    with scripted(server.serving, " It is 22 degrees.") as spy:
        answer = client.chat("demo", messages=history, tools=[WEATHER])
    assert answer.message.content == "It is 22 degrees." and not answer.message.tool_calls
    prompt = spy.sent[0].prompt
    assert '{"name": "get_weather", "arguments": {"city": "Tokyo"}}' in prompt and "22 degrees and sunny" in prompt


def test_langchain_bind_tools_reads_the_call(server):
    from langchain_core.tools import tool
    from langchain_ollama import ChatOllama

    @tool
    def get_weather(city: str) -> str:
        """The weather in a city."""
        return "sunny"

    llm = ChatOllama(model="demo", base_url=server.running.url, num_predict=32).bind_tools([get_weather])
    with scripted(server.serving, '<tool_call>{"name": "get_weather", "arguments": {"city": "Rome"}}</tool_call>') \
            as spy:
        message = llm.invoke("Weather in Rome?")
    assert message.tool_calls[0]["name"] == "get_weather" and message.tool_calls[0]["args"] == {"city": "Rome"}
    assert "get_weather" in spy.sent[0].prompt  # the tool was offered in the prompt
    plain = ChatOllama(model="demo", base_url=server.running.url, num_predict=4, temperature=0).invoke("Hello")
    assert plain.content and plain.usage_metadata["output_tokens"] > 0


# ------------------------------------------------------------------------------ generate, embeddings


def test_generate_as_a_chat_turn_raw_and_streamed(server, client):
    with InterceptedGenerates(server.serving) as spy:
        turn = client.generate("demo", prompt="Who made the heaven?", system="Be brief.", options=FAST)
        raw = client.generate("demo", prompt="In the beginning", raw=True, options=FAST)
    assert spy.sent[0].prompt.startswith("System: Be brief.\n\nUser: Who made the heaven?")
    assert spy.sent[1].prompt == "In the beginning"
    assert turn.response and raw.response and raw.done_reason in ("stop", "length")
    objects = lines(server.post("/api/generate", {"model": "demo", "prompt": "In the", "options": FAST}))
    for obj in objects:
        check("generate", obj)
    assert "".join(o["response"] for o in objects) == client.generate("demo", prompt="In the", options=FAST).response
    check("generate", server.post("/api/generate", {"model": "demo", "stream": False}).json())
    assert client.generate("demo").done_reason == "load"


def test_embed_and_the_older_embeddings(server, client):
    two = client.embed("demo", input=["In the beginning", "And the earth"])
    assert len(two.embeddings) == 2 and len(two.embeddings[0]) == len(two.embeddings[1]) > 0
    check("embed", server.post("/api/embed", {"model": "demo", "input": "light"}).json())
    old = server.post("/api/embeddings", {"model": "demo", "prompt": "In the beginning"}).json()
    check("embeddings", old)
    assert old["embedding"] == pytest.approx(two.embeddings[0], abs=1e-5)
    wrong = server.post("/api/embed", {"model": "demo", "input": "x", "dimensions": 3})
    assert wrong.status == 400 and "dimensions" in wrong.json()["error"]


# ------------------------------------------------------------------------------ refusals


@pytest.mark.parametrize(("body", "status", "names"), [
    ({"model": "demo", "messages": [{"role": "wizard", "content": "hi"}]}, 400, "role"),
    ({"model": "demo", "messages": [{"role": "user", "content": "hi", "images": ["aGk="]}]}, 400, "images"),
    ({"model": "demo", "messages": [{"role": "user", "content": "hi"}], "options": {"temperature": "hot"}}, 400,
     "options.temperature"),
    ({"messages": [{"role": "user", "content": "hi"}]}, 400, "model"),
    ({"model": "nope", "messages": [{"role": "user", "content": "hi"}]}, 404, "nope"),
    ({"model": "demo", "messages": [{"role": "user", "content": "hi"}], "think": True}, 400, "thinking"),
    ({"model": "demo", "messages": [{"role": "user", "content": "hi"}], "format": "yaml"}, 400, "format"),
])
def test_bad_chat_requests_are_refused_in_ollamas_shape(server, body, status, names):
    raw = server.post("/api/chat", body)
    assert raw.status == status
    check("error", raw.json())
    assert names in raw.json()["error"]


def test_bad_generate_requests_and_unsupported_routes(server, client):
    for body, names in (({"model": "demo", "prompt": "x", "suffix": "y"}, "suffix"),
                        ({"model": "demo", "prompt": "x", "images": ["aGk="]}, "images")):
        raw = server.post("/api/generate", body)
        assert raw.status == 400 and names in raw.json()["error"]
    for path in ("/api/create", "/api/copy", "/api/push"):
        raw = server.post(path, {"model": "demo"})
        assert raw.status == 400 and "not supported" in raw.json()["error"]
    with pytest.raises(ollama.ResponseError) as refused:
        client.chat("demo", messages=[{"role": "user", "content": "hi"}], options={"top_k": "many"})
    assert refused.value.status_code == 400 and "options.top_k" in refused.value.error
    assert client.chat("demo", messages=[{"role": "user", "content": "hi"}], options=FAST).done  # still serving


def test_repeat_penalty_breaks_a_greedy_loop(server, client):
    """Greedy, the demo model loops on "and the earth"; `repeat_penalty` makes it write on,
    and reaches into the prompt (the comma it used gives way); `repeat_last_n` 0 turns it
    off again, and a penalty of 0 is a 400 naming the option."""
    greedy = {"num_predict": 16, "temperature": 0, "top_k": 1, "presence_penalty": 0, "frequency_penalty": 0}

    def reply(prompt="the the the the the", **options) -> str:
        return client.generate("demo", prompt=prompt, raw=True, options={**greedy, **options}).response

    looping = reply()
    assert looping.count("and the earth") >= 3
    penalised = reply(repeat_penalty=1.3)
    assert penalised != looping and penalised.count("and the earth") < 2
    assert reply(repeat_penalty=1.3, repeat_last_n=0) == looping
    echo = "and the earth, and the earth, and the"
    assert reply(echo, num_predict=2) == "earth," and reply(echo, num_predict=2, repeat_penalty=1.3) == "earth."
    with pytest.raises(ollama.ResponseError) as refused:
        reply(repeat_penalty=0)
    assert refused.value.status_code == 400 and "options.repeat_penalty" in refused.value.error


# ------------------------------------------------------------------------------ a thinking model, the pool


def test_think_gives_the_thinking_apart(thinker):
    client = ollama.Client(host=thinker.running.url)
    assert "thinking" in client.show("tiny").capabilities
    thought = client.chat("tiny", messages=[{"role": "user", "content": "Why?"}], think=True,
                          options={"num_predict": 6})
    assert thought.message.thinking and thought.done_reason == "length"  # the tiny model never ends a thought
    parts = list(client.chat("tiny", messages=[{"role": "user", "content": "Why?"}], think="high",
                             options={"num_predict": 6}, stream=True))
    assert "".join(p.message.thinking or "" for p in parts)
    plain = client.generate("tiny", prompt="Why?", think=False, options={"num_predict": 4})
    assert not plain.thinking and plain.response


def test_load_unload_and_delete_a_folder_model(thinker, model_dir):
    client = ollama.Client(host=thinker.running.url)
    assert client.generate("spare").done_reason == "load"
    assert "spare" in [m.model for m in client.ps().models]
    assert client.generate("spare", keep_alive=0).done_reason == "unload"
    assert "spare" not in [m.model for m in client.ps().models]
    pinned = thinker.post("/api/generate", {"model": "tiny", "keep_alive": 0})
    assert pinned.status == 400 and "keep_alive" in pinned.json()["error"]
    refused = thinker.request("DELETE", "/api/delete", {"model": "tiny"})
    assert refused.status == 400 and (model_dir / "tiny.st").is_file()
    client.delete("spare")
    assert not (model_dir / "spare.st").exists() and "spare" not in [m.model for m in client.list().models]


def test_pull_refuses_a_name_it_cannot_resolve(server):
    raw = server.post("/api/pull", {"model": "no such model!", "stream": False})
    assert 400 <= raw.status < 500
    check("error", raw.json())
