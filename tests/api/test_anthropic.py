"""Anthropic's Messages API through real clients: the `anthropic` SDK (create, stream, tools,
thinking, count_tokens), langchain-anthropic, a request shaped as Claude Code 2.1 sends it,
and bad input answered in Anthropic's error envelope.

Every body and streamed event is validated against the SDK's own types, strictly: a field
the SDK does not know, or a required one missing, fails (`strict`). The demo model answers
the text and tool requests; the tiny synthetic model, configured as a thinking model,
the thinking ones (its replies are all thinking, cut by max_tokens).
"""

from __future__ import annotations

import json
import threading
from pathlib import Path

import anthropic
import msgspec
import pydantic
import pytest
from anthropic.types import Message, MessageTokensCount, RawMessageStreamEvent
from api_helpers import InterceptedGenerates, ServerThread, config_for

from ai00_like.messages import Failed, Generate, Started

DEMO = Path(__file__).resolve().parents[2] / "assets" / "models"
DATA = Path(__file__).resolve().parents[1] / "data" / "anthropic"
KEY = "sk-ant-test"
ALIAS = "claude-sonnet-4-6"  # what Claude Code asks for; the config serves the demo model by it
QUESTION = [{"role": "user", "content": "Who made the light?"}]
GREEDY = {"temperature": 0}  # the SDK has no sampling arguments any more: sent as extra_body
CITIES = ["Paris", "Rome", "Jerusalem", "Babylon"]
WEATHER = {"name": "get_weather", "description": "The weather in a city",
           "input_schema": {"type": "object", "properties": {"city": {"type": "string", "enum": CITIES}},
                            "required": ["city"]}}


@pytest.fixture(scope="module")
def server():
    extra = f'aliases = ["{ALIAS}"]\n[tokenizer]\npath = "{DEMO / "demo_vocab.txt"}"'
    with ServerThread(config_for(DEMO, extra, model="demo.st", max_batch=2,
                                 listen_extra=f'api_keys = ["{KEY}"]')) as s:
        yield s


@pytest.fixture(scope="module")
def sdk(server) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=server.running.url, api_key=KEY, max_retries=0)


@pytest.fixture(scope="module")
def thinker(model_dir):
    with ServerThread(config_for(model_dir, 'thinking = "effort"\nreasoning_effort = "low"')) as s:
        yield s


@pytest.fixture(scope="module")
def thinker_sdk(thinker) -> anthropic.Anthropic:
    return anthropic.Anthropic(base_url=thinker.running.url, api_key="unused", max_retries=0)


# ------------------------------------------------------------------------------ helpers


def _no_extras(value, where: str) -> None:
    """Every model in `value` holds only fields its SDK type declares (its types allow extras)."""
    if isinstance(value, pydantic.BaseModel):
        assert not value.model_extra, f"{where}: {type(value).__name__} has fields the SDK does not know: " \
                                      f"{sorted(value.model_extra)}"
        for name in value.model_fields_set:
            _no_extras(getattr(value, name), f"{where}.{name}")
    elif isinstance(value, list):
        for i, item in enumerate(value):
            _no_extras(item, f"{where}[{i}]")


def strict(type_, data: dict):
    """`data` read as the SDK's `type_`: valid, with nothing the type does not declare."""
    value = pydantic.TypeAdapter(type_).validate_python(data)
    _no_extras(value, type(value).__name__)
    return value


def check_message(data: dict) -> Message:
    message = strict(Message, data)
    # Optional in the SDK's type, but always sent by Anthropic (null until known).
    assert {"stop_reason", "stop_sequence"} <= data.keys() and "cache_read_input_tokens" in data["usage"]
    assert message.id.startswith("msg_") and message.type == "message" and message.role == "assistant"
    return message


def events_of(raw: bytes) -> list[dict]:
    """Anthropic's SSE framing, strictly: `event: <type>` then `data: <json>` of that type;
    comment pings (sent while a model loads) are skipped, as the SDK skips them."""
    text = raw.decode()
    assert text.endswith("\n\n"), text[-80:]
    events = []
    for block in text[:-2].split("\n\n"):
        if block.startswith(":"):
            continue
        head, data = block.split("\n")
        assert head.startswith("event: ") and data.startswith("data: "), block
        event = json.loads(data[6:])
        assert event["type"] == head[7:], block
        events.append(event)
    return events


