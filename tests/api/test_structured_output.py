"""Structured output (issue 8): response_format, bnf_schema and tool calling, end to end.

Through the real server with the official `openai` SDK (and LangChain), on two models whose
unconstrained output is nothing like JSON: a synthetic one (random weights, gibberish from
the whole World vocabulary) and the bundled demo model (King James English). Whatever they
would write, the grammar makes every reply parse, and validate against its schema.
"""

from __future__ import annotations

import asyncio
import json
import random
import re
import threading
import weakref
from collections import OrderedDict
from pathlib import Path
from types import SimpleNamespace
from typing import Annotated

import jsonschema
import llguidance
import msgspec
import pytest
from api_helpers import SCHEMAS, InterceptedGenerates, ServerThread, config_for, payloads
from openai.types.chat import (
    ChatCompletionMessage,
    ChatCompletionMessageFunctionToolCall,
)
from openai.types.chat.chat_completion_message_function_tool_call import Function
from process_helpers import parse_metrics
from pydantic import BaseModel, Field

from ai00_like.api.oai.prompt import render_chat
from ai00_like.api.oai.structured import structured_output
from ai00_like.api.oai.tools import CLOSE, ToolCallReader, call_text, with_tools
from ai00_like.api.oai.types import (
    ChatCompletionRequest,
    ChatMessage,
    FunctionCallIn,
    FunctionDef,
    ToolCallIn,
    ToolDef,
)
from ai00_like.rwkv.tokenizer import default_tokenizer_path, load_tokenizer
from ai00_like.sampler import grammar as grammar_module
from ai00_like.sampler.grammar import compile_grammar
from ai00_like.sampler.kbnf import AI00_README_EXAMPLE, kbnf_to_lark

DEMO = Path(__file__).resolve().parents[2] / "assets" / "models"
USER = [{"role": "user", "content": "Tell me about a person."}]

README_OUTPUT = re.compile(r'\{\n\t"(name|age|job)": ("\w*"|[0-9]+)(,\n\t"(name|age|job)": ("\w*"|[0-9]+))*\n\}')

WEATHER = {
    "type": "object",
    "properties": {"city": {"type": "string", "maxLength": 16}, "unit": {"type": "string", "enum": ["C", "F"]}},
    "required": ["city", "unit"],
    "additionalProperties": False,
}
TOOLS = [
    {"type": "function", "function": {"name": "get_weather", "description": "Weather in a city", "parameters": WEATHER}},
    {"type": "function", "function": {"name": "get_time", "parameters": {
        "type": "object", "properties": {"zone": {"type": "integer", "minimum": -12, "maximum": 14}},
        "required": ["zone"], "additionalProperties": False}}},
]
TOOL_SCHEMAS = {t["function"]["name"]: t["function"]["parameters"] for t in TOOLS}


# Strings are bounded: a model of random weights never chooses to close a string on its own.
Tag = Annotated[str, Field(max_length=10)]


class Person(BaseModel):
    name: str = Field(max_length=20)
    age: int = Field(ge=0, le=130)
    email: str | None = Field(default=None, max_length=30)
    tags: list[Tag] = Field(max_length=3)


@pytest.fixture(scope="module", params=["synthetic", "demo"])
def server(request):
    if request.param == "synthetic":
        config = config_for(request.getfixturevalue("model_dir"))
    else:
        config = config_for(DEMO, f'[tokenizer]\npath = "{DEMO / "demo_vocab.txt"}"\n', model="demo.st")
    with ServerThread(config) as s:
        assert s.serving.model is not None
        yield s


@pytest.fixture(scope="module")
def model(client):
    return client.models.list().data[0].id


def stream_chunks(raw) -> list[dict]:
    """The chunks of a chat stream (pings skipped), each checked against OpenAI's schema."""
    events = payloads(raw.events())
    assert events[-1] == "[DONE]", events[-3:]
    chunks = [json.loads(e) for e in events[:-1]]
    for chunk in chunks:
        SCHEMAS.check("CreateChatCompletionStreamResponse", chunk)
    return chunks


def unconstrained(client, model) -> str:
    reply = client.chat.completions.create(model=model, messages=USER, max_tokens=40, temperature=0)
    return reply.choices[0].message.content


# ------------------------------------------------------------------------------ response_format


def test_parse_returns_a_pydantic_object(client, model):
    with pytest.raises(ValueError):
        json.loads(unconstrained(client, model))  # what the model writes on its own
    for seed in range(3):
        reply = client.chat.completions.parse(model=model, messages=USER, response_format=Person, max_tokens=400,
                                              temperature=1, seed=seed)
        choice = reply.choices[0]
        assert choice.finish_reason == "stop"
        assert isinstance(choice.message.parsed, Person), choice.message.content
        assert Person.model_validate_json(choice.message.content) == choice.message.parsed


