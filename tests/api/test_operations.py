"""Operations: /health, /metrics, API and admin keys on every route, CORS, the prompt
length limit, TLS and the request log — through real HTTP."""

from __future__ import annotations

import json
import logging
import re
import ssl
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import httpx
import openai
import pytest
from api_helpers import SCHEMAS, TIMEOUT, ServerThread, config_for, write_model
from process_helpers import ServerProcess, parse_metrics, process_config

from ai00_like.api.app import all_routes
from ai00_like.api.auth import OLLAMA_ADMIN_PATHS
from ai00_like.api.openapi import OPENAPI_PATH
from ai00_like.cli import main
from ai00_like.loaded import build

CHAT = {"model": "tiny", "messages": [{"role": "user", "content": "Hello there"}], "max_tokens": 6,
        "temperature": 0}


def metrics(server, headers=None) -> dict[str, float]:
    r = server.get("/metrics", headers=headers)
    assert r.status == 200, r
    assert r.headers["content-type"].startswith("text/plain")
    return parse_metrics(r.body.decode())


# ------------------------------------------------------------------------------ health and metrics


def test_health_is_503_without_a_model_and_200_with_one(model_dir):
    with ServerThread(config_for(model_dir, model="absent.st")) as server:
        r = server.get("/health")
        assert r.status == 503 and r.json()["status"] == "no_model"
        assert server.post("/admin/models/load", {"model_path": "tiny.st"}).status == 200
        r = server.get("/health")
        assert r.status == 200 and r.json() == {"status": "ok", "model": "tiny"}
        server.get("/admin/models/unload")
        assert server.get("/health").status == 503


def test_health_is_503_loading_while_the_model_loads_and_200_once_it_is_ready(model_dir):
    started, release = threading.Event(), threading.Event()

    def held_build(spec, *progress):  # the middleware's builder, held back until the test says
        started.set()
        assert release.wait(TIMEOUT), "the test never released the load"
        return build(spec, *progress)

    with ServerThread(config_for(model_dir), builder=held_build, wait_for_load=False) as server:
        try:
            assert started.wait(TIMEOUT)  # the startup load is under way
            r = server.get("/health")
            assert r.status == 503 and r.json() == {"status": "loading"}, r
            assert r.headers["retry-after"]
            # A request meanwhile waits for that same load and is answered once it is ready.
            with ThreadPoolExecutor(1) as pool:
                waiting = pool.submit(server.post, "/v1/chat/completions", CHAT)
                time.sleep(0.5)
                assert not waiting.done()
                release.set()
                assert waiting.result(TIMEOUT).status == 200
        finally:
            release.set()
        server.call(server.serving.wait_idle())
        r = server.get("/health")
        assert r.status == 200 and r.json() == {"status": "ok", "model": "tiny"}, r
        # Replacing the model: the old one serves meanwhile, so the probe stays 200.
        started.clear()
        release.clear()
        with ThreadPoolExecutor(1) as pool:
            reload = pool.submit(server.post, "/admin/models/load", {"model_path": "tiny.st"})
            try:
                assert started.wait(TIMEOUT)
                r = server.get("/health")
                assert r.status == 200 and r.json() == {"status": "ok", "model": "tiny"}, r
            finally:
                release.set()
            assert reload.result(TIMEOUT).status == 200