def check_stream(events: list[dict]) -> list:
    """The events validated, in Anthropic's order: message_start, blocks each opened, filled
    and stopped in turn (a thinking block's signature last), message_delta, message_stop."""
    # ping is not in the SDK's union (it reads it apart): exactly {"type": "ping"}
    typed = [strict(RawMessageStreamEvent, e) if e != {"type": "ping"} else e for e in events]
    kinds = [e["type"] for e in events if e["type"] != "ping"]
    assert kinds[0] == "message_start" and kinds[-2:] == ["message_delta", "message_stop"], kinds
    assert events[0]["message"]["content"] == [] and events[0]["message"]["stop_reason"] is None
    index, open_block, last_delta = -1, None, None
    for event in events[1:-2]:
        if event["type"] == "content_block_start":
            assert open_block is None and event["index"] == index + 1
            index, open_block, last_delta = event["index"], event["content_block"]["type"], None
        elif event["type"] == "content_block_delta":
            assert event["index"] == index and open_block is not None
            last_delta = event["delta"]["type"]
            assert last_delta == {"thinking": "thinking_delta", "text": "text_delta",
                                  "tool_use": "input_json_delta"}[open_block] or last_delta == "signature_delta"
        elif event["type"] == "content_block_stop":
            assert event["index"] == index and open_block is not None
            if open_block == "thinking":
                assert last_delta == "signature_delta"
            open_block = None
        else:
            assert event["type"] == "ping", event
    assert open_block is None
    return typed


def streamed_text(events: list[dict], kind: str = "text_delta") -> str:
    field = {"text_delta": "text", "thinking_delta": "thinking", "input_json_delta": "partial_json"}[kind]
    return "".join(e["delta"][field] for e in events if e["type"] == "content_block_delta"
                   and e["delta"]["type"] == kind)


def post(server, body: dict, path: str = "/v1/messages", headers: dict | None = None):
    return server.post(path, body, headers={"x-api-key": KEY, "anthropic-version": "2023-06-01", **(headers or {})})


def check_error(response, status: int, kind: str, *names: str) -> dict:
    """An error in Anthropic's envelope, naming what was wrong."""
    assert response.status == status, response
    body = response.json()
    assert body.keys() == {"type", "error"} and body["type"] == "error", body
    assert body["error"].keys() == {"type", "message"} and body["error"]["type"] == kind, body
    for name in names:
        assert name in body["error"]["message"], body
    return body


# ------------------------------------------------------------------------------ text


def test_create_answers_a_message_the_sdk_reads(sdk):
    raw = sdk.messages.with_raw_response.create(model="demo", max_tokens=8, messages=QUESTION, extra_body=GREEDY)
    message = check_message(raw.http_response.json())
    assert raw.parse() == message
    [block] = message.content
    assert block.type == "text" and block.text.strip()
    assert message.model == "demo" and message.stop_reason == "max_tokens" and message.stop_sequence is None
    assert message.usage.output_tokens == 8
    assert message.usage.input_tokens + message.usage.cache_read_input_tokens > 5
    assert message.usage.cache_creation_input_tokens == 0


def test_a_stream_is_anthropics_events_and_says_what_create_says(server, sdk):
    body = {"model": "demo", "max_tokens": 8, "messages": QUESTION, "temperature": 0}
    whole = post(server, body).json()
    raw = post(server, {**body, "stream": True})
    assert raw.status == 200 and raw.headers["content-type"].startswith("text/event-stream")
    events = events_of(raw.body)
    check_stream(events)
    assert events[1]["type"] == "ping"  # the first silence, as Anthropic's own stream has it
    assert streamed_text(events) == whole["content"][0]["text"]
    assert events[-2]["delta"] == {"stop_reason": "max_tokens", "stop_sequence": None}
    assert events[-2]["usage"]["output_tokens"] == 8

    with sdk.messages.stream(model="demo", max_tokens=8, messages=QUESTION, extra_body=GREEDY) as stream:
        text = "".join(stream.text_stream)
        final = stream.get_final_message()
    assert text == final.content[0].text == whole["content"][0]["text"]
    assert final.stop_reason == "max_tokens" and final.usage.output_tokens == 8


