"""What the three APIs share: keys as each API's clients send them, errors in the envelope of
the API a request came through (even the key and site checks' refusals, before any
handler), the admin rule for Ollama's routes that change the models folder, and the second
listener on Ollama's port ([ollama] listen).

Each API's own routes are tested with its own client in test_openai*/test_ollama/test_anthropic."""

from __future__ import annotations

import asyncio
import http.client
import socket

import pytest
from api_helpers import ServerThread, config_for
from process_helpers import free_port

from ai00_like.api.app import ApiStartError, start_server
from ai00_like.config import ConfigError, parse_config
from ai00_like.middleware import Middleware

KEYS = 'api_keys = ["sk-user"]\nadmin_key = "sk-admin"'


@pytest.fixture(scope="module")
def ollama_port() -> int:
    return free_port()


@pytest.fixture(scope="module")
def server(model_dir, ollama_port):
    config = config_for(model_dir, f'[ollama]\nlisten = "127.0.0.1:{ollama_port}"\n', listen_extra=KEYS)
    with ServerThread(config) as s:
        yield s


def get(port: int, path: str, headers: dict | None = None, method: str = "GET") -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=30)
    try:
        conn.request(method, path, headers=headers or {})
        response = conn.getresponse()
        return response.status, response.read()
    finally:
        conn.close()


def test_anthropic_clients_send_their_key_as_x_api_key(server):
    assert server.get("/v1/models", headers={"x-api-key": "sk-user"}).status == 200
    assert server.get("/v1/models", headers={"x-api-key": "sk-wrong"}).status == 401
    missing = server.get("/v1/models")
    assert missing.status == 401 and "x-api-key" in missing.json()["error"]["message"]
    # An empty bearer token is no key; the x-api-key beside it still counts.
    assert server.get("/v1/models", headers={"Authorization": "Bearer ", "x-api-key": "sk-user"}).status == 200


def test_a_refusal_comes_in_the_envelope_of_the_api_asked(server):
    openai_style = server.get("/v1/models").json()
    assert openai_style["error"]["code"] == "invalid_api_key"
    ollama_style = server.get("/api/tags")
    assert ollama_style.status == 401 and set(ollama_style.json()) == {"error"}
    assert isinstance(ollama_style.json()["error"], str) and "key" in ollama_style.json()["error"]
    anthropic_style = server.post("/v1/messages", {"model": "tiny", "max_tokens": 1, "messages": []})
    assert anthropic_style.status == 401
    assert anthropic_style.json()["type"] == "error"
    assert anthropic_style.json()["error"]["type"] == "authentication_error"
    # A body too large for any route: the same rule, before the handler reads it.
    huge = server.post("/api/chat", b"x" * (2 << 20), headers={"Authorization": "Bearer sk-user"})
    assert huge.status == 413 and isinstance(huge.json()["error"], str)


def test_ollamas_pull_and_delete_are_admin_routes(server):
    for method, path in [("POST", "/api/pull"), ("DELETE", "/api/delete")]:
        as_user = server.request(method, path, {"model": "x"}, headers={"Authorization": "Bearer sk-user"})
        assert as_user.status == 401 and "admin" in as_user.json()["error"].lower()
    # Admin bodies are JSON only: a page may send text/plain without asking first.
    as_text = server.request("POST", "/api/pull", "{}", headers={"Authorization": "Bearer sk-admin",
                                                                  "Content-Type": "text/plain"})
    assert as_text.status == 415 and isinstance(as_text.json()["error"], str)


def test_ollamas_port_answers_as_ollama_does(server, ollama_port):
    status, body = get(ollama_port, "/")
    assert (status, body) == (200, b"Ollama is running")
    assert get(ollama_port, "/", method="HEAD")[0] == 200
    # The same application: its routes and its keys.
    assert get(ollama_port, "/api/version", {"Authorization": "Bearer sk-user"})[0] == 200
    assert get(ollama_port, "/v1/models", {"Authorization": "Bearer sk-user"})[0] == 200
    assert get(ollama_port, "/api/version")[0] == 401
    # The main port's "/" is not Ollama's.
    assert get(server.port, "/")[1] != b"Ollama is running"


def test_the_openapi_document_gives_each_api_its_error_envelope(server):
    document = server.get("/api-docs/openapi.json", headers={"Authorization": "Bearer sk-user"}).json()
    ref = document["paths"]["/api/tags"]["get"]["responses"]["4XX"]["content"]["application/json"]["schema"]["$ref"]
    assert ref.endswith("/OllamaError")
    ref = document["paths"]["/v1/messages"]["post"]["responses"]["4XX"]["content"]["application/json"]["schema"]
    assert ref["$ref"].endswith("/AnthropicError")


def test_a_taken_or_malformed_ollama_port_stops_the_start_in_one_line(model_dir):
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        config = config_for(model_dir, f'[ollama]\nlisten = "127.0.0.1:{port}"\n')
        middleware = Middleware()
        try:
            with pytest.raises(ApiStartError, match=rf"ollama.listen: cannot listen on 127.0.0.1:{port}"):
                asyncio.run(start_server(config, middleware))
        finally:
            middleware.close()
    for bad in ["11434", "localhost:", "127.0.0.1:99999"]:
        with pytest.raises(ConfigError, match="ollama.listen: must be 'host:port'"):
            parse_config(f'[ollama]\nlisten = "{bad}"\n', source="c.toml", base_dir=model_dir)
