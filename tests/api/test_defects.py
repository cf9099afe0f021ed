"""Defects found by probing, each through the real server: saving the model where it cannot
be written, input items with ids that are not strings, clients that leave mid-stream,
and the automatic limit on a prompt's length."""

from __future__ import annotations

import errno
import json
import logging
import socket
import struct
import threading
import time

import msgspec
import openai
import pytest
from api_helpers import SCHEMAS, TIMEOUT, ServerThread, config_for

from ai00_like import middleware
from ai00_like.api import channel
from ai00_like.loaded import AUTO_PROMPT_CEILING, AUTO_PROMPT_FLOOR, auto_prompt_limit


@pytest.fixture(scope="module")
def server(model_dir):
    with ServerThread(config_for(model_dir, max_batch=2)) as s:
        yield s


def error_of(response, status: int, param: str | None) -> dict:
    assert response.status == status, response
    SCHEMAS.check("ErrorResponse", response.json())
    error = response.json()["error"]
    assert error["param"] == param, error
    return error


# ------------------------------------------------------------------ 1. saving where it cannot be written


@pytest.mark.parametrize("path, why", [
    ("missing/copy.st", "there is no folder 'missing'"),
    ("a/b/copy.st", "there is no folder 'a/b'"),
    ("tiny.st/copy.st", "'tiny.st' is a file, not a folder"),
])
def test_save_into_no_folder_is_400_naming_the_clients_path(server, model_dir, path, why):
    error = error_of(server.post("/admin/models/save", {"path": path}), 400, "path")
    assert path in error["message"] and why in error["message"], error
    assert str(model_dir) not in error["message"], error


def test_save_of_a_folder_or_a_file_that_exists_names_no_server_path(server, model_dir):
    for path, status in (("tiny.st", 409), (".", 400), (str(model_dir / "tiny.st"), 409)):
        error = error_of(server.post("/admin/models/save", {"path": path}), status, "path")
        assert str(model_dir) not in error["message"], error
    error = error_of(server.post("/admin/models/save", {"path": "/elsewhere/copy.st"}), 403, "path")
    assert str(model_dir) not in error["message"], error


@pytest.mark.parametrize("code, reason", [(errno.EACCES, "Permission denied"), (errno.EROFS, "Read-only file system")])
def test_save_the_file_system_refuses_is_400_without_a_traceback(server, model_dir, monkeypatch, caplog, code, reason):
    # A read-only folder, as the file system answers it (the tests may run as root, whom
    # chmod does not stop): the error names the client's path, the log has no traceback.
    def refuse(tensors, path, dtype):
        raise OSError(code, reason, str(path))

    monkeypatch.setattr(middleware, "write_safetensors", refuse)
    with caplog.at_level(logging.INFO):
        error = error_of(server.post("/admin/models/save", {"path": "copy.st"}), 400, "path")
    assert error["message"] == f"'path': cannot write copy.st: {reason}", error
    assert not any(r.exc_info for r in caplog.records), [r.getMessage() for r in caplog.records]
    assert not (model_dir / "copy.st").exists() and not list(model_dir.glob("*.part"))


# ------------------------------------------------------------------ 2. input items' ids


@pytest.mark.parametrize("item", [
    {"type": "message", "role": "user", "content": "hi", "id": 5},
    {"type": "message", "role": "user", "content": "hi", "id": ""},
    {"type": "message", "role": "user", "content": "hi", "id": {"nested": "object"}},
    {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}", "id": ["fc_1"]},
    {"type": "function_call_output", "call_id": "c1", "output": "42", "id": True},
])
def test_input_item_ids_must_be_non_empty_strings(server, item):
    items = [item] if item["type"] == "message" else [
        {"type": "function_call", "call_id": "c1", "name": "f", "arguments": "{}"}, item]
    r = server.post("/v1/responses", {"model": "tiny", "input": items, "max_output_tokens": 2})
    index = len(items) - 1
    error = error_of(r, 400, f"input[{index}].id")
    assert f"input[{index}].id" in error["message"], error


def test_input_item_ids_that_are_strings_are_kept(server):
    client = openai.OpenAI(base_url=server.base_url, api_key="unused", max_retries=0)
    made = client.responses.create(model="tiny", max_output_tokens=2, temperature=0, input=[
        {"type": "message", "role": "user", "content": "hi", "id": "msg_mine"}, {"role": "user", "content": "and"}])
    ids = [item.id for item in client.responses.input_items.list(made.id, order="asc").data]
    assert ids[0] == "msg_mine" and ids[1].startswith("msg_") and ids[1] != "msg_mine", ids


# ------------------------------------------------------------------ 3. clients that leave mid-stream

LEAVERS = 20


def hold_loop(server) -> threading.Event:
    """Keep the server's event loop busy (as a loaded server's is) until the event is set."""
    held, release = threading.Event(), threading.Event()

    def hold():
        held.set()
        release.wait(TIMEOUT)

    server.loop.call_soon_threadsafe(hold)
    assert held.wait(TIMEOUT)
    return release