def test_silences_are_filled_with_ping_events(server):
    with InterceptedGenerates(server.serving, hold=True) as spy:
        timer = threading.Timer(0.5, spy.release)  # the backend busy for half a second
        timer.start()
        raw = post(server, {"model": "demo", "max_tokens": 4, "messages": QUESTION, "stream": True})
        timer.join()
    assert raw.status == 200
    assert not [line for line in raw.body.split(b"\n") if line.startswith(b":")]  # no comment pings: Anthropic's
    events = events_of(raw.body)
    check_stream(events)
    assert events[0]["type"] == "message_start" and sum(e["type"] == "ping" for e in events) >= 2
    usage = events[-2]["usage"]  # message_start could not know the prompt's size yet: the end says it
    assert usage["output_tokens"] == 4 and usage["input_tokens"] + usage["cache_read_input_tokens"] > 5


def test_a_stop_sequence_ends_the_reply_and_is_named(server, sdk):
    free = sdk.messages.create(model="demo", max_tokens=16, messages=QUESTION, extra_body=GREEDY).content[0].text
    words = free.split()
    stop = next(w for w in words[1:] if len(w) > 2)  # a word the reply goes on to write
    before = free[:free.index(stop)]
    message = sdk.messages.create(model="demo", max_tokens=16, messages=QUESTION, extra_body=GREEDY,
                                  stop_sequences=["zzz-never", stop])
    assert (message.content[0].text, message.stop_reason, message.stop_sequence) == (before, "stop_sequence", stop)
    events = events_of(post(server, {"model": "demo", "max_tokens": 16, "messages": QUESTION, "temperature": 0,
                                     "stop_sequences": [stop], "stream": True}).body)
    check_stream(events)
    assert streamed_text(events) == before
    assert events[-2]["delta"] == {"stop_reason": "stop_sequence", "stop_sequence": stop}


def test_system_blocks_and_a_system_message_are_system_turns(server, sdk):
    with InterceptedGenerates(server.serving) as spy:
        sdk.messages.create(model="demo", max_tokens=1, system=[{"type": "text", "text": "Speak as a prophet."},
                                                                 {"type": "text", "text": "Be brief."}],
                            messages=[*QUESTION, {"role": "assistant", "content": "God."},
                                      {"role": "system", "content": "The user is in a hurry."},
                                      {"role": "user", "content": [{"type": "text", "text": "When?"}]}])
    assert spy.sent[0].prompt == ("System: Speak as a prophet.\nBe brief.\n\nUser: Who made the light?\n\n"
                                  "Assistant: God.\n\nSystem: The user is in a hurry.\n\nUser: When?\n\nAssistant:")


def test_count_tokens_is_what_the_model_reads(server, sdk):
    system = "Speak as a prophet."
    counted = sdk.messages.count_tokens(model="demo", system=system, messages=QUESTION, tools=[WEATHER])
    strict(MessageTokensCount, counted.model_dump())
    with InterceptedGenerates(server.serving) as spy:
        message = sdk.messages.create(model="demo", max_tokens=1, system=system, messages=QUESTION, tools=[WEATHER])
    tokenizer = server.serving.model.tokenizer
    assert counted.input_tokens == len(tokenizer.encode(spy.sent[0].prompt))
    assert counted.input_tokens == message.usage.input_tokens + message.usage.cache_read_input_tokens
    assert "get_weather" in spy.sent[0].prompt


# ------------------------------------------------------------------------------ tools


