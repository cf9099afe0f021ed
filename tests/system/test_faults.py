"""Faults: clients that vanish mid-prefill and mid-stream, unload and reload under load, a
corrupt model loaded at runtime, SIGTERM and SIGINT under load. Nothing may hang, leak a slot or
answer 500; the server as its own process where memory, signals or exit status matter."""

from __future__ import annotations

import json
import signal
import socket
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import openai
import pytest
from api_helpers import ServerThread, config_for
from process_helpers import TIMEOUT, ServerProcess, metrics_of, process_config, stream_chat

DISCONNECTS = 100


def raw_stream_request(port: int, body: dict) -> socket.socket:
    sock = socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT)
    data = json.dumps({**body, "stream": True}).encode()
    sock.sendall(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                 b"Content-Length: %d\r\n\r\n" % len(data) + data)
    return sock


def read_until(sock: socket.socket, marker: bytes) -> bytes:
    seen = b""
    while marker not in seen:
        chunk = sock.recv(65536)
        assert chunk, seen[-300:]
        seen += chunk
    return seen


def wait_until(condition, what: str, timeout: float = TIMEOUT):
    deadline = time.monotonic() + timeout
    while not (result := condition()):
        assert time.monotonic() < deadline, what
        time.sleep(0.05)
    return result


def idle(port: int) -> bool:
    m = metrics_of(port)
    return m["rwkv:num_requests_running"] == 0 and m["rwkv:num_requests_waiting"] == 0


def test_clients_that_disconnect_free_their_slots(model_dir):
    with ServerProcess(model_dir, process_config(model_dir)) as server:
        long_prompt = " ".join(f"word{i}" for i in range(400))  # ~25 steps of 16 tokens to prefill

        def vanish(k: int) -> None:
            body = {"model": "tiny", "messages": [{"role": "user", "content": f"{k} {long_prompt}"}],
                    "max_tokens": 2000, "temperature": 1.0, "seed": k}
            sock = raw_stream_request(server.port, body)
            try:
                if k % 2:
                    read_until(sock, b"\r\n\r\n")  # the 200 with only pings: still prefilling
                else:
                    read_until(sock, b'"content":')  # tokens are flowing
            finally:
                sock.close()

        def round_of(count: int, start: int) -> None:
            with ThreadPoolExecutor(8) as pool:
                list(pool.map(vanish, range(start, start + count)))
            wait_until(lambda: idle(server.port), "slots still busy after the clients left")

        round_of(10, 0)  # warm-up, then the memory baseline
        baseline, aborted = server.rss(), metrics_of(server.port)["rwkv:requests_aborted_total"]
        round_of(DISCONNECTS, 10)
        m = metrics_of(server.port)
        assert m["rwkv:requests_aborted_total"] - aborted == DISCONNECTS
        grown = server.rss() - baseline
        assert grown < 16 << 20, f"RSS grew by {grown / 2**20:.1f} MiB after {DISCONNECTS} disconnects"
        # Every slot is free: max_batch requests at once all run to the end.
        with ThreadPoolExecutor(4) as pool:
            done = list(pool.map(lambda k: stream_chat(server.port, {
                "model": "tiny", "messages": [{"role": "user", "content": f"hi {k}"}], "max_tokens": 8}), range(4)))
        assert all(events[-1] == "[DONE]" for events in done)
        assert server.terminate() == 0


def _stream_until_first_token(port: int, body: dict, started: threading.Barrier | None = None,
                              marker: bytes = b'"content":'):
    """Stream a chat request to its end; its `data:` payloads. Once `marker` has come
    (by default the first token), wait at `started` for the others."""
    sock = raw_stream_request(port, body)
    try:
        seen = read_until(sock, marker)
        if started is not None:
            started.wait(TIMEOUT)
        sock.settimeout(TIMEOUT)
        while not seen.endswith(b"\r\n0\r\n\r\n"):  # the last chunk (headers may end in "0\r\n\r\n" too)
            chunk = sock.recv(65536)
            if not chunk:
                break
            seen += chunk
    finally:
        sock.close()
    events = [line[6:] for line in seen.decode(errors="replace").split("\n") if line.startswith("data: ")]
    assert events, seen[-1000:]
    return events