def test_metrics_count_what_the_replies_report(model_dir):
    with ServerThread(config_for(model_dir, listen_extra='replica = "east-1"')) as server:
        client = openai.OpenAI(base_url=server.base_url, api_key="x", max_retries=0)
        before = metrics(server)
        assert before["rwkv:model_loaded"] == 1 and before["rwkv:batch_size_max"] == 4
        first = client.chat.completions.create(**CHAT)
        second = client.chat.completions.create(**CHAT)  # same prompt: a prefix-cache hit
        after = metrics(server)
        usages = [first.usage, second.usage]
        assert after["rwkv:generation_tokens_total"] == sum(u.completion_tokens for u in usages)
        assert after["rwkv:prompt_tokens_total"] == sum(u.prompt_tokens for u in usages)
        cached = second.usage.prompt_tokens_details.cached_tokens
        assert cached > 0 and after["rwkv:state_cache_hit_tokens_total"] == cached
        assert after["rwkv:prompt_tokens_computed_total"] == sum(u.prompt_tokens for u in usages) - cached
        assert after["rwkv:state_cache_hits_total"] >= 1 and after["rwkv:state_cache_queries_total"] >= 2
        assert after["rwkv:state_cache_entries"] >= 1 and after["rwkv:state_cache_bytes"] > 0
        label = '{finished_reason="length",model_name="tiny",replica="east-1"}'
        assert after[f"rwkv:request_success_total{label}"] == 2
        for hist in ("time_to_first_token_seconds", "e2e_request_latency_seconds", "request_queue_time_seconds",
                     "request_prompt_tokens", "request_generation_tokens", "request_time_per_output_token_seconds"):
            assert after[f"rwkv:{hist}_count"] == 2, hist
        assert after["rwkv:request_generation_tokens_sum"] == 12
        # One gap per token after the first of each reply.
        assert after["rwkv:inter_token_latency_seconds_count"] == 2 * (6 - 1)
        assert after["rwkv:num_requests_running"] == 0 and after["rwkv:num_requests_waiting"] == 0
        assert after["rwkv:iterations_total"] > 0 and after["rwkv:batch_size_mean"] >= 1
        # Every series names the replica, the backend's gauges and counters as the histograms.
        assert after['rwkv:model_loaded{model_name="tiny",replica="east-1"}'] == 1
        assert after['rwkv:time_to_first_token_seconds_count{model_name="tiny",replica="east-1"}'] == 2


def test_metric_counters_survive_a_reload(model_dir):
    with ServerThread(config_for(model_dir)) as server:
        client = openai.OpenAI(base_url=server.base_url, api_key="x", max_retries=0)
        one = client.chat.completions.create(**CHAT).usage.completion_tokens
        assert metrics(server)["rwkv:generation_tokens_total"] == one
        assert server.post("/admin/models/load", {"model_path": "tiny.st"}).status == 200
        two = client.chat.completions.create(**CHAT).usage.completion_tokens
        assert metrics(server)["rwkv:generation_tokens_total"] == one + two  # never goes down


# ------------------------------------------------------------------------------ keys


def _concrete(path: str) -> str:
    return re.sub(r"\{[^}]+\}", "tiny", path)


def _every_protected_route():
    routes = [(r.method, _concrete(p), r.surface) for p, r in all_routes() if p != "/health"]
    return routes + [("GET", OPENAPI_PATH, "openai")]


def _is_admin(path: str) -> bool:
    return path.startswith("/admin/") or path in OLLAMA_ADMIN_PATHS


def _check_refusal(surface: str, body: dict) -> None:
    """A 401 in the envelope of the route's API."""
    if surface == "ollama":
        assert set(body) == {"error"} and "key" in body["error"], body
    elif surface == "anthropic":
        assert body["type"] == "error" and body["error"]["type"] == "authentication_error", body
    else:
        SCHEMAS.check("ErrorResponse", body)
        assert body["error"]["code"] == "invalid_api_key"