def test_json_object_streams_a_json_object(server, model):
    raw = server.post("/v1/chat/completions", {"model": model, "messages": USER, "stream": True, "max_tokens": 60,
                                               "response_format": {"type": "json_object"}, "temperature": 0})
    assert raw.status == 200, raw
    chunks = stream_chunks(raw)
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    finish = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
    assert text.startswith("{")
    if finish == ["stop"]:
        assert isinstance(json.loads(text), dict)
    else:  # cut by max_tokens: still the beginning of an object, never anything else
        assert finish == ["length"]


def random_schema(rng: random.Random, depth: int = 0) -> dict:
    """Objects, arrays, enums, bounded numbers and strings, optional fields, nested."""
    kinds = ["string", "integer", "number", "enum", "boolean"] + (["object", "array"] if depth < 2 else [])
    kind = rng.choice(kinds)
    if kind == "string":
        return {"type": "string", "maxLength": rng.randint(1, 12)}
    if kind == "integer":
        low = rng.randint(-50, 50)
        return {"type": "integer", "minimum": low, "maximum": low + rng.randint(0, 1000)}
    if kind == "number":
        low = rng.uniform(-10, 10)
        # multipleOf bounds the digits too: this model would otherwise write decimals forever.
        return {"type": "number", "minimum": round(low, 2), "maximum": round(low + rng.uniform(0.5, 100), 2),
                "multipleOf": rng.choice([0.125, 0.5, 2])}  # exact in binary, as jsonschema checks
    if kind == "enum":
        return {"enum": rng.sample(["red", "green", "blue", 7, None, True, "a b"], rng.randint(1, 4))}
    if kind == "boolean":
        return {"type": "boolean"}
    if kind == "array":
        return {"type": "array", "items": random_schema(rng, depth + 1), "maxItems": rng.randint(1, 3)}
    names = rng.sample(["id", "name", "size", "kind", "child", "list", "flag", "score"], rng.randint(1, 4))
    return {"type": "object", "properties": {n: random_schema(rng, depth + 1) for n in names},
            "required": [n for n in names if rng.random() < 0.6], "additionalProperties": False}


@pytest.mark.parametrize("seed", range(8))
def test_random_schemas_always_validate(client, model, seed):
    rng = random.Random(seed)
    schema = {"type": "object", "properties": {"data": random_schema(rng), "more": random_schema(rng)},
              "required": ["data"], "additionalProperties": False}
    reply = client.chat.completions.create(
        model=model, messages=USER, max_tokens=600, temperature=1, seed=seed, n=2,
        response_format={"type": "json_schema", "json_schema": {"name": "r", "schema": schema, "strict": True}})
    for choice in reply.choices:
        assert choice.finish_reason == "stop", choice.message.content
        jsonschema.validate(json.loads(choice.message.content), schema)


def record_ends(server) -> dict:
    """A bias towards the newline that closes a README-grammar record: the grammar allows
    members without end, and a model that writes compact JSON adds them until max_tokens
    (closing each string and adding the next member in one `",` token, which is barred)."""
    encode = server.serving.model.tokenizer.encode
    bias = {str(encode("\n")[0]): 100, str(encode('"')[0]): 100}
    if len(encode('",')) == 1:
        bias[str(encode('",')[0])] = -100
    return bias


def test_constrained_and_free_requests_share_a_batch(server, client, model):
    """Several requests at once, some constrained and some not, one with n=3 and a stop string."""
    results = {}

    def run(key, **kw):
        results[key] = client.chat.completions.create(model=model, messages=USER, **{"max_tokens": 300, **kw})

    schema = Person.model_json_schema()
    jobs = {
        "person": {"response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema": schema}},
                       "n": 3, "temperature": 1, "seed": 1},
        "free": {"temperature": 0, "max_tokens": 30},
        "kbnf": {"extra_body": {"bnf_schema": AI00_README_EXAMPLE}, "temperature": 0,
                 "logit_bias": record_ends(server)},
        "stopped": {"extra_body": {"bnf_schema": 'start ::= "one, two, three";'}, "stop": [","]},
    }
    threads = [threading.Thread(target=run, args=(k,), kwargs=kw) for k, kw in jobs.items()]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(results["person"].choices) == 3
    for choice in results["person"].choices:
        assert choice.finish_reason == "stop"
        Person.model_validate_json(choice.message.content)
    assert results["free"].choices[0].message.content == unconstrained(client, model)[: len(
        results["free"].choices[0].message.content)]
    assert README_OUTPUT.fullmatch(results["kbnf"].choices[0].message.content)
    assert results["stopped"].choices[0].message.content == "one"  # the user's stop still applies