def test_a_forced_tool_call_and_its_result_round_trip(server, sdk):
    question = [{"role": "user", "content": "What is the weather in Paris?"}]
    called = sdk.messages.create(model="demo", max_tokens=24, extra_body=GREEDY, messages=question, tools=[WEATHER],
                                 tool_choice={"type": "tool", "name": "get_weather"})
    check_message(called.model_dump(exclude_unset=True))
    [use] = called.content
    assert use.type == "tool_use" and use.name == "get_weather" and use.id.startswith("toolu_")
    assert isinstance(use.input, dict) and use.input.get("city") in CITIES
    assert called.stop_reason == "tool_use"

    history = [*question, {"role": "assistant", "content": [b.model_dump(exclude_unset=True) for b in called.content]},
               {"role": "user", "content": [{"type": "tool_result", "tool_use_id": use.id,
                                             "content": [{"type": "text", "text": "Sunny, 24 degrees"}]}]}]
    with InterceptedGenerates(server.serving) as spy:
        answer = sdk.messages.create(model="demo", max_tokens=12, extra_body=GREEDY, messages=history, tools=[WEATHER])
    assert answer.stop_reason in ("end_turn", "max_tokens", "tool_use") and answer.content
    prompt = spy.sent[0].prompt
    assert f'<tool_call>{{"name": "get_weather", "arguments": {json.dumps(use.input)}}}</tool_call>' in prompt
    assert "Observation: Sunny, 24 degrees" in prompt


def test_a_streamed_tool_call_sends_its_input_as_json_deltas(server, sdk):
    body = {"model": "demo", "max_tokens": 24, "temperature": 0, "stream": True, "tools": [WEATHER],
            "messages": [{"role": "user", "content": "Weather in Rome?"}], "tool_choice": {"type": "any"}}
    events = events_of(post(server, body).body)
    check_stream(events)
    [start] = [e for e in events if e["type"] == "content_block_start"]
    assert start["content_block"]["type"] == "tool_use" and start["content_block"]["input"] == {}
    assert json.loads(streamed_text(events, "input_json_delta"))["city"] in CITIES
    assert events[-2]["delta"]["stop_reason"] == "tool_use"

    with sdk.messages.stream(**{k: v for k, v in body.items() if k not in ("stream", "temperature")},
                             extra_body=GREEDY) as stream:
        final = stream.get_final_message()
    assert final.content[0].type == "tool_use" and final.content[0].input["city"] in CITIES


def test_tool_choice_none_and_errors_in_tool_results(server, sdk):
    use = {"type": "tool_use", "id": "toolu_1", "name": "get_weather", "input": {"city": "Ur"}}
    history = [{"role": "user", "content": "Weather in Ur?"}, {"role": "assistant", "content": [use]},
               {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_1", "is_error": True,
                                             "content": "no such city"}, {"type": "text", "text": "Well?"}]}]
    with InterceptedGenerates(server.serving) as spy:
        message = sdk.messages.create(model="demo", max_tokens=6, messages=history, tools=[WEATHER],
                                      tool_choice={"type": "none"})
    assert [b.type for b in message.content] == ["text"] and message.stop_reason != "tool_use"
    prompt = spy.sent[0].prompt
    assert "You can call these functions" not in prompt  # none: the tools are not offered
    assert prompt.endswith("Observation: Error: no such city\n\nUser: Well?\n\nAssistant:")


# ------------------------------------------------------------------------------ thinking


def test_thinking_is_a_thinking_block_streamed_as_thinking_deltas(thinker, thinker_sdk):
    body = {"model": "tiny", "max_tokens": 10, "temperature": 0, "messages": QUESTION,
            "thinking": {"type": "enabled", "budget_tokens": 1024}}
    message = check_message(post(thinker, body).json())
    [block] = message.content  # the tiny model never closes its thought: all thinking
    assert block.type == "thinking" and block.thinking and block.signature
    assert message.stop_reason == "max_tokens"
    events = events_of(post(thinker, {**body, "stream": True}).body)
    check_stream(events)
    assert streamed_text(events, "thinking_delta") == block.thinking
    with thinker_sdk.messages.stream(**{k: v for k, v in body.items() if k != "temperature"},
                                     extra_body=GREEDY) as stream:
        thoughts = [e.thinking for e in stream if e.type == "thinking"]
        final = stream.get_final_message()
    assert "".join(thoughts) == block.thinking == final.content[0].thinking