def test_unload_and_reload_under_load_never_hang_lose_a_request_or_fail_with_500(model_dir):
    with ServerThread(config_for(model_dir, max_batch=4)) as server:
        stop = threading.Event()
        statuses: list[int] = []

        def keep_asking():
            client = openai.OpenAI(base_url=server.base_url, api_key="x", max_retries=0, timeout=TIMEOUT)
            while not stop.is_set():
                try:
                    client.chat.completions.create(model="tiny", messages=[{"role": "user", "content": "go"}],
                                                   max_tokens=4)
                    statuses.append(200)
                except openai.APIStatusError as e:
                    statuses.append(e.status_code)

        started = threading.Barrier(4 + 1)
        body = {"model": "tiny", "messages": [{"role": "user", "content": "a long story"}], "max_tokens": 300,
                "temperature": 1.0}
        with ThreadPoolExecutor(6) as pool:
            try:
                askers = [pool.submit(keep_asking) for _ in range(2)]
                streams = [pool.submit(_stream_until_first_token, server.port, {**body, "seed": k}, started)
                           for k in range(4)]
                started.wait(TIMEOUT)  # four long streams are generating
                # The unload waits for them: each ends as it would have, none with an error.
                assert server.get("/admin/models/unload").status == 200
                for future in streams:
                    events = future.result(TIMEOUT)
                    assert events[-1] == "[DONE]", events[-3:]
                    assert json.loads(events[-2])["choices"][0]["finish_reason"] in ("stop", "length")
                # The askers' requests meanwhile waited, and loaded the model again.
                assert server.post("/v1/completions", {"prompt": "x", "max_tokens": 2}).status == 200
                # A reload while requests run: they finish on the old copy or fail cleanly (503).
                assert server.post("/admin/models/load", {"model_path": "tiny.st"}).status == 200
            finally:
                stop.set()
            for future in askers:
                future.result(TIMEOUT)
        assert statuses.count(200) > 0 and set(statuses) <= {200, 503}, sorted(set(statuses))
        reply = server.post("/v1/chat/completions", {"messages": [{"role": "user", "content": "hi"}], "max_tokens": 3})
        assert reply.status == 200, reply