# ------------------------------------------------------------------------------ bnf_schema


def test_ai00_readme_grammar_on_chat_and_completions(server, client, model):
    chat = client.chat.completions.create(model=model, messages=USER, max_tokens=300, temperature=0,
                                          logit_bias=record_ends(server), extra_body={"bnf_schema": AI00_README_EXAMPLE})
    assert chat.choices[0].finish_reason == "stop"
    assert README_OUTPUT.fullmatch(chat.choices[0].message.content), chat.choices[0].message.content
    text = client.completions.create(model=model, prompt="A record:", max_tokens=300, temperature=0,
                                     logit_bias=record_ends(server), extra_body={"bnf_schema": AI00_README_EXAMPLE})
    assert text.choices[0].finish_reason == "stop"
    assert README_OUTPUT.fullmatch(text.choices[0].text), text.choices[0].text


def test_a_grammar_is_not_cut_by_the_default_blank_line_stop(client, model):
    grammar = 'start ::= "In the beginning" "\\n\\n" ("God" | "man") [" created"] ;'
    reply = client.chat.completions.create(model=model, messages=USER, max_tokens=50, extra_body={
        "bnf_schema": grammar})
    assert re.fullmatch(r"In the beginning\n\n(God|man)( created)?", reply.choices[0].message.content)


def test_response_format_on_completions(client, model):
    schema = {"type": "object", "properties": {"n": {"type": "integer", "minimum": 1, "maximum": 9}},
              "required": ["n"], "additionalProperties": False}
    reply = client.completions.create(model=model, prompt="Number:", max_tokens=50, extra_body={
        "response_format": {"type": "json_schema", "json_schema": {"name": "n", "schema": schema, "strict": True}}})
    jsonschema.validate(json.loads(reply.choices[0].text), schema)


def test_json_object_on_completions(server, client, model):
    """The reply is one JSON object and ends where it closes. The bias only helps a weak model
    close its strings (the demo model's King James English has no quotation marks)."""
    tokenizer = server.serving.model.tokenizer
    closing = {str(tokenizer.encode(c)[0]): 100 for c in '"}'}
    reply = client.completions.create(model=model, prompt="A record:", max_tokens=200, temperature=0,
                                      logit_bias=closing, extra_body={"response_format": {"type": "json_object"}})
    choice = reply.choices[0]
    assert choice.finish_reason == "stop", choice
    assert isinstance(json.loads(choice.text), dict), choice.text


# ------------------------------------------------------------------------------ caching


class Builds:
    """Counts the calls of an llguidance constructor; everything else passes through."""

    def __init__(self, real):
        self.real, self.count = real, 0

    def __call__(self, *args, **kwargs):
        self.count += 1
        return self.real(*args, **kwargs)

    def __getattr__(self, name):
        return getattr(self.real, name)


def test_vocabulary_index_and_grammar_are_built_once(client, model, monkeypatch):
    """Identical requests build the vocabulary index and compile the schema once; the next ones
    start from copies of the cached grammar (and so answer the same)."""
    monkeypatch.setattr(grammar_module, "_vocabularies", weakref.WeakKeyDictionary())  # as after a start
    monkeypatch.setattr(grammar_module, "_compiled", OrderedDict())
    index = Builds(llguidance.LLTokenizer)
    matcher = Builds(llguidance.LLMatcher)
    monkeypatch.setattr(llguidance, "LLTokenizer", index)
    monkeypatch.setattr(llguidance, "LLMatcher", matcher)

    def ask(schema):
        reply = client.chat.completions.create(
            model=model, messages=USER, max_tokens=100, temperature=0,
            response_format={"type": "json_schema", "json_schema": {"name": "c", "schema": schema, "strict": True}})
        assert reply.choices[0].finish_reason == "stop", reply
        jsonschema.validate(json.loads(reply.choices[0].message.content), schema)
        return reply.choices[0].message.content

    schema = {"type": "object", "properties": {"size": {"enum": ["small", "large"]}, "n": {"type": "integer",
              "minimum": 0, "maximum": 99}}, "required": ["size", "n"], "additionalProperties": False}
    first = ask(schema)
    assert (index.count, matcher.count) == (1, 1)
    assert ask(schema) == first
    assert ask(schema) == first
    assert (index.count, matcher.count) == (1, 1)
    ask({**schema, "required": ["size"]})  # another schema is compiled, on the same index
    assert (index.count, matcher.count) == (1, 2)


# ------------------------------------------------------------------------------ tools