def test_with_keys_set_nothing_but_health_and_the_page_answers_without_one(model_dir, tmp_path):
    www = tmp_path / "www"
    www.mkdir()
    (www / "index.html").write_text("<h1>page</h1>")
    extra = f'[web]\npath = "{www}"\n'
    config = config_for(model_dir, extra, listen_extra='api_keys = ["sk-user"]\nadmin_key = "sk-admin"')
    with ServerThread(config) as server:
        assert server.get("/health").status == 200
        page = server.get("/")
        assert page.status == 200 and b"page" in page.body
        routes = _every_protected_route()
        assert len(routes) > 30
        for method, path, surface in routes:
            for headers in ({}, {"Authorization": "Bearer sk-wrong"}, {"Authorization": "Basic sk-user"},
                            {"X-Api-Key": "sk-wrong"},
                            {"Authorization": "Bearer sk-user"} if _is_admin(path) else {"X-Api-Key": ""}):
                r = server.request(method, path, {} if method == "POST" else None, headers=headers)
                assert r.status == 401, (method, path, headers, r)
                if method != "HEAD":
                    _check_refusal(surface, r.json())
            key = "sk-admin" if _is_admin(path) else "sk-user"
            if path.endswith("/unload") or path.startswith("/api/models/state") or path == "/api/delete":
                continue  # unloading or deleting would change what follows; the status stream never ends
            r = server.request(method, path, {} if method == "POST" else None,
                               headers={"Authorization": f"Bearer {key}"})
            assert r.status != 401, (method, path, r)
            if not _is_admin(path):  # Anthropic's clients send the key as x-api-key
                r = server.request(method, path, {} if method == "POST" else None, headers={"X-Api-Key": key})
                assert r.status != 401, (method, path, r)
        # The admin key also passes the inference routes.
        assert server.get("/v1/models", headers={"Authorization": "Bearer sk-admin"}).status == 200
        assert server.get("/admin/models/unload?admin_token=sk-admin").status == 200


def test_without_an_admin_key_the_api_keys_guard_admin_routes(model_dir):
    with ServerThread(config_for(model_dir, listen_extra='api_keys = ["sk-user"]')) as server:
        assert server.post("/admin/files/dir", {"path": "."}).status == 401
        r = server.post("/admin/files/dir", {"path": "."}, headers={"Authorization": "Bearer sk-user"})
        assert r.status != 401, r


def test_the_openai_client_sees_an_authentication_error(model_dir):
    with ServerThread(config_for(model_dir, listen_extra='api_keys = ["sk-user"]')) as server:
        with pytest.raises(openai.AuthenticationError):
            openai.OpenAI(base_url=server.base_url, api_key="sk-nope", max_retries=0).chat.completions.create(**CHAT)
        reply = openai.OpenAI(base_url=server.base_url, api_key="sk-user").chat.completions.create(**CHAT)
        assert reply.choices[0].message.content is not None


# ------------------------------------------------------------------------------ CORS


SDK_HEADERS = "authorization, content-type, x-stainless-os, x-stainless-lang, x-stainless-retry-count, x-evil"


def test_cors_answers_preflights_from_the_configured_origins(model_dir):
    config = config_for(model_dir, listen_extra='api_keys = ["sk-user"]\ncors_origins = ["http://app.example"]')
    with ServerThread(config) as server:
        pre = server.request("OPTIONS", "/v1/chat/completions", headers={
            "Origin": "http://app.example", "Access-Control-Request-Method": "POST",
            "Access-Control-Request-Headers": SDK_HEADERS})
        assert pre.status == 204, pre
        assert pre.headers["access-control-allow-origin"] == "http://app.example"
        allowed = {h.strip().lower() for h in pre.headers["access-control-allow-headers"].split(",")}
        assert {"authorization", "content-type", "x-stainless-os", "x-stainless-retry-count"} <= allowed
        assert "x-evil" not in allowed
        assert "POST" in pre.headers["access-control-allow-methods"]
        other = server.request("OPTIONS", "/v1/chat/completions", headers={
            "Origin": "http://evil.example", "Access-Control-Request-Method": "POST"})
        assert other.status == 403 and "access-control-allow-origin" not in other.headers
        ok = server.get("/v1/models", headers={"Origin": "http://app.example", "Authorization": "Bearer sk-user"})
        assert ok.status == 200 and ok.headers["access-control-allow-origin"] == "http://app.example"
        assert "x-request-id" in ok.headers["access-control-expose-headers"].lower()
        denied = server.get("/v1/models", headers={"Origin": "http://evil.example", "Authorization": "Bearer sk-user"})
        assert denied.status == 403 and "access-control-allow-origin" not in denied.headers