def leave_mid_stream(server, request_id: str, events: int) -> None:
    """A streamed chat completion read for `events` data events, then the socket reset (RST),
    as a browser's Stop button or a killed client leaves it.

    The reset lands while the loop is busy and a token is waiting for the stream: the loop
    then hands the stream its token before it notices the reset, and the stream writes to a
    closing transport, which happened now and then when the reset came mid-token."""
    body = json.dumps({"model": "tiny", "messages": [{"role": "user", "content": request_id}], "stream": True,
                       "max_tokens": 4000, "temperature": 1.0, "logit_bias": {"0": -100},
                       "stop": None}).encode()  # no end-of-text, no chat stop string: it runs until it is left
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=TIMEOUT)
    try:
        sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                     b"X-Request-Id: %s\r\nContent-Length: %d\r\n\r\n%s" % (request_id.encode(), len(body), body))
        seen = b""
        while seen.count(b"data: ") < events:
            chunk = sock.recv(65536)
            assert chunk, seen[-300:]
            seen += chunk
        release = hold_loop(server)
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))  # close() sends RST
    finally:
        sock.close()
    inbox = channel._inboxes[server.loop]
    for _ in range(int(TIMEOUT / 0.01)):  # the backend goes on generating: a token comes soon
        if inbox.items:
            break
        time.sleep(0.01)
    release.set()


def test_clients_that_leave_mid_stream_log_499_and_no_traceback(model_dir, caplog):
    caplog.set_level(logging.DEBUG, logger="aiohttp")
    caplog.set_level(logging.INFO)
    ids = [f"leaver-{k}" for k in range(LEAVERS)]
    with ServerThread(config_for(model_dir, max_batch=2)) as server:
        for k, request_id in enumerate(ids):
            leave_mid_stream(server, request_id, events=2 + k % 5)

        def logged() -> dict[str, int]:
            found = {}
            for r in list(caplog.records):
                if r.name == "ai00_like.access" and r.getMessage().startswith("{"):
                    line = json.loads(r.getMessage())
                    found[line["id"]] = line["status"]
            return found

        for _ in range(int(TIMEOUT / 0.05)):  # every request's line comes once its handler ended
            if set(ids) <= logged().keys():
                break
            time.sleep(0.05)
        statuses = logged()
        assert server.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}],
                                                    "max_tokens": 2}).status == 200
    assert {i: statuses.get(i) for i in ids} == {i: 499 for i in ids}
    tracebacks = [r.getMessage() for r in caplog.records
                  if r.exc_info or "Traceback" in r.getMessage() or r.levelno >= logging.ERROR]
    assert not tracebacks, tracebacks


# ------------------------------------------------------------------ 4. the automatic prompt limit


def test_auto_prompt_limit_follows_the_cache_and_stays_in_bounds():
    state = 34 << 20  # a 7B RWKV-7's state, about
    assert auto_prompt_limit(state, 1 << 30, 256) == AUTO_PROMPT_FLOOR  # 30 checkpoints: too few to go by
    assert auto_prompt_limit(1 << 20, 300 << 20, 256) == 300 * 256  # between the bounds: what the cache keeps
    assert auto_prompt_limit(1 << 16, 1 << 30, 256) == AUTO_PROMPT_CEILING
    assert auto_prompt_limit(state, 0, 256) == AUTO_PROMPT_FLOOR


def prompt_of(tokens: int) -> str:
    return " a" * tokens  # one token each in the World vocabulary


def without_cache(config):
    """No prefix cache (cache_bytes = 0): no checkpoint is kept, so the automatic limit is the floor."""
    return msgspec.structs.replace(config, model=msgspec.structs.replace(config.model, cache_bytes=0))


def test_a_prompt_over_the_automatic_limit_is_400_saying_how_to_raise_it(model_dir):
    with ServerThread(without_cache(config_for(model_dir, max_body_bytes=4 << 20))) as server:
        r = server.post("/v1/completions", {"model": "tiny", "prompt": prompt_of(AUTO_PROMPT_FLOOR + 1),
                                            "max_tokens": 1})
        error = error_of(r, 400, None)
        assert error["code"] == "context_length_exceeded", error
        assert f"at most {AUTO_PROMPT_FLOOR}" in error["message"], error
        assert "[listen] max_prompt_tokens" in error["message"] and "-1" in error["message"], error
        assert server.get("/api/models/info").json()  # still serving
        r = server.post("/v1/completions", {"model": "tiny", "prompt": prompt_of(AUTO_PROMPT_FLOOR), "max_tokens": 1})
        assert r.status == 200, r  # the limit itself is allowed
        assert r.json()["usage"]["prompt_tokens"] == AUTO_PROMPT_FLOOR


def test_max_prompt_tokens_minus_one_means_no_limit_and_a_number_is_used_as_given(model_dir):
    long = prompt_of(AUTO_PROMPT_FLOOR + 1)
    with ServerThread(config_for(model_dir, listen_extra="max_prompt_tokens = 50")) as server:
        error = error_of(server.post("/v1/completions", {"model": "tiny", "prompt": prompt_of(60)}), 400, None)
        assert "at most 50 ([listen] max_prompt_tokens" in error["message"], error
    with ServerThread(without_cache(config_for(model_dir, max_body_bytes=4 << 20,
                                               listen_extra="max_prompt_tokens = -1"))) as server:
        # No limit: the prompt reaches the model (an embedding reads it once, without sampling).
        r = server.post("/v1/embeddings", {"model": "tiny", "input": long})
        assert r.status == 200, r