def check_calls(message, finish, names=None):
    assert message.tool_calls and finish in ("tool_calls", "length"), (message, finish)
    ids = set()
    for k, call in enumerate(message.tool_calls):
        assert call.type == "function" and call.id.startswith("call_") and call.id not in ids
        ids.add(call.id)
        assert names is None or call.function.name in names
        if finish == "tool_calls" or k < len(message.tool_calls) - 1:  # cut by max_tokens: the last one is partial
            jsonschema.validate(json.loads(call.function.arguments), TOOL_SCHEMAS[call.function.name])


def round_trip(client, model, stream: bool):
    messages = [{"role": "user", "content": "What is the weather in Paris?"}]

    def ask(**kw):
        if not stream:
            reply = client.chat.completions.create(model=model, messages=messages, tools=TOOLS, **kw)
            return reply.choices[0].message, reply.choices[0].finish_reason
        content, calls, finish = None, {}, None
        for chunk in client.chat.completions.create(model=model, messages=messages, tools=TOOLS, stream=True, **kw):
            delta = chunk.choices[0].delta
            if delta.content is not None:
                content = (content or "") + delta.content
            for piece in delta.tool_calls or ():
                if piece.id:  # a new call: id, type and name come first, arguments follow
                    assert piece.index not in calls and piece.type == "function"
                    calls[piece.index] = ChatCompletionMessageFunctionToolCall(
                        id=piece.id, type="function", function=Function(name=piece.function.name, arguments=""))
                calls[piece.index].function.arguments += piece.function.arguments
            finish = chunk.choices[0].finish_reason or finish
        message = ChatCompletionMessage(role="assistant", content=content, tool_calls=list(calls.values()) or None)
        return message, finish

    message, finish = ask(tool_choice="required", max_tokens=300, temperature=0, parallel_tool_calls=False)
    assert finish == "tool_calls" and message.content is None
    check_calls(message, finish)
    assert len(message.tool_calls) == 1
    call = message.tool_calls[0]
    messages.append({"role": "assistant", "content": None, "tool_calls": [call.model_dump()]})
    messages.append({"role": "tool", "tool_call_id": call.id, "content": "18 degrees, light rain"})
    answer, finish = ask(tool_choice="none", max_tokens=30, temperature=0)
    assert not answer.tool_calls and answer.content and finish in ("stop", "length")
    return call


def test_tool_round_trip(client, model):
    call = round_trip(client, model, stream=False)
    streamed = round_trip(client, model, stream=True)
    # Greedy: the streamed call is the same call, piece by piece.
    assert (streamed.function.name, streamed.function.arguments) == (call.function.name, call.function.arguments)


@pytest.mark.parametrize("choice, tools", [
    ({"type": "function", "function": {"name": "get_time"}}, TOOLS),
    ("required", TOOLS[1:]),  # required with one function offered: the same forced call
])
def test_a_forced_call_opens_in_the_prompt_and_only_its_arguments_are_generated(server, client, model, choice,
                                                                                  tools):
    # Room for the longest arguments and the closing tag, not for the opening as well.
    tokenizer = server.serving.model.tokenizer
    budget = len(tokenizer.encode('{"zone": -12}' + CLOSE)) + 1
    assert budget < len(tokenizer.encode(" " + call_text("get_time", '{"zone": -12}')))
    body = dict(model=model, messages=USER, tools=tools, tool_choice=choice, max_tokens=budget, temperature=0,
                parallel_tool_calls=False)
    with InterceptedGenerates(server.serving) as spy:
        reply = client.chat.completions.create(**body)
    assert spy.sent[0].prompt.endswith('\n\nAssistant: <tool_call>{"name": "get_time", "arguments": ')
    message, finish = reply.choices[0].message, reply.choices[0].finish_reason
    check_calls(message, finish, {"get_time"})
    assert finish == "tool_calls" and len(message.tool_calls) == 1, message
    assert reply.usage.completion_tokens <= budget
    jsonschema.validate(json.loads(message.tool_calls[0].function.arguments), TOOL_SCHEMAS["get_time"])
    # Streamed, the call's name goes out with the opening chunks, before any token.
    calls, finishes = streamed_calls(server, body)
    assert finishes == ["tool_calls"] and [c[1:] for c in calls] == [["get_time",
                                                                        message.tool_calls[0].function.arguments]]