@pytest.mark.parametrize("fields, ending", [
    ({}, "light? think a bit\n\nAssistant: <think"),  # the model's default effort (config: low)
    ({"thinking": {"type": "adaptive", "display": "omitted"}}, "light? think a bit\n\nAssistant: <think"),
    ({"thinking": {"type": "adaptive"}, "output_config": {"effort": "high"}},
     "light? think a lot\n\nAssistant: <think"),
    ({"thinking": {"type": "enabled", "budget_tokens": 32000}}, "light? think a lot\n\nAssistant: <think"),
    ({"thinking": {"type": "disabled"}, "output_config": {"effort": "high"}}, "light?\n\nAssistant: <think>\n</think"),
])
def test_thinking_and_effort_pick_the_prompt(thinker, thinker_sdk, fields, ending):
    with InterceptedGenerates(thinker.serving) as spy:
        thinker_sdk.messages.create(model="tiny", max_tokens=1, messages=QUESTION, extra_body=fields)
    assert spy.sent[0].prompt.endswith(ending), spy.sent[0].prompt


def test_thinking_sent_back_is_dropped(thinker, thinker_sdk):
    history = [*QUESTION, {"role": "assistant", "content": [
        {"type": "thinking", "thinking": "Genesis one.", "signature": "ai00-like-unsigned"},
        {"type": "redacted_thinking", "data": "abc"}, {"type": "text", "text": "God."}]},
        {"role": "user", "content": "Why?"}]
    with InterceptedGenerates(thinker.serving) as spy:
        thinker_sdk.messages.create(model="tiny", max_tokens=1, messages=history, thinking={"type": "disabled"})
    assert "Genesis" not in spy.sent[0].prompt and "Assistant: God.\n\nUser: Why?" in spy.sent[0].prompt


# ------------------------------------------------------------------------------ clients


def test_langchain_anthropic_invokes_and_calls_a_forced_tool(server):
    from langchain_anthropic import ChatAnthropic
    from langchain_core.tools import tool

    @tool
    def count_word(word: str) -> int:
        """How many times a word occurs in the King James Bible."""
        return 42

    llm = ChatAnthropic(model=ALIAS, base_url=server.running.url, api_key=KEY, temperature=0, max_tokens=12,
                        max_retries=0)
    answer = llm.invoke("Who made the light?")
    assert isinstance(answer.content, str) and answer.content.strip()
    forced = llm.model_copy(update={"max_tokens": 48}).bind_tools([count_word], tool_choice="count_word")
    called = forced.invoke("How often does light occur?")
    [call] = called.tool_calls
    assert call["name"] == "count_word" and isinstance(call["args"].get("word"), str)


def claude_code_request() -> dict:
    return json.loads((DATA / "claude_code_request.json").read_text())


class CappedGenerates(InterceptedGenerates):
    """Records each Generate and lets it run with at most `tokens` tokens: a reply as long
    as a request may ask for would only make the test slow."""

    def __init__(self, serving, tokens: int):
        super().__init__(serving)
        self.tokens = tokens

    def __enter__(self):
        def send(message):
            if isinstance(message, Generate):
                self.sent.append(message)
                message = msgspec.structs.replace(message, max_tokens=min(message.max_tokens, self.tokens))
            self._send(message)

        self.middleware.send = send
        return self


@pytest.mark.parametrize("stream", [True, False])
def test_a_claude_code_request_is_answered(server, stream):
    captured = claude_code_request()
    body = {**captured["body"], "stream": stream, "max_tokens": 32000}
    with CappedGenerates(server.serving, 12) as spy:
        response = post(server, body, path=captured["path"], headers=captured["headers"])
    assert response.status == 200, response
    if stream:
        events = events_of(response.body)
        check_stream(events)
        assert events[-2]["delta"]["stop_reason"] in ("end_turn", "tool_use", "max_tokens")
    else:
        message = check_message(response.json())
        assert message.stop_reason in ("end_turn", "tool_use", "max_tokens") and message.model == "demo"
    [sent] = spy.sent
    assert sent.max_tokens == 4096  # 32000 asked: lowered to the model's max_tokens_limit
    assert sent.prompt.startswith("System: You can call these functions")
    assert "System: x-anthropic-billing-header" in sent.prompt and '{"name": "TodoWrite"' in sent.prompt
    assert "System: <system-reminder>The user opened the file" in sent.prompt


# ------------------------------------------------------------------------------ bad input


