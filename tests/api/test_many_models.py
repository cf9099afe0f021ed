"""Several models in one server, through real HTTP and the openai SDK: loaded on first use
(once, however many requests wait), evicted least recently used within the budget, never
while busy or pinned, unloaded when idle, and a 503 when nothing can make room."""

from __future__ import annotations

import concurrent.futures
import http.client
import json
import logging
import threading
import time

import openai
import pytest
from api_helpers import LOAD_TIMEOUT, ServerThread, config_for, write_model

from ai00_like.api.metrics import PREFIX
from ai00_like.loaded import build

HI = [{"role": "user", "content": "Hello there"}]
MODELS = ("alpha", "beta", "gamma")


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    """Three small models: two v7 of other weights and a v6."""
    root = tmp_path_factory.mktemp("many")
    write_model(root / "alpha.st", seed=3)
    write_model(root / "beta.st", seed=4)
    write_model(root / "gamma.st", version="6", seed=5)
    return root


@pytest.fixture(scope="module")
def sizes(folder):
    """What each model takes once loaded, as the server measures it."""
    with ServerThread(config_for(folder, model="")) as server:
        client = sdk(server)
        for name in MODELS:
            ask(client, name)
        return {m["id"]: m["memory_bytes"] for m in server.get("/v1/models").json()["data"]}


def sdk(server) -> openai.OpenAI:
    return openai.OpenAI(base_url=server.base_url, api_key="x", max_retries=0, timeout=LOAD_TIMEOUT)


def ask(client, model: str, **extra) -> str:
    reply = client.chat.completions.create(model=model, messages=HI, max_tokens=4, temperature=0, **extra)
    assert reply.model == model
    return reply.choices[0].message.content


def statuses(server) -> dict[str, str]:
    return {m["id"]: m["status"] for m in server.get("/v1/models").json()["data"]}


