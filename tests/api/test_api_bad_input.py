"""Bad requests get the right 4xx in OpenAI's error envelope, naming the field, and the
server keeps serving afterwards."""

from __future__ import annotations

import json

import openai
import pytest

from api_helpers import SCHEMAS, ServerThread, config_for

HI = [{"role": "user", "content": "Hi"}]


@pytest.fixture(scope="module")
def server(model_dir):
    with ServerThread(config_for(model_dir, max_body_bytes=1 << 20)) as s:
        yield s


def check_error(response, status: int, param: str | None = None, code: str | None = None):
    assert response.status == status, response
    body = response.json()
    SCHEMAS.check("ErrorResponse", body)
    if param is not None:
        assert body["error"]["param"] == param, body
    if code is not None:
        assert body["error"]["code"] == code, body
    return body["error"]


def still_serving(server):
    r = server.post("/v1/chat/completions", {"messages": HI, "max_tokens": 2})
    assert r.status == 200, r


CHAT_CASES = [
    # (name, raw body, status, param)
    ("malformed json", b'{"messages": [', 400, None),
    ("empty body", b"", 400, None),
    ("not an object", b"[1, 2]", 400, None),
    ("invalid utf-8", b'{"messages": [{"role": "user", "content": "\xff\xfe"}]}', 400, None),
    ("messages missing", {"max_tokens": 3}, 400, "messages"),
    ("messages empty", {"messages": []}, 400, "messages"),
    ("messages a string", {"messages": "hi"}, 400, "messages"),
    ("role missing", {"messages": [{"content": "hi"}]}, 400, "messages[0].role"),
    ("unknown role", {"messages": [{"role": "wizard", "content": "hi"}]}, 400, "messages[0].role"),
    ("null user content", {"messages": [{"role": "user", "content": None}]}, 400, "messages[0].content"),
    ("image part", {"messages": [{"role": "user", "content": [{"type": "image_url", "image_url": {"url": "x"}}]}]},
     400, "messages[0].content[0]"),
    ("max_tokens a string", {"messages": HI, "max_tokens": "10"}, 400, "max_tokens"),
    ("max_tokens negative", {"messages": HI, "max_tokens": -5}, 400, "max_tokens"),
    ("max_tokens zero", {"messages": HI, "max_tokens": 0}, 400, "max_tokens"),
    ("max_tokens huge", {"messages": HI, "max_tokens": 10**9}, 400, "max_tokens"),
    ("max_tokens beyond int64", {"messages": HI, "max_tokens": 10**30}, 400, "max_tokens"),
    ("max_completion_tokens huge", {"messages": HI, "max_completion_tokens": 10**7}, 400, "max_completion_tokens"),
    ("temperature a word", {"messages": HI, "temperature": "hot"}, 400, "temperature"),
    ("temperature negative", {"messages": HI, "temperature": -1}, 400, "temperature"),
    ("top_p above 1", {"messages": HI, "top_p": 1.5}, 400, "top_p"),
    ("stream a string", {"messages": HI, "stream": "yes"}, 400, "stream"),
    ("n zero", {"messages": HI, "n": 0}, 400, "n"),
    ("n too many", {"messages": HI, "n": 1000}, 400, "n"),
    ("top_logprobs too many", {"messages": HI, "logprobs": True, "top_logprobs": 50}, 400, "top_logprobs"),
    ("logit_bias key", {"messages": HI, "logit_bias": {"hello": 1}}, 400, "logit_bias"),
    ("logit_bias value", {"messages": HI, "logit_bias": {"5": 500}}, 400, "logit_bias"),
    ("logit_bias id beyond the vocabulary", {"messages": HI, "logit_bias": {"70000": 5}}, 400, "logit_bias"),
    ("logit_bias id beyond int64", {"messages": HI, "logit_bias": {"99999999999999999999": 5}}, 400, "logit_bias"),
    ("nested too deeply", b'{"messages": [{"role": "user", "content": "hi"}], "tools": ' + b"[" * 50000
     + b"]" * 50000 + b"}", 400, None),
    ("stop a number", {"messages": HI, "stop": 5}, 400, "stop"),
    ("unknown sampler", {"messages": HI, "sampler": {"type": "Bogus"}}, 400, "sampler.type"),
    ("sampler out of range", {"messages": HI, "sampler": {"type": "Nucleus", "top_p": 7}}, 400, "sampler"),
    ("template incomplete", {"messages": HI, "template": {"record": "{role}: {content}"}}, 400, "template.prefix"),
    ("json_schema without a schema", {"messages": HI, "response_format": {"type": "json_schema", "json_schema": {}}},
     400, "response_format.json_schema.schema"),
    ("forced call of a tool not offered", {"messages": HI, "tools": [{"type": "function", "function": {"name": "f"}}],
                                           "tool_choice": {"type": "function", "function": {"name": "g"}}}, 400,
     "tool_choice.function.name"),
    ("inline state of the wrong size", {"messages": HI, "state": {"data": [0.0], "id": "x"}}, 400, "state.data"),
    ("inline state of the wrong shape", {"messages": HI, "state": {"data": [0.0], "shape": [1, 2, 3, 1]}}, 400,
     "state.shape"),
    ("state file outside the models folder", {"messages": HI, "state": "../../x.state"}, 400, "state"),
    ("unknown state", {"messages": HI, "state": "nope"}, 400, "state"),
]


