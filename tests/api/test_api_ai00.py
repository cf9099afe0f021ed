"""Ai00's own routes: /api/models/{info,list,state}, /api/adapters, /admin/models/*."""

from __future__ import annotations

import hashlib
import http.client
import json
import time

import pytest
from api_helpers import SCHEMAS, ServerThread, config_for, write_model, write_state

from ai00_like.rwkv import memory
from ai00_like.rwkv.loader import read_checkpoint

HI = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2}


@pytest.fixture(scope="module")
def model_dir(model_dir):
    """The tier's folder with tiny.st (conftest.py), plus a v6, a state and files that are no models."""
    d = model_dir
    write_model(d / "other.st", version="6", seed=4)
    write_state(d / "tuned.state")
    (d / "notes.txt").write_text("not a model")
    (d / "broken.st").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json}")
    return d


@pytest.fixture(scope="module")
def server(model_dir):
    """For tests that leave the server as they found it."""
    with ServerThread(config_for(model_dir, max_batch=2)) as s:
        yield s


@pytest.fixture
def fresh_server(model_dir):
    """For tests that load, unload or reconfigure."""
    with ServerThread(config_for(model_dir, max_batch=2)) as s:
        yield s


def test_models_info(server):
    info = server.get("/api/models/info").json()
    assert info["loaded"] is True and info["id"] == "tiny"
    assert info["model"] == {"version": "V7", "num_layer": 2, "num_emb": 64, "num_hidden": 256, "num_vocab": 65536,
                             "num_head": 2, "head_size": 32}
    assert info["reload"]["model_path"] == "tiny.st" and info["reload"]["max_batch"] == 2
    assert info["slots"] == 2 and info["running"] == 0


def test_models_list(server, model_dir):
    files = {f["name"]: f for f in server.get("/api/models/list").json()}
    assert set(files) == {"tiny.st", "other.st", "tuned.state", "notes.txt", "broken.st"}
    tiny = files["tiny.st"]
    assert tiny["size"] == (model_dir / "tiny.st").stat().st_size
    # Files up to 10 MB are hashed whole; larger ones (this model: 33 MB) by ten 1 MB samples.
    assert files["notes.txt"]["sha"] == hashlib.sha256(b"not a model").hexdigest()
    assert files["tuned.state"]["sha"] == hashlib.sha256((model_dir / "tuned.state").read_bytes()).hexdigest()
    assert len(tiny["sha"]) == 64 and tiny["sha"] != files["other.st"]["sha"]
    assert tiny["info"]["version"] == "V7" and files["other.st"]["info"]["version"] == "V6"
    assert files["notes.txt"]["info"] is None and files["notes.txt"]["error"] is None
    assert files["broken.st"]["info"] is None and "broken.st" in files["broken.st"]["error"]


def test_models_state_streams_the_status(fresh_server):
    conn = http.client.HTTPConnection("127.0.0.1", fresh_server.port, timeout=30)
    conn.request("GET", "/api/models/state")
    resp = conn.getresponse()
    assert resp.status == 200 and resp.getheader("Content-Type").startswith("text/event-stream")
    line = resp.readline()
    assert line.startswith(b"data: {")
    first = json.loads(line[6:])  # plain JSON, not Ai00's JSON string inside JSON
    assert first["loaded"] is True and first["model"]["version"] == "V7"
    fresh_server.call(fresh_server.serving.unload())
    while True:  # the next event tells of the change
        line = resp.readline()
        if line.startswith(b"data: "):
            break
    assert json.loads(line[6:])["loaded"] is False
    conn.close()


def test_status_counts_tokens_and_cache_hits(fresh_server):
    before = fresh_server.get("/api/models/info").json()
    assert before["generated_tokens"] == 0 and before["cache_hits"] == 0
    body = {"prompt": "The same prompt twice", "max_tokens": 5, "temperature": 0, "ignore_eos": True}
    usages = [fresh_server.post("/v1/completions", body).json()["usage"] for _ in range(2)]
    after = fresh_server.get("/api/models/info").json()
    assert after["generated_tokens"] == sum(u["completion_tokens"] for u in usages) == 10
    # The second request found the first one's prompt in the cache and computed none of it.
    assert after["cache_hits"] >= 1 and after["cache_hit_tokens"] >= usages[1]["prompt_tokens"]
    assert after["prompt_tokens"] == usages[0]["prompt_tokens"]
    # The rate is taken between two looks at the totals: the second look saw 10 more tokens.
    assert after["generated_tokens_per_second"] > 0


def test_adapters_lists_the_cpu_first(server):
    adapters = server.get("/api/adapters").json()
    assert adapters and adapters[0].startswith("CPU")


def statuses(server) -> dict[str, str]:
    return {m["id"]: m["status"] for m in server.get("/v1/models").json()["data"]}