def test_named_tool_choice_and_parallel_calls(server, client, model):
    reply = client.chat.completions.create(model=model, messages=USER, tools=TOOLS, max_tokens=400, temperature=1,
                                           seed=4, tool_choice={"type": "function", "function": {"name": "get_time"}})
    check_calls(reply.choices[0].message, reply.choices[0].finish_reason, {"get_time"})
    raw = server.post("/v1/chat/completions", {"model": model, "messages": USER, "tools": TOOLS, "max_tokens": 400,
                                               "tool_choice": "required", "temperature": 1, "seed": 11, "n": 4})
    assert raw.status == 200, raw
    raw_json = raw.json()
    SCHEMAS.check("CreateChatCompletionResponse", raw_json)
    for choice in raw_json["choices"]:
        assert choice["finish_reason"] in ("tool_calls", "length")
        calls = choice["message"]["tool_calls"]
        # Cut by max_tokens, the last call is as far as it got; every call before it is whole.
        for call in calls if choice["finish_reason"] == "tool_calls" else calls[:-1]:
            jsonschema.validate(json.loads(call["function"]["arguments"]), TOOL_SCHEMAS[call["function"]["name"]])
    # The same request streamed: every chunk is OpenAI's shape, and the pieces add up to the same calls.
    raw = server.post("/v1/chat/completions", {"model": model, "messages": USER, "tools": TOOLS, "max_tokens": 400,
                                               "tool_choice": "required", "temperature": 1, "seed": 11, "n": 4,
                                               "stream": True})
    assert raw.status == 200, raw
    calls = {}
    for chunk in stream_chunks(raw):
        for choice in chunk["choices"]:
            for piece in choice["delta"].get("tool_calls", ()):
                key = (choice["index"], piece["index"])
                if "id" in piece:
                    calls[key] = [piece["function"]["name"], ""]
                calls[key][1] += piece["function"].get("arguments", "")
    whole = {(c["index"], k): [call["function"]["name"], call["function"]["arguments"]]
             for c in raw_json["choices"] for k, call in enumerate(c["message"]["tool_calls"])}
    assert calls == whole


def tool_grammar(body: dict):
    """The compiled grammar of a chat request's output constraints, on the World vocabulary."""
    req = msgspec.convert({"messages": USER, **body}, ChatCompletionRequest)
    model = SimpleNamespace(info=SimpleNamespace(vocab=65536), tokenizer=WORLD)
    return asyncio.run(structured_output(req, model, chat=True)).grammar


@pytest.mark.parametrize("parallel", [None, True, False])
def test_parallel_tool_calls_decide_whether_a_second_call_may_follow(parallel):
    flag = {} if parallel is None else {"parallel_tool_calls": parallel}  # not given: on, as OpenAI
    grammar = tool_grammar({"tools": TOOLS, "tool_choice": "required", **flag})
    one = " " + call_text("get_weather", '{"city": "Paris", "unit": "C"}')
    two = one + "\n" + call_text("get_time", '{"zone": -3}')
    assert accepts(grammar, one)
    assert accepts(grammar, two) == (parallel is not False)
    assert accepts(grammar, two + "\n" + call_text("get_time", '{"zone": 4}')) == (parallel is not False)
    assert not accepts(grammar, one + "\n")  # a call separator is always followed by a call
    assert accepts(grammar, one + "\n\n") == (parallel is not False)  # or the blank line ends the turn
    assert accepts(grammar, two + "\n\n") == (parallel is not False)


def test_a_thought_before_the_call_does_not_free_the_call():
    """A model that thinks unasked may, but the call after its thinking still names an offered
    function with valid arguments, and free text never holds a call."""
    grammar = tool_grammar({"tools": TOOLS})  # auto
    thought = "<think>\nThe man asketh of the weather.\n</think>\n"
    assert accepts(grammar, thought + call_text("get_weather", '{"city": "Paris", "unit": "C"}'))
    assert not accepts(grammar, thought + call_text("count_word", '{"word": "light"}'))
    assert accepts(grammar, thought + "It is fair.")
    assert not accepts(grammar, "Here it is: " + call_text("count_word", '{"word": "light"}'))


def streamed_calls(server, body: dict) -> tuple[list[list], list[str]]:
    """A streamed chat's calls as [id, name, arguments] by their delta index, and its finish reasons."""
    raw = server.post("/v1/chat/completions", {**body, "stream": True})
    assert raw.status == 200, raw
    calls, finish = {}, []
    for chunk in stream_chunks(raw):
        for choice in chunk["choices"]:
            finish += [choice["finish_reason"]] if choice["finish_reason"] else []
            for piece in choice["delta"].get("tool_calls", ()):
                if "id" in piece:  # a new call: its index is the next one, never one already used
                    assert piece["index"] == len(calls), (piece, calls)
                    calls[piece["index"]] = [piece["id"], piece["function"]["name"], ""]
                calls[piece["index"]][2] += piece["function"].get("arguments", "")
    return [calls[k] for k in sorted(calls)], finish