def test_cors_default_allows_only_the_servers_own_origins(model_dir):
    with ServerThread(config_for(model_dir)) as server:
        for origin in (f"http://127.0.0.1:{server.port}", f"http://localhost:{server.port}"):
            pre = server.request("OPTIONS", "/v1/models", headers={
                "Origin": origin, "Access-Control-Request-Method": "GET",
                "Access-Control-Request-Headers": "Authorization"})
            assert pre.status == 204 and pre.headers["access-control-allow-origin"] == origin
            assert pre.headers["vary"] == "Origin"
            assert pre.headers["access-control-allow-headers"].lower() == "authorization"
        other = server.request("OPTIONS", "/v1/models", headers={
            "Origin": "http://anywhere", "Access-Control-Request-Method": "GET"})
        assert other.status == 403 and "access-control-allow-origin" not in other.headers


def test_cors_star_allows_any_origin(model_dir):
    with ServerThread(config_for(model_dir, listen_extra='cors_origins = ["*"]')) as server:
        pre = server.request("OPTIONS", "/v1/models", headers={
            "Origin": "http://anywhere", "Access-Control-Request-Method": "GET",
            "Access-Control-Request-Headers": "Authorization"})
        assert pre.status == 204 and pre.headers["access-control-allow-origin"] == "*"
        assert server.get("/v1/models", headers={"Origin": "http://anywhere"}).headers[
            "access-control-allow-origin"] == "*"


# ------------------------------------------------------------------------------ limits


def test_prompts_longer_than_the_limit_are_refused(model_dir):
    with ServerThread(config_for(model_dir, listen_extra="max_prompt_tokens = 40")) as server:
        client = openai.OpenAI(base_url=server.base_url, api_key="x", max_retries=0)
        assert client.completions.create(model="tiny", prompt="short", max_tokens=2).usage.prompt_tokens <= 40
        with pytest.raises(openai.BadRequestError) as e:
            client.completions.create(model="tiny", prompt="word " * 200, max_tokens=2)
        assert e.value.code == "context_length_exceeded" and "40" in e.value.message
        with pytest.raises(openai.BadRequestError) as e:
            client.chat.completions.create(**{**CHAT, "messages": [{"role": "user", "content": "word " * 200}]})
        assert e.value.code == "context_length_exceeded"
        with pytest.raises(openai.BadRequestError):
            client.embeddings.create(model="tiny", input="word " * 200)
        with pytest.raises(openai.BadRequestError):  # streamed: the refusal comes before the 200
            client.completions.create(model="tiny", prompt="word " * 200, max_tokens=2, stream=True)
        # The server goes on serving.
        assert client.chat.completions.create(**CHAT).choices[0].finish_reason == "length"


def test_bodies_larger_than_the_limit_are_refused(model_dir):
    with ServerThread(config_for(model_dir, max_body_bytes=2000)) as server:
        r = server.post("/v1/completions", {"model": "tiny", "prompt": "x" * 5000})
        assert r.status == 413 and r.json()["error"]["code"] == "request_too_large"


# ------------------------------------------------------------------------------ TLS


@pytest.fixture(scope="module")
def certificate(tmp_path_factory):
    d = tmp_path_factory.mktemp("tls")
    cert, key = d / "cert.pem", d / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", "/CN=127.0.0.1",
                    "-addext", "subjectAltName=IP:127.0.0.1", "-keyout", str(key), "-out", str(cert)],
                   check=True, capture_output=True)
    return cert, key


def test_tls_from_the_configured_certificate(model_dir, certificate):
    cert, key = certificate
    config = config_for(model_dir, listen_extra=f'tls_cert = "{cert}"\ntls_key = "{key}"')
    with ServerThread(config) as server:
        assert server.running.url.startswith("https://")
        http_client = httpx.Client(verify=ssl.create_default_context(cafile=str(cert)))
        client = openai.OpenAI(base_url=server.base_url, api_key="x", max_retries=0, http_client=http_client)
        assert client.chat.completions.create(**CHAT).choices[0].message.content is not None
        with pytest.raises(openai.APIConnectionError):  # a client that does not trust it refuses
            openai.OpenAI(base_url=server.base_url, api_key="x", max_retries=0).models.list()
        with pytest.raises(httpx.HTTPError):  # plain HTTP gets no answer
            httpx.get(f"http://127.0.0.1:{server.port}/health", timeout=10)