@pytest.mark.parametrize("name,body,status,param", CHAT_CASES, ids=[c[0] for c in CHAT_CASES])
def test_bad_chat_requests(server, name, body, status, param):
    error = check_error(server.post("/v1/chat/completions", body), status, param)
    assert error["type"] == "invalid_request_error" and error["message"]
    if param:
        assert param.split("[")[0].split(".")[0] in error["message"], error  # the message names the field too


COMPLETION_CASES = [
    ("token prompt", {"prompt": [1, 2, 3]}, 400, "prompt[0]"),
    ("nested prompt", b'{"prompt": ' + b"[" * 50000 + b"]" * 50000 + b"}", 400, None),
    ("logit_bias id beyond the vocabulary", {"prompt": "a", "logit_bias": {"65536": 1}}, 400, "logit_bias"),
    ("empty prompt list", {"prompt": []}, 400, "prompt"),
    ("suffix", {"prompt": "a", "suffix": "b"}, 400, "suffix"),
    ("legacy logprobs too many", {"prompt": "a", "logprobs": 50}, 400, "logprobs"),
    ("echo with logprobs, streamed", {"prompt": "a", "echo": True, "logprobs": 1, "stream": True}, 400, "stream"),
    ("negative max_tokens", {"prompt": "a", "max_tokens": -1}, 400, "max_tokens"),
    ("best_of", {"prompt": "a", "best_of": 3}, 400, "best_of"),
]


@pytest.mark.parametrize("name,body,status,param", COMPLETION_CASES, ids=[c[0] for c in COMPLETION_CASES])
def test_bad_completion_requests(server, name, body, status, param):
    check_error(server.post("/v1/completions", body), status, param)


EMBEDDING_CASES = [
    ("input missing", {"model": "tiny"}, 400, "input"),
    ("empty list", {"input": []}, 400, "input"),
    ("token arrays", {"input": [[1, 2, 3]]}, 400, "input[0]"),
    ("unknown encoding", {"input": "a", "encoding_format": "hex"}, 400, "encoding_format"),
    ("other dimensions", {"input": "a", "dimensions": 3}, 400, "dimensions"),
]


@pytest.mark.parametrize("name,body,status,param", EMBEDDING_CASES, ids=[c[0] for c in EMBEDDING_CASES])
def test_bad_embedding_requests(server, name, body, status, param):
    check_error(server.post("/v1/embeddings", body), status, param)


def test_a_10_mb_body_is_413_and_the_server_keeps_serving(server):
    huge = json.dumps({"messages": [{"role": "user", "content": "x" * (10 << 20)}]}).encode()
    check_error(server.post("/v1/chat/completions", huge), 413, code="request_too_large")
    check_error(server.request("POST", "/v1/chat/completions", huge, chunked=True), 413, code="request_too_large")
    still_serving(server)


def test_unknown_route_and_method_use_the_envelope(server):
    check_error(server.post("/v1/nothing", {}), 404, code="unknown_url")
    error = check_error(server.get("/v1/chat/completions"), 405, code="method_not_allowed")
    assert error["type"] == "invalid_request_error"


def test_sdk_raises_bad_request_error(server):
    client = openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0)
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(model="tiny", messages=HI, max_tokens=-1)
    assert e.value.param == "max_tokens"
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="tiny", messages=[])


def test_server_keeps_serving_after_all_of_it(server):
    for _ in range(2):
        for _, body, _, _ in CHAT_CASES:
            server.post("/v1/chat/completions", body)
        still_serving(server)
