"""The Responses API through the real server with the openai SDK: create, stream, parse,
retrieve, delete, input items; conversations continued from the stored RNN state; the
store across a restart and past its cap; errors. Every response body and streamed event is
validated against OpenAI's schemas.

The tiny synthetic model's replies are gibberish but deterministic under greedy decoding.
"""

from __future__ import annotations

import json

import numpy as np
import openai
import pytest
from pydantic import BaseModel, Field

from ai00_like.response_store import Caller
from ai00_like.rwkv.state import State
from api_helpers import SCHEMAS, InterceptedGenerates, ServerThread, config_for, write_model

GREEDY = {"temperature": 0, "max_output_tokens": 8}
EVENT_SCHEMAS = {
    "response.created": "ResponseCreatedEvent",
    "response.in_progress": "ResponseInProgressEvent",
    "response.completed": "ResponseCompletedEvent",
    "response.incomplete": "ResponseIncompleteEvent",
    "response.output_item.added": "ResponseOutputItemAddedEvent",
    "response.output_item.done": "ResponseOutputItemDoneEvent",
    "response.content_part.added": "ResponseContentPartAddedEvent",
    "response.content_part.done": "ResponseContentPartDoneEvent",
    "response.output_text.delta": "ResponseTextDeltaEvent",
    "response.output_text.done": "ResponseTextDoneEvent",
    "response.reasoning_text.delta": "ResponseReasoningTextDeltaEvent",
    "response.reasoning_text.done": "ResponseReasoningTextDoneEvent",
    "response.function_call_arguments.delta": "ResponseFunctionCallArgumentsDeltaEvent",
    "response.function_call_arguments.done": "ResponseFunctionCallArgumentsDoneEvent",
}
WEATHER = {"type": "function", "name": "get_weather", "description": "Weather in a city",
           "parameters": {"type": "object", "properties": {"city": {"type": "string", "enum": ["Paris", "Rome"]}},
                          "required": ["city"], "additionalProperties": False}, "strict": True}


def make_server(directory, responses: str = ""):
    write_model(directory / "tiny.st")
    return ServerThread(config_for(directory, responses))


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return tmp_path_factory.mktemp("responses")


@pytest.fixture(scope="module")
def server(folder):
    with make_server(folder) as s:
        yield s


def checked(response) -> dict:
    body = response.model_dump(exclude_unset=True, by_alias=True) if not isinstance(response, dict) else response
    SCHEMAS.check("Response", body)
    return body


def test_create_retrieve_list_delete(server, client):
    made = client.responses.create(model="tiny", input="Who made the light?", instructions="Answer briefly.",
                                   metadata={"case": "one"}, **GREEDY)
    body = checked(made)
    assert made.id.startswith("resp_") and made.status in ("completed", "incomplete")
    assert body["metadata"] == {"case": "one"} and body["instructions"] == "Answer briefly."
    [message] = made.output
    assert message.type == "message" and message.content[0].type == "output_text"
    assert made.output_text == message.content[0].text and made.output_text
    assert made.usage.output_tokens <= 8 and made.usage.input_tokens > 0
    if made.status == "incomplete":
        assert made.incomplete_details.reason == "max_output_tokens"

    again = client.responses.retrieve(made.id)
    assert checked(again) == body  # the stored response, as it was returned
    items = client.responses.input_items.list(made.id)
    SCHEMAS.check("ResponseItemList", items.model_dump(exclude_unset=True, by_alias=True))
    assert [(i.type, i.role, i.content[0].text) for i in items.data] == [("message", "user", "Who made the light?")]

    deleted = client.responses.delete(made.id)
    assert deleted is None or getattr(deleted, "deleted", True)
    with pytest.raises(openai.NotFoundError) as e:
        client.responses.retrieve(made.id)
    assert e.value.body["code"] == "not_found"


def test_stream_events_follow_openai(server, client):
    events = list(client.responses.create(model="tiny", input="Tell me of the flood.", stream=True, **GREEDY))
    kinds = [e.type for e in events]
    assert kinds[:2] == ["response.created", "response.in_progress"]
    assert kinds[-1] in ("response.completed", "response.incomplete")
    assert [e.sequence_number for e in events] == list(range(len(events)))
    for event in events:
        SCHEMAS.check(EVENT_SCHEMAS[event.type], event.model_dump(exclude_unset=True, by_alias=True))
    assert kinds[2:5] == ["response.output_item.added", "response.content_part.added", "response.output_text.delta"]
    assert kinds[-4:-1] == ["response.output_text.done", "response.content_part.done", "response.output_item.done"]
    deltas = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    final = events[-1].response
    assert final.output_text == deltas and final.id == events[0].response.id
    # the stored one is the one streamed last
    assert client.responses.retrieve(final.id).output_text == deltas
    # the same request without streaming gives the same reply (greedy)
    assert client.responses.create(model="tiny", input="Tell me of the flood.", **GREEDY).output_text == deltas