def test_admin_load_replaces_the_default_model_and_a_reload_replaces_it_again(fresh_server):
    r = fresh_server.post("/admin/models/load", {"model_path": "other.st", "max_batch": 3,
                                           "state": [{"path": "tuned.state", "name": "t"}]})
    assert r.status == 200, r
    assert r.json()["id"] == "other" and r.json()["model"]["version"] == "V6" and r.json()["slots"] == 3
    models = fresh_server.get("/v1/models").json()
    SCHEMAS.check("ListModelsResponse", models)
    # As Ai00's: the file loaded is now the model requests without `model` get, and the one
    # it replaced is unloaded, still served on demand.
    for _ in range(200):
        if statuses(fresh_server) == {"tiny": "unloaded", "other": "loaded"}:
            break
        time.sleep(0.05)
    assert statuses(fresh_server) == {"tiny": "unloaded", "other": "loaded"}
    assert fresh_server.post("/v1/chat/completions", {**HI, "state": "t"}).json()["model"] == "other"
    assert fresh_server.post("/v1/chat/completions", {**HI, "model": "tiny"}).status == 200
    # Loaded again under its name, with other settings: the new copy replaces the old one.
    again = fresh_server.post("/admin/models/load", {"model_path": "other.st", "max_batch": 2})
    assert again.status == 200 and again.json()["id"] == "other" and again.json()["slots"] == 2
    assert [m["id"] for m in fresh_server.get("/v1/models").json()["data"]] == ["tiny", "other"]


@pytest.mark.parametrize("body,status,param", [
    ({"model_path": "../outside.st"}, 403, "model_path"),
    ({"model_path": "/etc/passwd"}, 403, "model_path"),
    ({"model_path": "missing.st"}, 404, "model_path"),
    ({"model_path": "tiny.st", "tokenizer_path": "../../vocab.txt"}, 403, "tokenizer_path"),
    ({"model_path": "tiny.st", "lora": [{"path": "../x.lora"}]}, 403, "lora[0].path"),
    ({"model_path": "tiny.st", "quant": 2, "quant_type": "SF4"}, 400, "quant_type"),
    ({"model_path": "tiny.st", "precision": "fp8"}, 400, "precision"),
    ({"model_path": "tiny.st", "quant": -1}, 400, "quant"),
    ({"model_path": "tiny.st", "max_batch": 0}, 400, "max_batch"),
    ({"model_path": "tiny.st", "device": "cuda"}, 400, "device"),
    ({"lora": []}, 400, "model_path"),
])
def test_admin_load_refuses_bad_requests(server, body, status, param):
    r = server.post("/admin/models/load", body)
    assert r.status == status, r
    SCHEMAS.check("ErrorResponse", r.json())
    assert r.json()["error"]["param"] == param


def test_failed_load_keeps_the_old_model(fresh_server):
    r = fresh_server.post("/admin/models/load", {"model_path": "broken.st"})
    error = r.json()["error"]
    assert r.status == 400 and error["code"] == "load_failed" and "broken.st" in error["message"]
    assert fresh_server.post("/v1/chat/completions", HI).status == 200
    assert fresh_server.get("/api/models/info").json()["last_error"]


def test_admin_unload_then_a_request_loads_it_again(fresh_server):
    assert fresh_server.get("/admin/models/unload").json()["loaded"] is False
    assert fresh_server.get("/v1/models/tiny").json()["status"] == "unloaded"
    assert fresh_server.post("/v1/chat/completions", HI).status == 200  # loaded on demand
    assert fresh_server.get("/v1/models/tiny").json()["status"] == "loaded"
    unload = fresh_server.post("/admin/models/unload", {"model": "tiny"})
    assert unload.status == 200 and unload.json()["loaded"] is False
    assert fresh_server.post("/admin/models/load", {"model": "tiny"}).json()["id"] == "tiny"
    missing = fresh_server.post("/admin/models/unload", {"model": "nope"})
    assert missing.status == 404 and missing.json()["error"]["code"] == "model_not_found"


def test_admin_save_writes_the_loaded_model_once(tmp_path):
    import numpy as np

    from ai00_like.rwkv import load_model

    write_model(tmp_path / "tiny.st")
    with ServerThread(config_for(tmp_path, max_batch=1)) as server:
        r = server.post("/admin/models/save", {"path": "copy.st", "dtype": "fp32"})
        assert r.status == 200 and r.json()["path"] == "copy.st"
        assert r.json()["bytes"] == (tmp_path / "copy.st").stat().st_size
        again = server.post("/admin/models/save", {"path": "copy.st"})
        assert again.status == 409 and again.json()["error"]["param"] == "path"
        outside = server.post("/admin/models/save", {"path": "../escape.st"})
        assert outside.status == 403 and not (tmp_path.parent / "escape.st").exists()
        assert server.post("/admin/models/save", {}).status == 400
    want, _ = load_model(tmp_path / "tiny.st").forward([1, 2, 3])
    got, _ = load_model(tmp_path / "copy.st").forward([1, 2, 3])
    np.testing.assert_allclose(got, want, rtol=0, atol=1e-6 * want.std())
    assert not list(tmp_path.glob("*.part"))