def call_after_call(server) -> dict:
    """A logit bias that makes the model write call after call where it may: the newline after
    a call, then the space that may open the next one (over the second newline that would end
    the reply)."""
    tokenizer = server.serving.model.tokenizer
    [newline], [space] = tokenizer.encode("\n"), tokenizer.encode(" ")
    return {str(newline): 50, str(space): 100}


def test_parallel_tool_calls_end_to_end(server, client, model):
    """With parallel calls on (the default) a model that wants more calls makes call after call;
    one that wants to stop after a call ends its reply there, never made to go on; with them
    off, exactly one call."""
    [newline] = server.serving.model.tokenizer.encode("\n")
    body = {"model": model, "messages": USER, "tools": TOOLS, "tool_choice": "required", "max_tokens": 300,
            "temperature": 0, "logit_bias": call_after_call(server)}
    reply = client.chat.completions.create(**body)
    message, finish = reply.choices[0].message, reply.choices[0].finish_reason
    check_calls(message, finish)
    assert finish == "length" and len(message.tool_calls) >= 3, message  # ≥ 2 whole calls, then a cut one
    calls, finishes = streamed_calls(server, body)
    assert finishes == ["length"]
    assert [c[1:] for c in calls] == [[c.function.name, c.function.arguments] for c in message.tool_calls]
    assert len({c[0] for c in calls}) == len(calls)

    # Biased towards the newline alone, the model ends the reply after its first call (the
    # blank line that ends a turn), where a grammar of call ("\n" call)* made it go on.
    ends = {**body, "logit_bias": {str(newline): 100}}
    for flag in ({}, {"parallel_tool_calls": False}):
        reply = client.chat.completions.create(**ends, **flag)
        message, finish = reply.choices[0].message, reply.choices[0].finish_reason
        check_calls(message, finish)
        assert finish == "tool_calls" and len(message.tool_calls) == 1, (flag, message)
    reply = client.chat.completions.create(**body, parallel_tool_calls=False)
    message, finish = reply.choices[0].message, reply.choices[0].finish_reason
    check_calls(message, finish)
    assert finish == "tool_calls" and len(message.tool_calls) == 1, message


def test_calls_released_together_stream_with_their_own_indices(server, client, model):
    """A stop string can hold text back until two calls' names are known at once; each call
    still streams under its own index."""
    body = {"model": model, "messages": USER, "tools": TOOLS, "tool_choice": "required", "max_tokens": 300,
            "temperature": 0, "logit_bias": call_after_call(server)}
    first, second = client.chat.completions.create(**body).choices[0].message.tool_calls[:2]
    # Stop strings that match both calls until the second one's closing tag, where they ask for
    # an "X" the grammar forbids: everything up to there is held back, then released at once.
    stop = [call_text(first.function.name, first.function.arguments) + separator
            + call_text(second.function.name, second.function.arguments).removesuffix(CLOSE) + "X"
            for separator in ("\n", "\n ")]  # a call may begin with a space
    calls, _ = streamed_calls(server, {**body, "stop": stop})
    assert [c[1:] for c in calls[:2]] == [[first.function.name, first.function.arguments],
                                          [second.function.name, second.function.arguments]]


def test_auto_tool_choice_gives_text_or_valid_calls(client, model):
    for seed in range(4):
        reply = client.chat.completions.create(model=model, messages=USER, tools=TOOLS, max_tokens=200,
                                               temperature=1, seed=seed)
        choice = reply.choices[0]
        if choice.message.tool_calls:
            check_calls(choice.message, choice.finish_reason)
        else:
            assert choice.message.content and "<tool_call>" not in choice.message.content


def test_auto_tool_choice_with_a_response_format(client, model):
    """tool_choice auto and a JSON schema: either calls, or an answer in the schema."""
    schema = {"type": "object", "properties": {"answer": {"enum": ["yes", "no"]}}, "required": ["answer"]}
    for seed in range(6):
        reply = client.chat.completions.create(
            model=model, messages=USER, tools=TOOLS, max_tokens=200, temperature=1, seed=seed,
            response_format={"type": "json_schema", "json_schema": {"name": "a", "schema": schema}})
        choice = reply.choices[0]
        if choice.message.tool_calls:
            check_calls(choice.message, choice.finish_reason)
        else:
            jsonschema.validate(json.loads(choice.message.content), schema)