def test_a_corrupt_model_file_fails_to_load_and_the_old_one_keeps_serving(model_dir):
    good = (model_dir / "tiny.st").read_bytes()
    (model_dir / "truncated.st").write_bytes(good[: len(good) // 2])
    (model_dir / "garbage.st").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json at all}" + bytes(1000))
    header = len(good[:8]) + int.from_bytes(good[:8], "little")
    (model_dir / "flipped.st").write_bytes(good[:header] + bytes(len(good) - header - 10))  # data cut short
    with ServerThread(config_for(model_dir)) as server:
        client = openai.OpenAI(base_url=server.base_url, api_key="x", max_retries=0)
        body = {"model": "tiny", "messages": [{"role": "user", "content": "story"}], "max_tokens": 400,
                "temperature": 1.0, "seed": 1}
        with ThreadPoolExecutor(1) as pool:
            running = pool.submit(stream_chat, server.port, body)
            for name in ("truncated.st", "garbage.st", "flipped.st"):
                r = server.post("/admin/models/load", {"model_path": name})
                assert r.status == 400 and r.json()["error"]["code"] == "load_failed", r
                assert server.get("/health").status == 200
            events = running.result(TIMEOUT)  # the stream running meanwhile is untouched
        assert events[-1] == "[DONE]" and events[-2]["choices"][0]["finish_reason"] in ("stop", "length")
        assert client.models.list().data[0].id == "tiny"
        assert client.chat.completions.create(**body).choices[0].message.content


@pytest.mark.parametrize("sig,grace,max_tokens,signals", [
    pytest.param(signal.SIGTERM, 0.3, 3000, 1, id="sigterm-short-grace"),  # the long streams are cut short
    pytest.param(signal.SIGTERM, 30.0, 300, 1, id="sigterm-long-grace"),  # they finish
    pytest.param(signal.SIGTERM, 30.0, 3000, 2, id="sigterm-twice"),  # a second signal ends the grace period
    pytest.param(signal.SIGINT, 0.3, 3000, 1, id="sigint-short-grace"),  # Ctrl-C: the same as SIGTERM
    pytest.param(signal.SIGINT, 30.0, 3000, 2, id="sigint-twice"),  # Ctrl-C twice
])
def test_a_signal_under_load_ends_every_stream_cleanly_and_exits_0(model_dir, sig, grace, max_tokens, signals):
    with ServerProcess(model_dir, process_config(model_dir, grace=grace)) as server:
        started = threading.Barrier(6 + 1)
        body = {"model": "tiny", "messages": [{"role": "user", "content": "tell"}], "max_tokens": max_tokens,
                "temperature": 1.0}
        with ThreadPoolExecutor(6) as pool:
            # 4 slots: four streams generate, two wait in the queue (their 200 and pings came).
            streams = [pool.submit(_stream_until_first_token, server.port, {**body, "seed": k}, started,
                                   b"\r\n\r\n") for k in range(6)]
            started.wait(TIMEOUT)
            m = wait_until(lambda: (m := metrics_of(server.port))["rwkv:num_requests_running"] == 4 and m,
                           "four streams generating")
            assert m["rwkv:num_requests_waiting"] == 2
            if signals == 2:
                server.proc.send_signal(sig)
                server.wait_for_line("shutting down")
            code = server.terminate(sig)
            results = [f.result(TIMEOUT) for f in streams]
        assert code == 0, "".join(server.lines[-20:])
        for events in results:
            assert events and events[-1] == "[DONE]", (events[-3:], "".join(server.lines[-30:]))
            finish = [json.loads(e)["choices"][0]["finish_reason"] for e in events[:-1]
                      if json.loads(e)["choices"] and json.loads(e)["choices"][0]["finish_reason"]]
            assert finish in (["stop"], ["length"]), events[-3:]
        log = "".join(server.lines)
        assert "shutting down" in log and "stopped" in log
        access = [json.loads(line.split("ai00_like.access: ", 1)[1]) for line in server.lines
                  if "ai00_like.access: " in line]
        streamed = [a for a in access if a["route"] == "/v1/chat/completions"]
        assert len(streamed) == 6 and all(a["status"] == 200 and a["completion_tokens"] >= 0 for a in streamed)
        if max_tokens > 1000:
            assert "generations still running" in log
        else:
            assert all('"finish_reason":"length"' in "".join(events) for events in results)
        with pytest.raises(OSError):
            socket.create_connection(("127.0.0.1", server.port), timeout=5).close()


def test_sigterm_with_a_drain_delay_fails_health_at_once_and_keeps_serving_until_it_ends(model_dir):
    """Behind a load balancer: /health turns 503 `draining` at the signal, so the balancer's
    checks take the replica out, while requests that still arrive are served; only after
    drain_delay does the listener close. The running stream finishes; exit status 0."""
    delay = 3.0
    with ServerProcess(model_dir, process_config(model_dir, grace=30.0, drain_delay=delay)) as server:
        body = {"model": "tiny", "messages": [{"role": "user", "content": "tell"}], "max_tokens": 300,
                "temperature": 1.0, "seed": 1}
        with ThreadPoolExecutor(1) as pool:
            started = threading.Barrier(2)
            running = pool.submit(_stream_until_first_token, server.port, body, started)
            started.wait(TIMEOUT)
            assert server.get("/health")[0] == 200
            signalled = time.monotonic()
            server.proc.send_signal(signal.SIGTERM)
            status, health = wait_until(lambda: (r := server.get("/health"))[0] != 200 and r, "health still 200")
            assert status == 503 and json.loads(health)["status"] == "draining"
            assert time.monotonic() - signalled < 1.0
            # A request arriving while draining is served as usual, not refused.
            served = stream_chat(server.port, {**body, "max_tokens": 4, "seed": 2})
            assert served[-1] == "[DONE]" and time.monotonic() - signalled < delay
            events = running.result(TIMEOUT)
        assert events[-1] == "[DONE]"
        assert server.proc.wait(TIMEOUT) == 0
        assert time.monotonic() - signalled >= delay
        log = server.output()
        assert "draining" in log and "stopped" in log
        access = [json.loads(line.split("ai00_like.access: ", 1)[1]) for line in server.lines
                  if "ai00_like.access: " in line]
        assert all(a["status"] < 500 for a in access if a["route"] != "/health"), access