def test_unusable_tls_files_stop_the_server_with_one_line(tmp_path, capsys):
    write_model(tmp_path / "tiny.st")
    (tmp_path / "config.toml").write_text(f'[model]\npath = "{tmp_path}"\nname = "tiny.st"\n'
                                          '[listen]\nport = 0\ntls_cert = "missing.pem"\ntls_key = "missing.key"\n')
    assert main(["--config", str(tmp_path / "config.toml")]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "tls_cert" in err[0] and "missing.pem" in err[0], err
    (tmp_path / "half.toml").write_text('[listen]\ntls_cert = "a.pem"\n')
    assert main(["--config", str(tmp_path / "half.toml")]) == 2
    assert "set both" in capsys.readouterr().err


# ------------------------------------------------------------------------------ request log


def test_each_request_is_one_structured_log_line(model_dir, caplog):
    with ServerThread(config_for(model_dir)) as server, caplog.at_level(logging.INFO, logger="ai00_like.access"):
        r = server.post("/v1/chat/completions", CHAT, headers={"X-Request-Id": "req-42"})
        assert r.status == 200 and r.headers["x-request-id"] == "req-42"
        usage = r.json()["usage"]
        streamed = server.post("/v1/chat/completions", {**CHAT, "stream": True})
        assert re.fullmatch(r"[0-9a-f]{32}", streamed.headers["x-request-id"])
        assert server.get("/v1/models/nope").status == 404
    records = [json.loads(rec.getMessage()) for rec in caplog.records if rec.name == "ai00_like.access"]
    first = next(rec for rec in records if rec["id"] == "req-42")
    assert first["route"] == "/v1/chat/completions" and first["status"] == 200 and first["method"] == "POST"
    assert first["prompt_tokens"] == usage["prompt_tokens"] and first["completion_tokens"] == usage["completion_tokens"]
    assert first["ttft_ms"] <= first["ms"]
    stream = next(rec for rec in records if rec["id"] == streamed.headers["x-request-id"])
    assert stream["status"] == 200 and stream["completion_tokens"] == 6
    assert any(rec["status"] == 404 and rec["route"] == "/v1/models/{model}" for rec in records)


@pytest.mark.parametrize("level", ["info", "warning"])
def test_log_level_warning_hides_the_request_lines_that_info_shows(model_dir, tmp_path, level):
    # No model file: its warning is logged at both levels, after the server listens.
    config = process_config(model_dir, name="absent.st")
    with ServerProcess(tmp_path, config, log_level=level, ready=r"model file \S+absent.st not found") as server:
        assert server.get("/health")[0] == 503
        assert server.get("/v1/models", {"X-Request-Id": "req-7"})[0] == 200
        assert server.terminate() == 0
        log = server.output()
    access = [json.loads(line.split("ai00_like.access: ", 1)[1]) for line in log.splitlines()
              if "ai00_like.access: " in line]
    if level == "info":
        assert [(a["route"], a["status"]) for a in access] == [("/health", 503), ("/v1/models", 200)], log
        assert access[1]["id"] == "req-7"
        assert "listening on" in log and "stopped" in log
    else:
        assert access == [] and " INFO " not in log, log
        assert "WARNING" in log and "absent.st not found" in log


def test_a_bad_log_level_is_a_one_line_error_with_status_2():
    for args in (["--log-level", "loud"], ["serve", "--log-level", "WARN"]):
        result = subprocess.run([sys.executable, "-m", "ai00_like", *args], capture_output=True, text=True,
                                timeout=TIMEOUT, check=False)
        assert result.returncode == 2, result
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and "--log-level" in lines[0] and repr(args[-1]) in lines[0], lines
        assert lines[0].startswith("ai00-like: error: ") and "warning" in lines[0]


def test_the_server_runs_on_uvloop_where_it_is_installed():
    pytest.importorskip("uvloop")
    from ai00_like.api.app import event_loop_factory

    loop = event_loop_factory()()
    try:
        assert type(loop).__module__.startswith("uvloop")
    finally:
        loop.close()