def budget_for(sizes, count: int) -> str:
    """A byte budget that holds `count` of the models, and not one more."""
    biggest = sorted(sizes.values(), reverse=True)
    return str(sum(biggest[:count]) + min(biggest) // 2)


def pool_config(folder, sizes, *, fits: int, models: str = "", model: str = ""):
    server = f"[server]\nmemory_budget = {budget_for(sizes, fits)}\n"
    return config_for(folder, server + models, model=model)


def test_every_model_is_listed_and_loads_on_first_use(folder):
    with ServerThread(config_for(folder, model="")) as server:
        listed = server.get("/v1/models").json()["data"]
        assert {m["id"]: m["status"] for m in listed} == dict.fromkeys(MODELS, "unloaded")
        assert all(m["object"] == "model" and m["aliases"] for m in listed)
        client = sdk(server)
        assert [m.id for m in client.models.list()] == list(MODELS)
        ask(client, "beta")
        assert statuses(server) == {"alpha": "unloaded", "beta": "loaded", "gamma": "unloaded"}
        assert client.models.retrieve("beta.st").id == "beta"  # the file's name names it too
        with pytest.raises(openai.NotFoundError) as e:
            ask(client, "delta")
        assert "alpha" in e.value.message and e.value.code == "model_not_found"


def test_eight_concurrent_first_requests_load_the_model_once(folder, caplog):
    with ServerThread(config_for(folder, model="")) as server, caplog.at_level(logging.INFO, "ai00_like"):
        client = sdk(server)
        with concurrent.futures.ThreadPoolExecutor(8) as pool:
            replies = list(pool.map(lambda _: ask(client, "gamma"), range(8)))
        assert len(set(replies)) == 1  # greedy: the same reply from the one loaded copy
        loads = [r for r in caplog.records if r.getMessage().startswith("loading model gamma")]
        assert len(loads) == 1
        scraped = server.get("/metrics").body.decode()
        assert f'{PREFIX}model_loads_total{{model_name="gamma",replica=""}} 1.0' in scraped


def test_the_least_recently_used_idle_model_makes_room(folder, sizes):
    with ServerThread(pool_config(folder, sizes, fits=2)) as server:
        client = sdk(server)
        ask(client, "alpha")
        ask(client, "beta")
        ask(client, "alpha")  # beta is now the least recently used
        ask(client, "gamma")
        assert statuses(server) == {"alpha": "loaded", "beta": "unloaded", "gamma": "loaded"}
        ask(client, "beta")  # alpha was used before gamma: it goes
        assert statuses(server) == {"alpha": "unloaded", "beta": "loaded", "gamma": "loaded"}
        info = server.get("/api/models/info").json()
        assert info["budget"]["loaded_models"] == 2
        assert info["budget"]["used_bytes"] <= info["budget"]["memory_bytes"]


def test_max_loaded_models_caps_the_count(folder):
    with ServerThread(config_for(folder, "[server]\nmax_loaded_models = 1\n", model="")) as server:
        client = sdk(server)
        for name in MODELS:
            ask(client, name)
            assert [n for n, s in statuses(server).items() if s == "loaded"] == [name]


def test_a_pinned_model_is_never_evicted(folder, sizes):
    pinned = '[[models]]\nname = "alpha.st"\nkeep_alive = -1\n'
    with ServerThread(pool_config(folder, sizes, fits=2, models=pinned)) as server:
        client = sdk(server)
        ask(client, "alpha")  # the least recently used from now on, but pinned
        ask(client, "beta")
        ask(client, "gamma")
        assert statuses(server) == {"alpha": "loaded", "beta": "unloaded", "gamma": "loaded"}
        assert server.get("/v1/models/alpha").json()["keep_alive"] == -1


def test_a_busy_model_is_never_evicted(folder, sizes):
    with ServerThread(pool_config(folder, sizes, fits=2)) as server:
        client = sdk(server)
        # Decoding for minutes unless stopped: alpha stays busy throughout.
        stream = client.chat.completions.create(model="alpha", messages=HI, max_tokens=60_000, stream=True,
                                                logit_bias={"0": -100}, extra_body={"stop": None})
        chunks = iter(stream)
        next(chunks)
        ask(client, "beta")
        ask(client, "gamma")  # beta is idle, alpha busy: beta goes
        assert statuses(server) == {"alpha": "loaded", "beta": "unloaded", "gamma": "loaded"}
        ask(client, "beta")  # and now gamma, never alpha
        assert statuses(server) == {"alpha": "loaded", "beta": "loaded", "gamma": "unloaded"}
        assert next(chunks).choices[0].finish_reason is None  # still streaming
        stream.close()


def test_nothing_to_evict_is_a_503_naming_the_models_that_hold_the_memory(folder, sizes):
    pinned = '[[models]]\nname = "alpha.st"\nkeep_alive = -1\nload = "startup"\n'
    with ServerThread(pool_config(folder, sizes, fits=1, models=pinned)) as server:
        assert statuses(server)["alpha"] == "loaded"
        r = server.post("/v1/chat/completions", {"model": "beta", "messages": HI, "max_tokens": 2})
        assert r.status == 503 and int(r.headers["retry-after"]) > 0
        error = r.json()["error"]
        assert error["code"] == "model_capacity" and "alpha" in error["message"] and "pinned" in error["message"]
        with pytest.raises(openai.InternalServerError) as e:
            ask(sdk(server), "beta")
        assert e.value.status_code == 503
        assert statuses(server) == {"alpha": "loaded", "beta": "unloaded", "gamma": "unloaded"}


def test_keep_alive_zero_unloads_the_model_once_idle(folder):
    with ServerThread(config_for(folder, model="")) as server:
        client = sdk(server)
        ask(client, "beta", extra_body={"keep_alive": 0})
        deadline = time.monotonic() + 30
        while statuses(server)["beta"] != "unloaded" and time.monotonic() < deadline:
            time.sleep(0.05)
        assert statuses(server)["beta"] == "unloaded"
        ask(client, "beta", extra_body={"keep_alive": "5m"})
        assert server.get("/v1/models/beta").json()["keep_alive"] == 300
        bad = server.post("/v1/chat/completions", {"model": "beta", "messages": HI, "keep_alive": "soon"})
        assert bad.status == 400 and bad.json()["error"]["param"] == "keep_alive"


def test_listings_and_health_checks_do_not_keep_a_model_alive(folder):
    idle = '[[models]]\nname = "beta.st"\nkeep_alive = 1\n'
    with ServerThread(config_for(folder, idle, model="")) as server:
        ask(sdk(server), "beta")
        deadline = time.monotonic() + 30
        while statuses(server)["beta"] != "unloaded" and time.monotonic() < deadline:
            for path in ("/health", "/metrics", "/api/models/info", "/v1/models/beta"):
                assert server.get(path).status == 200
            time.sleep(0.1)
        assert statuses(server)["beta"] == "unloaded"


def test_unloading_under_load_loses_no_request(folder):
    with ServerThread(config_for(folder, model="")) as server:
        client = sdk(server)
        ask(client, "alpha")

        def stream_to_the_end():
            stream = client.chat.completions.create(model="alpha", messages=HI, max_tokens=150, stream=True,
                                                    logit_bias={"0": -100}, extra_body={"stop": None})
            return [c.choices[0].finish_reason for c in stream if c.choices]

        with concurrent.futures.ThreadPoolExecutor(3) as pool:
            streams = [pool.submit(stream_to_the_end) for _ in range(3)]
            time.sleep(0.3)
            unload = server.post("/admin/models/unload", {"model": "alpha"})
            assert unload.status == 200
            assert all(s.result(LOAD_TIMEOUT)[-1] == "length" for s in streams)
        assert statuses(server)["alpha"] == "unloaded"
        ask(client, "alpha")  # and it comes back on demand


def test_two_models_stream_at_once_as_each_does_alone(folder):
    with ServerThread(config_for(folder, model="")) as server:
        client = sdk(server)

        def reply(model: str) -> str:
            stream = client.chat.completions.create(model=model, messages=HI, max_tokens=40, temperature=0,
                                                    stream=True, logit_bias={"0": -100}, extra_body={"stop": None})
            return "".join(c.choices[0].delta.content or "" for c in stream if c.choices)

        alone = {name: reply(name) for name in ("alpha", "gamma")}
        start = threading.Barrier(2)

        def together(model: str) -> str:
            start.wait()
            return reply(model)

        with concurrent.futures.ThreadPoolExecutor(2) as pool:
            both = dict(zip(("alpha", "gamma"), pool.map(together, ("alpha", "gamma"))))
        assert both == alone and alone["alpha"] != alone["gamma"]


def test_a_stream_waiting_for_its_model_gets_pings_then_its_reply(folder):
    release = threading.Event()

    def held_build(spec, *progress):  # the middleware's builder, held until the test has its pings
        assert release.wait(LOAD_TIMEOUT)
        return build(spec, *progress)

    with ServerThread(config_for(folder, model="", ping_interval=0.05), builder=held_build) as server:
        conn = http.client.HTTPConnection("127.0.0.1", server.port, timeout=LOAD_TIMEOUT)
        body = {"model": "gamma", "messages": HI, "max_tokens": 2, "stream": True}
        conn.request("POST", "/v1/chat/completions", body=json.dumps(body),
                     headers={"Content-Type": "application/json"})
        response = conn.getresponse()
        assert response.status == 200 and response.getheader("content-type").startswith("text/event-stream")
        assert response.read(16) == b": ping\n\n" * 2  # while the load is held
        release.set()
        rest = response.read().decode()
        assert '"finish_reason":"length"' in rest and rest.rstrip().endswith("data: [DONE]")
        conn.close()


def test_embeddings_and_stored_responses_stay_with_their_model(folder):
    with ServerThread(config_for(folder, model="alpha.st")) as server:
        client = sdk(server)
        for name in ("alpha", "gamma"):
            embedded = client.embeddings.create(model=name, input="a text")
            assert embedded.model == name and len(embedded.data[0].embedding) == 64
        first = client.responses.create(model="gamma", input="Tell me something", max_output_tokens=4)
        assert first.model == "gamma"
        # No model named: the conversation goes on where it started, not on the default model.
        second = client.responses.create(previous_response_id=first.id, input="And more?", max_output_tokens=4)
        assert second.model == "gamma" and second.usage.input_tokens_details.cached_tokens >= 0
        with pytest.raises(openai.BadRequestError) as e:
            client.responses.create(model="alpha", previous_response_id=first.id, input="x", max_output_tokens=2)
        assert e.value.param == "previous_response_id"