def test_a_conversation_continues_from_the_stored_state(server, client):
    first = client.responses.create(model="tiny", input="Who built the ark?", **GREEDY)
    with InterceptedGenerates(server.serving) as spy:
        second = client.responses.create(model="tiny", input="And then?", previous_response_id=first.id, **GREEDY)
    checked(second)
    [sent] = spy.sent
    # Only the new turn is read, from the state the first response ended in.
    assert isinstance(sent.state, State) and "Who built the ark?" not in sent.prompt
    assert sent.prompt.rstrip().endswith("User: And then?\n\nAssistant:")
    assert len(sent.prefix) <= 1  # the first reply's last token, which the model had not read yet
    assert second.previous_response_id == first.id
    # It costs the new turn's tokens, not the conversation's.
    assert second.usage.input_tokens < first.usage.input_tokens + first.usage.output_tokens
    assert second.usage.input_tokens == len(sent.prefix) + len(server.serving.model.tokenizer.encode(sent.prompt))


def test_rebuilt_when_the_state_is_gone(server, client):
    first = client.responses.create(model="tiny", input="Who built the ark?", **GREEDY)
    second = client.responses.create(model="tiny", input="And then?", previous_response_id=first.id, **GREEDY)
    (server.serving.responses.folder / "states" / f"{first.id}.npz").unlink()  # as the cap would drop it
    with InterceptedGenerates(server.serving) as spy:
        rebuilt = client.responses.create(model="tiny", input="And then?", previous_response_id=first.id, **GREEDY)
    assert spy.sent[0].state is None and len(spy.sent[0].prefix) > 10  # the stored tokens, read again
    assert rebuilt.output_text == second.output_text


def test_function_tools_round_trip(server, client):
    call = client.responses.create(model="tiny", input="Weather in Paris?", tools=[WEATHER], tool_choice="required",
                                   temperature=0, max_output_tokens=40)
    body = checked(call)
    [item] = [o for o in call.output if o.type == "function_call"]
    assert item.name == "get_weather" and json.loads(item.arguments)["city"] in ("Paris", "Rome")
    assert body["tool_choice"] == "required" and body["tools"][0]["name"] == "get_weather"
    answer = client.responses.create(model="tiny", previous_response_id=call.id, tools=[WEATHER], **GREEDY,
                                     input=[{"type": "function_call_output", "call_id": item.call_id,
                                             "output": "Sunny, 25 C"}])
    checked(answer)
    assert answer.output[0].type == "message"
    items = client.responses.input_items.list(answer.id, order="asc")
    assert items.data[0].type == "function_call_output" and items.data[0].output == "Sunny, 25 C"


def test_streamed_function_call(server, client):
    events = list(client.responses.create(model="tiny", input="Weather?", tools=[WEATHER],
                                          tool_choice={"type": "function", "name": "get_weather"}, stream=True,
                                          temperature=0, max_output_tokens=40))
    for event in events:
        SCHEMAS.check(EVENT_SCHEMAS[event.type], event.model_dump(exclude_unset=True, by_alias=True))
    added = [e for e in events if e.type == "response.output_item.added"]
    assert added and added[0].item.type == "function_call" and added[0].item.name == "get_weather"
    done = next(e for e in events if e.type == "response.function_call_arguments.done")
    deltas = "".join(e.delta for e in events if e.type == "response.function_call_arguments.delta")
    assert done.arguments == deltas and json.loads(deltas)["city"] in ("Paris", "Rome")


class Verse(BaseModel):
    book: str = Field(max_length=8)  # a weak model may never close an unbounded string
    chapter: int = Field(ge=1, le=150)


def test_parse_with_a_json_schema(server, client):
    parsed = client.responses.parse(model="tiny", input="A verse, as JSON.", text_format=Verse, temperature=0,
                                    max_output_tokens=60)
    checked(parsed)
    assert parsed.status == "completed" and isinstance(parsed.output_parsed, Verse)
    json_mode = client.responses.create(model="tiny", input="JSON please", text={"format": {"type": "json_object"}},
                                        temperature=0, max_output_tokens=60)
    if json_mode.status == "completed":
        assert isinstance(json.loads(json_mode.output_text), dict)


def test_store_false_keeps_nothing(server, client):
    made = client.responses.create(model="tiny", input="Hi", store=False, **GREEDY)
    assert made.store is False
    with pytest.raises(openai.NotFoundError):
        client.responses.retrieve(made.id)