def test_tools_and_results_render_into_the_prompt():
    tools = [ToolDef(FunctionDef("get_weather", "Weather in a city", WEATHER))]
    messages = [
        ChatMessage("user", "Weather in Paris?"),
        ChatMessage("assistant", None, tool_calls=[ToolCallIn(FunctionCallIn("get_weather", '{"city":"Paris"}'),
                                                              id="call_1")]),
        ChatMessage("tool", "18 degrees", tool_call_id="call_1"),
    ]
    prompt = render_chat(with_tools(messages, tools)).prompt
    assert prompt.startswith("System: You can call these functions.")
    assert '{"name": "get_weather", "description": "Weather in a city", "parameters": {"type": "object"' in prompt
    assert prompt.endswith('User: Weather in Paris?\n\nAssistant: <tool_call>{"name": "get_weather", '
                           '"arguments": {"city": "Paris"}}</tool_call>\n\nObservation: 18 degrees\n\nAssistant:')


@pytest.mark.parametrize("size", [1, 2, 3, 7])
def test_tool_call_reader_streams_the_same_calls_at_any_split(size):
    args = ['{"city": "a}</tool_call>b", "unit": "C"}', '{"zone": -3}']
    text = " " + "\n".join(call_text(n, a) for n, a in zip(["get_weather", "get_time"], args))
    reader, pieces = ToolCallReader(), {0: "", 1: ""}
    names = []
    events = [e for i in range(0, len(text), size) for e in reader.push(text[i : i + size])] + reader.finish()
    for event in events:
        assert event[0] != "content"
        if event[0] == "call":
            names.append(event[1].name)
        else:
            pieces[event[1]] += event[2]
    assert names == ["get_weather", "get_time"] and [pieces[0], pieces[1]] == args
    assert [c.arguments for c in reader.calls if c.complete] == args


def test_text_that_only_looks_like_a_call_start_is_content():
    reader = ToolCallReader()
    assert reader.push(" <tool") == []
    assert reader.push("s are handy") == [("content", " <tools are handy")]
    assert reader.push(" indeed") == [("content", " indeed")]


# ------------------------------------------------------------------------------ LangChain


def test_langchain_with_structured_output(server, model):
    from langchain_openai import ChatOpenAI

    llm = ChatOpenAI(base_url=server.base_url, api_key="unused", model=model, temperature=0, max_tokens=400,
                     max_retries=0)
    for method in ("json_schema", "function_calling"):
        result = llm.with_structured_output(Person, method=method).invoke("Describe a person.")
        assert isinstance(result, Person), method


# ------------------------------------------------------------------------------ errors


@pytest.mark.parametrize("body,param", [
    ({"bnf_schema": "start ::= missing;"}, "bnf_schema"),
    ({"bnf_schema": "start ::= 'a'"}, "bnf_schema"),
    ({"bnf_schema": "start ::= #\"[a\";"}, "bnf_schema"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "strict": True,
                                                                 "schema": {"type": "objekt"}}}},
     "response_format.json_schema.schema"),
    ({"response_format": {"type": "json_schema", "json_schema": {"name": "x"}}}, "response_format.json_schema.schema"),
    ({"response_format": {"type": "yaml"}}, "response_format.type"),
    ({"response_format": {"type": "json_object"}, "bnf_schema": "start ::= 'a';"}, "bnf_schema"),
    ({"tools": [{"type": "function", "function": {"name": "f", "strict": True,
                                                  "parameters": {"type": "object", "properties": {"a": {"type": 5}}}}}],
      "tool_choice": "required"}, "tools[0].function.parameters"),
    ({"tools": [{"type": "function", "function": {"name": "bad name"}}]}, "tools[0].function.name"),
    ({"tools": TOOLS, "tool_choice": {"type": "function", "function": {"name": "nope"}}},
     "tool_choice.function.name"),
    ({"tool_choice": "required"}, "tool_choice"),
    ({"tool_choice": "sometimes", "tools": TOOLS}, "tool_choice"),
])
@pytest.mark.parametrize("stream", [False, True])
def test_what_does_not_compile_is_a_400_before_generation(server, model, body, param, stream):
    before = backend_work(server)
    raw = server.post("/v1/chat/completions", {"model": model, "messages": USER, "stream": stream, **body})
    # Streamed or not, a plain HTTP 400 with OpenAI's envelope, not an error event in a stream.
    assert raw.status == 400, raw
    assert raw.headers["content-type"].startswith("application/json"), raw.headers
    SCHEMAS.check("ErrorResponse", raw.json())
    error = raw.json()["error"]
    assert error["param"] == param, error
    assert error["message"]
    assert backend_work(server) == before  # the backend never saw the request


def backend_work(server) -> tuple[float, float]:
    """Prompts the backend has looked up and tokens it has generated, from /metrics."""
    raw = server.get("/metrics")
    assert raw.status == 200, raw
    values = parse_metrics(raw.body.decode())
    return values["rwkv:state_cache_queries_total"], values["rwkv:generation_tokens_total"]