def test_admin_key(model_dir):
    config = config_for(model_dir, listen_extra='admin_key = "s3cret"')
    with ServerThread(config) as server:
        assert server.get("/admin/models/unload").status == 401
        assert server.get("/admin/models/unload", headers={"Authorization": "Bearer nope"}).status == 401
        non_ascii = "Bearer \u00e9".encode("latin-1")
        assert server.get("/admin/models/unload", headers={"Authorization": non_ascii}).status == 401
        assert server.get("/admin/models/unload?admin_token=s3cret").status == 200
        ok = server.post("/admin/models/load", {"model_path": "tiny.st"}, headers={"Authorization": "Bearer s3cret"})
        assert ok.status == 200
        assert server.get("/v1/models").status == 200  # the admin key guards only /admin


def test_admin_routes_close_beyond_loopback_without_a_key(fresh_server):
    fresh_server.serving.listen_host = "0.0.0.0"  # as if started with --ip 0.0.0.0
    try:
        r = fresh_server.get("/admin/models/unload")
        assert r.status == 403 and r.json()["error"]["code"] == "admin_key_required"
        assert fresh_server.post("/v1/chat/completions", HI).status == 200  # the model is still there
    finally:
        fresh_server.serving.listen_host = "127.0.0.1"


def test_unload_mid_stream_lets_the_stream_finish_first(fresh_server):
    import concurrent.futures

    import openai

    client = openai.OpenAI(base_url=fresh_server.base_url, api_key="x", max_retries=0)
    stream = client.chat.completions.create(model="tiny", messages=HI["messages"], max_tokens=300, stop=None,
                                            stream=True, logit_bias={"0": -100}, extra_body={"stop": None})
    chunks = [next(iter(stream))]  # the role chunk: the stream is running
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        unloading = pool.submit(fresh_server.get, "/admin/models/unload")
        chunks += list(stream)  # no request is lost: it ends as it would have
        assert unloading.result(timeout=60).status == 200
    assert chunks[-1].choices[0].finish_reason == "length"
    assert fresh_server.get("/v1/models/tiny").json()["status"] == "unloaded"


def test_openapi_document_lists_every_route_and_matches_the_responses(server):
    import jsonschema

    doc = server.get("/api-docs/openapi.json").json()
    assert doc["openapi"].startswith("3.1")
    served = {(r.method, r.resource.canonical) for r in server.running.runner.app.router.routes()
              if r.resource is not None and r.method != "HEAD"}
    documented = {(m.upper(), p) for p, ops in doc["paths"].items() for m in ops if m != "head"}
    assert served - {("GET", "/api-docs/openapi.json")} == documented

    def check(schema_name, instance):
        root = {"$ref": f"#/components/schemas/{schema_name}", "components": doc["components"]}
        jsonschema.Draft202012Validator(root).validate(instance)

    check("ChatCompletion", server.post("/v1/chat/completions", HI).json())
    check("ServerStatus", server.get("/api/models/info").json())
    check("ErrorEnvelope", server.post("/v1/chat/completions", {"messages": []}).json())
    request = doc["paths"]["/v1/chat/completions"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    assert request == {"$ref": "#/components/schemas/ChatCompletionRequest"}


def test_a_load_survives_its_client_disconnecting(fresh_server):
    import socket
    import threading

    from ai00_like.messages import Load

    serving = fresh_server.serving
    sent, original = threading.Event(), serving.middleware.send

    def spy(message):
        original(message)
        if isinstance(message, Load):
            sent.set()

    serving.middleware.send = spy
    try:
        conn = http.client.HTTPConnection("127.0.0.1", fresh_server.port, timeout=30)
        conn.request("POST", "/admin/models/load", body=json.dumps({"model_path": "other.st"}),
                     headers={"Content-Type": "application/json"})
        assert sent.wait(30)
        conn.sock.shutdown(socket.SHUT_RDWR)
        conn.close()
        fresh_server.call(serving.wait_idle())
    finally:
        serving.middleware.send = original
    # The HTTP tier knows the model the middleware now holds.
    assert statuses(fresh_server)["other"] == "loaded"
    assert fresh_server.post("/v1/chat/completions", {**HI, "model": "other"}).status == 200


def test_a_model_larger_than_the_free_memory_is_refused_with_the_sizes(fresh_server, monkeypatch):
    need = memory.resident_bytes(read_checkpoint(fresh_server.config.model_spec().path).tensors, "fp32")
    monkeypatch.setattr(memory, "available_bytes", lambda: need // 2)  # a machine with too little left
    r = fresh_server.post("/admin/models/load", {"model_path": "tiny.st", "precision": "fp32"})
    error = r.json()["error"]
    assert r.status == 400 and error["code"] == "load_failed"
    assert "tiny.st" in error["message"] and "GiB of memory" in error["message"] and "GiB free" in error["message"]
    assert fresh_server.post("/v1/chat/completions", HI).status == 200  # the old model still serves
    monkeypatch.setattr(memory, "available_bytes", lambda: 64 * 2**30)
    assert fresh_server.post("/admin/models/load", {"model_path": "tiny.st", "precision": "fp32"}).status == 200