def test_a_stream_left_halfway_stores_nothing(server, client):
    """The client goes away after the first delta: the response was never completed, so
    nothing of it is stored, and the server goes on serving."""
    with client.responses.create(model="tiny", input="Tell me a long story", stream=True, max_output_tokens=200,
                                 temperature=0) as stream:
        for event in stream:
            if event.type == "response.created":
                ident = event.response.id
            if event.type == "response.output_text.delta":
                break
    for _ in range(50):  # the server notices the closed socket at its next write
        with pytest.raises(openai.NotFoundError):
            client.responses.retrieve(ident)
    assert client.responses.create(model="tiny", input="Hi", **GREEDY).status in ("completed", "incomplete")


@pytest.mark.parametrize("body, param", [
    ({"input": [{"role": "user", "content": [{"type": "input_image", "image_url": "http://x/y.png"}]}]},
     "input[0].content[0]"),
    ({"input": [{"type": "web_search_call", "id": "ws_1"}]}, "input[0].type"),
    ({"input": "Hi", "tools": [{"type": "web_search"}]}, "tools[0].type"),
    ({"input": "Hi", "previous_response_id": "resp_0123456789abcdef"}, "previous_response_id"),
    ({"input": []}, "input"),
])
def test_bad_requests_name_the_field(server, body, param):
    r = server.post("/v1/responses", {"model": "tiny", **body})
    assert r.status in (400, 404), r
    error = r.json()["error"]
    SCHEMAS.check("ErrorResponse", r.json())
    assert error["param"] == param, error


def test_unknown_ids_are_404(server):
    for method, path in [("GET", "/v1/responses/resp_nope"), ("DELETE", "/v1/responses/resp_nope"),
                         ("GET", "/v1/responses/resp_nope/input_items")]:
        r = server.request(method, path)
        assert r.status == 404 and r.json()["error"]["code"] == "not_found", (path, r)


def test_a_response_of_another_model_is_refused(server, client):
    made = client.responses.create(model="tiny", input="Hi", **GREEDY)
    record = server.serving.responses.get(made.id, Caller())
    server.serving.responses.put(type(record)(**{**{f: getattr(record, f) for f in record.__struct_fields__},
                                                "id": "resp_othermodel", "model": "other"}), None)
    r = server.post("/v1/responses", {"model": "tiny", "input": "Hi", "previous_response_id": "resp_othermodel"})
    assert r.status == 400 and r.json()["error"]["param"] == "previous_response_id"


def test_the_store_survives_a_restart_and_keeps_its_cap(tmp_path):
    with make_server(tmp_path, responses="[responses]\nmax_state_bytes = 100000000") as s:
        c = openai.OpenAI(base_url=s.base_url, api_key="unused", max_retries=0)
        first = c.responses.create(model="tiny", input="Who built the ark?", **GREEDY)
        second = c.responses.create(model="tiny", input="And then?", previous_response_id=first.id, **GREEDY)
    with make_server(tmp_path, responses="[responses]\nmax_state_bytes = 100000000") as s:
        c = openai.OpenAI(base_url=s.base_url, api_key="unused", max_retries=0)
        assert c.responses.retrieve(first.id).output_text == first.output_text
        again = c.responses.create(model="tiny", input="And then?", previous_response_id=first.id, **GREEDY)
        assert again.output_text == second.output_text
    # A cap that holds one state: the older ones are dropped, their records kept.
    state_size = (tmp_path / "responses" / "states" / f"{again.id}.npz").stat().st_size
    with make_server(tmp_path, responses=f"[responses]\nmax_state_bytes = {state_size + 10}") as s:
        c = openai.OpenAI(base_url=s.base_url, api_key="unused", max_retries=0)
        third = c.responses.create(model="tiny", input="More", previous_response_id=second.id, **GREEDY)
        states = sorted(p.stem for p in (tmp_path / "responses" / "states").iterdir())
        assert states == [third.id]
        assert c.responses.retrieve(first.id).id == first.id  # the record outlives its state
        with InterceptedGenerates(s.serving) as spy:
            c.responses.create(model="tiny", input="More", previous_response_id=second.id, **GREEDY)
        assert spy.sent[0].state is None  # rebuilt from the stored tokens
    assert np.isfinite(state_size)


def test_a_server_without_a_store(tmp_path):
    with make_server(tmp_path, responses="[responses]\nstore = false") as s:
        c = openai.OpenAI(base_url=s.base_url, api_key="unused", max_retries=0)
        made = c.responses.create(model="tiny", input="Hi", **GREEDY)
        checked(made)
        assert made.store is False
        with pytest.raises(openai.NotFoundError) as e:
            c.responses.retrieve(made.id)
        assert "store = false" in e.value.body["message"]
        r = s.post("/v1/responses", {"model": "tiny", "input": "Hi", "previous_response_id": made.id})
        assert r.status == 404 and r.json()["error"]["code"] == "not_found"
    assert not (tmp_path / "responses").exists()