@pytest.mark.parametrize("change, names", [
    ({"messages": [{"role": "robot", "content": "hi"}]}, ["messages[0].role", "robot"]),
    ({"messages": [{"role": "user", "content": [{"type": "text", "text": "look"},
                                                {"type": "image", "source": {"type": "base64", "data": "AA"}}]}]},
     ["messages[0].content[1].type", "image"]),
    ({"messages": [{"role": "user", "content": [{"type": "document", "source": {}}]}]},
     ["messages[0].content[0].type", "document"]),
    ({"messages": [{"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_x", "content": [
        {"type": "image", "source": {}}]}]}]}, ["toolu_x"]),
    ({"messages": [{"role": "user", "content": "Weather?"},
                   {"role": "assistant", "content": [{"type": "tool_use", "id": "toolu_a", "name": "get_weather",
                                                      "input": {}}]},
                   {"role": "user", "content": [{"type": "tool_result", "tool_use_id": "toolu_b", "content": "x"}]}],
      "tools": [WEATHER]}, ["messages[2].content[0].tool_use_id", "toolu_b"]),
    ({"max_tokens": None}, ["max_tokens"]),
    ({"max_tokens": 0}, ["max_tokens"]),
    ({"max_tokens": "many"}, ["max_tokens"]),
    ({"messages": "hello"}, ["messages"]),
    ({"messages": []}, ["messages"]),
    ({"tools": [{"type": "web_search_20250305", "name": "web_search"}]}, ["tools[0].type", "web_search_20250305"]),
    ({"tools": [WEATHER], "tool_choice": {"type": "tool", "name": "nope"}}, ["nope"]),
    ({"thinking": {"type": "sometimes"}}, ["thinking.type"]),
    ({"output_config": {"effort": "extreme"}}, ["output_config.effort"]),
    ({"temperature": "hot"}, ["temperature"]),
])
def test_bad_input_is_an_anthropic_error_that_names_it(server, change, names):
    body = {"model": "demo", "max_tokens": 4, "messages": QUESTION, **change}
    body = {k: v for k, v in body.items() if v is not None}
    check_error(post(server, body), 400, "invalid_request_error", *names)
    check_error(post(server, {**body, "stream": True}), 400, "invalid_request_error", *names)


def test_refusals_before_the_handler_are_anthropic_errors_too(server, sdk):
    keyless = anthropic.Anthropic(base_url=server.running.url, api_key="wrong", max_retries=0)
    with pytest.raises(anthropic.AuthenticationError) as refused:
        keyless.messages.create(model="demo", max_tokens=1, messages=QUESTION)
    assert refused.value.body["error"]["type"] == "authentication_error"
    with pytest.raises(anthropic.NotFoundError):
        sdk.messages.create(model="claude-opus-9", max_tokens=1, messages=QUESTION)
    check_error(server.post("/v1/messages", "{not json", headers={"x-api-key": KEY}), 400, "invalid_request_error")
    # and the server goes on answering
    assert sdk.messages.create(model=ALIAS, max_tokens=2, messages=QUESTION).content


class FailingGenerates(InterceptedGenerates):
    """Each Generate starts, then fails: a backend that breaks once the stream has begun."""

    def __enter__(self):
        def send(message):
            if not isinstance(message, Generate):
                return self._send(message)
            self.sent.append(message)
            message.reply(Started(index=0, prompt_tokens=5, cached_tokens=0))
            message.reply(Failed("the backend broke", kind="internal"))

        self.middleware.send = send
        return self


def test_a_failure_after_the_stream_began_is_an_error_event(server, sdk):
    with FailingGenerates(server.serving):
        events = events_of(post(server, {"model": "demo", "max_tokens": 4, "messages": QUESTION, "stream": True}).body)
        with pytest.raises(anthropic.APIStatusError) as failed, sdk.messages.stream(
                model="demo", max_tokens=4, messages=QUESTION) as stream:
            stream.get_final_message()
    assert [e["type"] for e in events][0] == "message_start"
    assert events[-1] == {"type": "error", "error": {"type": "api_error", "message": "the backend broke"}}
    assert "the backend broke" in str(failed.value)