@pytest.mark.parametrize("where", ["response_format", "tools"])
def test_strict_refuses_what_it_cannot_enforce_and_lax_ignores_it(server, client, model, where):
    """uniqueItems is a keyword llguidance does not enforce: 400 with strict, ignored without."""
    picks = {"type": "array", "items": {"enum": ["a", "b"]}, "maxItems": 3}
    enforceable = {"type": "object", "properties": {"picks": picks}, "required": ["picks"],
                   "additionalProperties": False}
    schema = {**enforceable, "properties": {"picks": {**picks, "uniqueItems": True}}}

    def body(**strict):
        if where == "response_format":
            return {"response_format": {"type": "json_schema", "json_schema": {"name": "p", "schema": schema,
                                                                               **strict}}}
        return {"tools": [{"type": "function", "function": {"name": "pick", "parameters": schema, **strict}}],
                "tool_choice": "required", "parallel_tool_calls": False}

    for strict in ({}, {"strict": False}):  # first, so the lax grammar is in the cache when strict asks
        reply = client.chat.completions.create(model=model, messages=USER, max_tokens=100, temperature=0,
                                               extra_body=body(**strict))
        choice = reply.choices[0]
        assert choice.finish_reason == ("stop" if where == "response_format" else "tool_calls"), choice
        text = choice.message.content if where == "response_format" else choice.message.tool_calls[0].function.arguments
        jsonschema.validate(json.loads(text), enforceable)  # the rest of the schema still holds
    raw = server.post("/v1/chat/completions", {"model": model, "messages": USER, **body(strict=True)})
    assert raw.status == 400, raw
    SCHEMAS.check("ErrorResponse", raw.json())
    error = raw.json()["error"]
    param = "response_format.json_schema.schema" if where == "response_format" else "tools[0].function.parameters"
    assert error["param"] == param and "uniqueItems" in error["message"], error


# ------------------------------------------------------------------------------ KBNF dialect


def accepts(grammar, text: str) -> bool:
    """Does the grammar take `text` whole, token by token, and then allow end-of-text?"""
    constraint = grammar.start()
    for token in WORLD.encode(text):
        if not constraint.allowed()[token]:
            return False
        constraint.advance(token)
    return bool(constraint.allowed()[0])


WORLD = load_tokenizer(default_tokenizer_path())


@pytest.mark.parametrize("grammar,good,bad", [
    (AI00_README_EXAMPLE, ['{\n\t"name": "Ada",\n\t"age": 36\n}'], ['{\n\t"city": "x"\n}', '{"name": "Ada"}']),
    ("start ::= 'a' [\"b\"] {'c'} ;  (* optional, then repeated *)", ["a", "ab", "acc", "abccc"], ["b", "aa"]),
    ("start ::= x+ y? ; x ::= 'x' | 'z' ; y ::= #'[0-9]{2}' ;", ["x", "zxz", "xx42"], ["", "x4", "x123"]),
    ("start ::= '<' except!('>') '>' ;", ["<abc>", "<a b>"], ["<>", "<a>b>"]),
    ("start ::= '<' except!(close) close ; close ::= '</b>' | '</i>' ;", ["<x</b>", "<yy</i>"], ["<a</i>b</b>"]),
    ("start ::= #ex'\\n' ;", ["one line"], ["two\nlines"]),
    ('start ::= "tab\\there \\"quoted\\" \\u00e9" ;', ['tab\there "quoted" é'], ["tab"]),
])
def test_kbnf_dialect(grammar, good, bad):
    rules, start = kbnf_to_lark(grammar)
    compiled = compile_grammar(f"start: {start}\n{rules}", WORLD, 65536)
    for text in good:
        assert accepts(compiled, text), text
    for text in bad:
        assert not accepts(compiled, text), text


def test_a_grammar_wins_over_logit_bias(server, client, model):
    """Bias cannot push a token the grammar forbids; banning all it allows ends the reply."""
    tokenizer = server.serving.model.tokenizer
    grammar = 'start ::= "y" | "n" ;'
    [maybe] = tokenizer.encode("m")
    reply = client.completions.create(model=model, prompt="Answer:", max_tokens=10, extra_body={"bnf_schema": grammar},
                                      logit_bias={str(maybe): 100})
    assert reply.choices[0].text in ("y", "n")
    banned = {str(tokenizer.encode(letter)[0]): -100 for letter in "yn"}
    reply = client.completions.create(model=model, prompt="Answer:", max_tokens=10, extra_body={"bnf_schema": grammar},
                                      logit_bias=banned)
    assert reply.choices[0].text == "" and reply.choices[0].finish_reason == "stop"
