"""Three replicas behind Debian's real HAProxy (the config `ai00-like lb-config` writes) with a
shared redis-server, all on the loopback: conversation affinity keeps the prefix cache's
hit rate of a single replica (and round robin does not); streams pass HAProxy without
delay; a replica killed with SIGKILL
costs only the requests running on it, cleanly, and loses no stored response; a replica
stopped with SIGTERM drains without a 5xx; a replica brought back takes back only its own
keys. The tests run in file order and share one cluster: the destructive ones come last.
The first test starts two replicas of its own, serving different models, before the cluster:
a request naming a model lands on the replica that serves it.
"""

from __future__ import annotations

import json
import re
import shutil
import signal
import subprocess
import sys
import threading
import time
from contextlib import ExitStack
from types import SimpleNamespace

import httpx
import pytest
from process_helpers import ServerProcess, free_port, process_config

from api_helpers import write_model

HAPROXY = shutil.which("haproxy") or "/usr/sbin/haproxy"
REDIS = shutil.which("redis-server") or "/usr/bin/redis-server"
pytestmark = [
    pytest.mark.skipif(not shutil.which(HAPROXY), reason="HAProxy is not installed (apt-get install haproxy)"),
    pytest.mark.skipif(not shutil.which(REDIS), reason="redis-server is not installed (apt-get install redis-server)"),
]

NAMES = ("replica1", "replica2", "replica3")  # lb-config names servers so; the replicas call themselves the same
CHECK = 1.0  # lb-config's `inter 1s fall 2`: a dead replica is out after two failed checks
# Two check intervals, plus a margin for a busy 2-core machine: a clean-clone CI run saw
# 3.06 s with every xdist worker busy (two intervals after a check that had just passed,
# the log line read by polling).
DOWN_WITHIN = 2 * CHECK + 2.0
DRAIN_DELAY = 3.0
GRACE = 120.0  # shutdown_grace: long enough that a drained stream ends by itself, never cut
# A cache entry of the tiny model holds its logits (65536 floats, 256 KiB): 1 MiB, the
# default of process_config, would keep only four; 20 conversations need some hundred.
CACHE_BYTES = 128 << 20
# Three replicas (and HAProxy, Redis, the clients) on a 2-core machine: OpenBLAS's and
# numba's default of a thread per core in each replica made them starve each other.
ONE_THREAD = {"OPENBLAS_NUM_THREADS": "1", "OMP_NUM_THREADS": "1", "NUMBA_NUM_THREADS": "1"}
KEYS = [f"key-{n:02d}" for n in range(60)]
GREEDY = {"model": "tiny", "temperature": 0}


class Lines:
    """A child's stderr, each line with the monotonic time it arrived."""

    def __init__(self, stream):
        self.lines: list[tuple[float, str]] = []
        self._changed = threading.Condition()
        threading.Thread(target=self._read, args=(stream,), daemon=True).start()

    def _read(self, stream) -> None:
        for line in stream:
            with self._changed:
                self.lines.append((time.monotonic(), line))
                self._changed.notify_all()

    def wait_for(self, pattern: str, since: float, timeout: float) -> float:
        """When a line matching `pattern` came at or after `since`."""
        regex, deadline = re.compile(pattern), time.monotonic() + timeout
        with self._changed:
            while True:
                for at, line in self.lines:
                    if at >= since and regex.search(line):
                        return at
                left = deadline - time.monotonic()
                assert left > 0, f"no {pattern!r} within {timeout} s: {''.join(t for _, t in self.lines)[-2000:]}"
                self._changed.wait(left)


class Balancer:
    """HAProxy with the given config, in the foreground (-db): it logs each server going
    DOWN or UP to stderr, which is how a test sees what its health checks decided."""

    def __init__(self, folder, text: str, port: int):
        self.config = folder / f"haproxy-{port}.cfg"
        self.config.write_text(text)
        self.port = port
        self.proc = subprocess.Popen([HAPROXY, "-db", "-f", str(self.config)], stdout=subprocess.DEVNULL,
                                     stderr=subprocess.PIPE, text=True)
        self.log = Lines(self.proc.stderr)
        self.client = httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30)
        for _ in range(100):  # 20 s at most
            try:
                if self.client.get("/health").status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            assert self.proc.poll() is None, "".join(t for _, t in self.log.lines)
            time.sleep(0.2)
        raise AssertionError("HAProxy did not answer within 20 s")

    def close(self) -> None:
        self.client.close()
        self.proc.terminate()
        self.proc.wait(10)


class Cluster:
    def __init__(self, folder, model_folder, stack: ExitStack, store_url: str):
        self.folder, self.model_folder, self.stack, self.store_url = folder, model_folder, stack, store_url
        self.replicas: dict[str, ServerProcess] = {}
        self.maps: dict[str, dict[str, str]] = {}  # "before", "during", "after": key → replica
        self.killed: str | None = None

    def start_replicas(self, names, port: int = 0) -> None:
        """Started side by side (their loads overlap), each in its own folder for its config."""
        servers = []
        for name in names:
            config = process_config(self.model_folder, replica=name, drain_delay=DRAIN_DELAY, grace=GRACE)
            config = config.replace("cache_bytes = 1048576", f"cache_bytes = {CACHE_BYTES}")
            config += f'[store]\nurl = "{self.store_url}"\nprefix = "cluster:"\nttl = 3600\n'
            # The affinity test compares one replica's hit rate with round robin's, which a
            # shared prefix cache would even out (test_shared_prefix_cache.py tests that one).
            config = config.replace("[cache]\n", "[cache]\nshared = false\n")
            (self.folder / name).mkdir(exist_ok=True)
            servers.append(ServerProcess(self.folder / name, config, port=port, env=ONE_THREAD))
        start_together(servers, self.stack)
        self.replicas.update(zip(names, servers))


def start_together(servers: list[ServerProcess], stack: ExitStack) -> None:
    """Started side by side (their loads overlap), each stopped when `stack` closes."""
    failed = []

    def enter(server: ServerProcess) -> None:
        try:
            server.__enter__()
        except BaseException as e:
            failed.append(e)

    starting = [threading.Thread(target=enter, args=(server,)) for server in servers]
    for t in starting:
        t.start()
    for server, t in zip(servers, starting):
        t.join()
        stack.push(server.__exit__)
    if failed:
        raise failed[0]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory):
    folder = tmp_path_factory.mktemp("cluster")
    (folder / "model").mkdir()
    write_model(folder / "model" / "tiny.st")
    redis_port = free_port()
    store = subprocess.Popen([REDIS, "--port", str(redis_port), "--bind", "127.0.0.1", "--save", "",
                              "--appendonly", "no"], cwd=folder, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    with ExitStack() as stack:
        stack.callback(lambda: (store.terminate(), store.wait(10)))
        cluster = Cluster(folder, folder / "model", stack, f"redis://127.0.0.1:{redis_port}/0")
        cluster.start_replicas(NAMES)
        port = free_port()
        replicas = [a for name in NAMES for a in ("--replica", f"http://127.0.0.1:{cluster.replicas[name].port}")]
        made = subprocess.run([sys.executable, "-m", "ai00_like", "lb-config", *replicas, "--port", str(port),
                               "--bind", "127.0.0.1", "-o", str(folder / "haproxy.cfg")], capture_output=True, text=True)
        assert made.returncode == 0, made.stderr
        cluster.config_text = (folder / "haproxy.cfg").read_text()
        cluster.balancer = Balancer(folder, cluster.config_text, port)
        stack.callback(cluster.balancer.close)
        cluster.maps["before"] = key_map(cluster.balancer.client)  # all three up: the reference
        yield cluster


# ---------------------------------------------------------------------------------- helpers


def chat(client: httpx.Client, key: str | None, messages: list, max_tokens: int = 4) -> tuple[str, str, dict]:
    """(reply, the replica that served it, usage) of a greedy chat completion."""
    body = {**GREEDY, "messages": messages, "max_tokens": max_tokens}
    if key is not None:
        body["prompt_cache_key"] = key
    reply = client.post("/v1/chat/completions", json=body)
    assert reply.status_code == 200, reply.text
    data = reply.json()
    return data["choices"][0]["message"]["content"], reply.headers.get("X-Ai00-Replica", ""), data["usage"]


def key_map(client: httpx.Client) -> dict[str, str]:
    return {key: chat(client, key, [{"role": "user", "content": "Where am I?"}], 1)[1] for key in KEYS}


def respond(client: httpx.Client, key: str, text: str, previous: str | None = None) -> tuple[dict, str]:
    body = {**GREEDY, "input": text, "max_output_tokens": 8, "prompt_cache_key": key}
    if previous:
        body["previous_response_id"] = previous
    reply = client.post("/v1/responses", json=body)
    assert reply.status_code == 200, reply.text
    return reply.json(), reply.headers.get("X-Ai00-Replica", "")


def text_of(response: dict) -> str:
    """The Responses API's reply text (the SDK's `output_text`, which is not on the wire)."""
    return "".join(part["text"] for item in response["output"] if item["type"] == "message"
                   for part in item["content"] if part["type"] == "output_text")


def stream(client: httpx.Client, key: str, max_tokens: int, started: threading.Event | None = None) -> dict:
    """One streamed chat through the balancer, whatever happens to it: its status, replica,
    whether it ended with a finish_reason and [DONE], or the error that ended it."""
    body = {**GREEDY, "messages": [{"role": "user", "content": f"Tell me a long story, {key}."}],
            "max_tokens": max_tokens, "prompt_cache_key": key, "stream": True}
    out = {"key": key, "start": time.monotonic(), "status": None, "replica": "", "finish": None, "done": False,
           "error": None, "first": None}
    try:
        with client.stream("POST", "/v1/chat/completions", json=body) as resp:
            out["status"], out["replica"] = resp.status_code, resp.headers.get("X-Ai00-Replica", "")
            for line in resp.iter_lines():
                if started is not None:
                    started.set()
                if line == "data: [DONE]":
                    out["done"] = True
                elif line.startswith("data: "):
                    choices = json.loads(line[6:]).get("choices") or [{}]
                    out["finish"] = choices[0].get("finish_reason") or out["finish"]
                    if out["first"] is None and choices[0].get("delta", {}).get("content"):
                        out["first"] = time.monotonic()
    except httpx.HTTPError as e:
        out["error"] = f"{type(e).__name__}: {e}"
    out["end"] = time.monotonic()
    return out


def conversations(client: httpx.Client, tag: str, n: int = 20, turns: int = 5, key: bool = True) -> tuple[float, dict]:
    """`n` conversations of `turns` turns, interleaved (turn 1 of each, then turn 2 of each…)
    as concurrent users would send them; every turn resends the whole history. The
    prefix-cache hit rate of turns 2.., and where each conversation's turns went."""
    histories = {i: [] for i in range(n)}
    where: dict[int, list[str]] = {i: [] for i in range(n)}
    cached = prompt = 0
    for turn in range(1, turns + 1):
        for i in range(n):
            question = (f"{tag} conversation {i:02d}, turn {turn}: what became of the city by the river "
                        "after the flood had gone down?")
            histories[i].append({"role": "user", "content": question})
            text, replica, usage = chat(client, f"{tag}-{i}" if key else None, histories[i], 8)
            histories[i].append({"role": "assistant", "content": text})
            where[i].append(replica)
            if turn > 1:
                cached += usage["prompt_tokens_details"]["cached_tokens"]
                prompt += usage["prompt_tokens"]
    return cached / prompt, where


# ---------------------------------------------------------------------------------- the tests


def test_a_request_goes_to_a_replica_that_serves_its_model(tmp_path):
    """Two replicas of their own (before the shared cluster starts), each serving one model
    from its own folder, behind `lb-config --replica URL=MODEL,…`: every request naming a
    model lands on the replica that serves it, whatever its affinity key; a request without
    a model still goes to either."""
    served = {"replica1": ("alpha", "org/alpha:7b"), "replica2": ("beta", "beta-v1.5")}  # file stem, served_name
    with ExitStack() as stack:
        replicas = {}
        for seed, (name, (stem, model)) in enumerate(served.items(), 3):
            (tmp_path / name).mkdir()
            write_model(tmp_path / name / f"{stem}.st", seed=seed)
            config = process_config(tmp_path / name, name=f"{stem}.st", replica=name)
            config = config.replace("[model]\n", f'[model]\nserved_name = "{model}"\n', 1)
            replicas[name] = ServerProcess(tmp_path / name, config, env=ONE_THREAD)
        start_together(list(replicas.values()), stack)
        for name, (stem, model) in served.items():  # each serves its own model, and only it
            status, body = replicas[name].get("/v1/models")
            assert status == 200 and [m["id"] for m in json.loads(body)["data"]] == [model], body
        port = free_port()
        lists = [a for name, (stem, model) in served.items()
                 for a in ("--replica", f"http://127.0.0.1:{replicas[name].port}={model},{stem}")]
        made = subprocess.run([sys.executable, "-m", "ai00_like", "lb-config", *lists, "--port", str(port), "--bind",
                               "127.0.0.1", "-o", str(tmp_path / "haproxy.cfg")], capture_output=True, text=True)
        assert made.returncode == 0, made.stderr
        balancer = Balancer(tmp_path, (tmp_path / "haproxy.cfg").read_text(), port)
        stack.callback(balancer.close)

        def where(model: str | None, key: str) -> tuple[int, str]:
            body = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1, "prompt_cache_key": key}
            reply = balancer.client.post("/v1/chat/completions", json=body | ({"model": model} if model else {}))
            return reply.status_code, reply.headers.get("X-Ai00-Replica", "")

        keys = [f"key-{n}" for n in range(8)]
        assert {where(None, key) for key in keys} == {(200, name) for name in served}  # no model: either
        for name, (stem, model) in served.items():
            for key in keys:  # the same keys, that spread over both without a model
                assert where(model, key) == (200, name), (model, key)
            assert where(stem, keys[0]) == (200, name)  # another name of the model, listed too
        status, replica = where("gamma", keys[0])  # a model no replica serves: either, which says so
        assert status == 404 and replica in served


def test_affinity_keeps_a_single_replicas_hit_rate_and_round_robin_does_not(cluster):
    client = cluster.balancer.client
    assert set(cluster.maps["before"].values()) == set(NAMES)  # 60 keys spread over all three

    affinity, where = conversations(client, "affinity")
    for i, replicas in where.items():
        assert len(set(replicas)) == 1, f"conversation {i} went to {replicas}"
    assert len({r[0] for r in where.values()}) > 1  # and the conversations spread

    with httpx.Client(base_url=f"http://127.0.0.1:{cluster.replicas['replica1'].port}", timeout=30) as direct:
        single, _ = conversations(direct, "single--")

    # The same balancer without affinity: round robin, each turn on the next replica.
    text = cluster.config_text.replace("balance hash var(txn.key)", "balance roundrobin")
    assert text != cluster.config_text
    port = free_port()
    robin = Balancer(cluster.folder, text.replace(f":{cluster.balancer.port}\n", f":{port}\n"), port)
    try:
        round_robin, where = conversations(robin.client, "roundrb-")
    finally:
        robin.close()
    assert all(len(set(replicas)) > 1 for replicas in where.values())
    print(f"\nprefix-cache hit rate, turns 2-5: single replica {single:.1%}, "
          f"affinity {affinity:.1%}, round robin {round_robin:.1%}")
    assert affinity >= 0.95 * single
    assert round_robin < 0.6 * affinity


def test_a_stream_passes_haproxy_without_delay(cluster):
    # HAProxy without `option http-no-delay` held each stream's first token back ~200 ms.
    key = next(k for k, r in cluster.maps["before"].items() if r == "replica1")
    ttft = {}
    for name, port in (("direct", cluster.replicas["replica1"].port), ("haproxy", cluster.balancer.port)):
        with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=30) as client:
            runs = [stream(client, key, 2) for _ in range(6)]  # the same prompt: from the cache after the first
        assert all(r["first"] for r in runs), runs
        ttft[name] = sorted(r["first"] - r["start"] for r in runs[1:])[2]
    print(f"\ntime to first token, median: direct {ttft['direct'] * 1000:.0f} ms, "
          f"through HAProxy {ttft['haproxy'] * 1000:.0f} ms")
    assert ttft["haproxy"] < ttft["direct"] + 0.1


@pytest.fixture(scope="module")
def killed(cluster) -> SimpleNamespace:
    """replica2 killed (SIGKILL) while six users stream conversations through HAProxy, three of
    them its own; before that, stored conversations on every replica, with the reply each
    one's next turn gets while all three are up. What the users saw, when the kill was and
    when HAProxy took the replica out, and the key map without it (cluster.maps["during"]).
    Once per module, for whichever test asks first: the tests after it find the replica dead."""
    client, before = cluster.balancer.client, cluster.maps["before"]
    victim = "replica2"
    # Stored conversations on every replica, the victim's among them, and the reply each
    # one's next turn gets while all are up: the greedy reply it must still get.
    stored = []
    for name in NAMES:
        for key in [k for k, r in before.items() if r == name][:3]:
            first, served = respond(client, key, f"Who built the ark, {key}?")
            assert served == name
            expected, _ = respond(client, key, "And then?", first["id"])
            stored.append((key, first, text_of(expected)))

    # Six users stream conversations through the balancer, the victim's keys among them.
    results, stop, started = [], threading.Event(), threading.Event()
    users_keys = [k for k, r in before.items() if r == victim][:3] + [k for k, r in before.items() if r != victim][:3]

    running: dict[str, float] = {}  # key → when its current request started, for a hang's message

    def user(key: str) -> None:
        with httpx.Client(base_url=f"http://127.0.0.1:{cluster.balancer.port}", timeout=20) as own:
            for _ in range(1000):  # bounded; a few dozen requests each in the seconds the test gives
                if stop.is_set():
                    return
                running[key] = time.monotonic()
                results.append(stream(own, key, 48, started))

    users = [threading.Thread(target=user, args=(key,), daemon=True) for key in users_keys]
    for t in users:
        t.start()
    assert started.wait(20)
    time.sleep(0.5)
    killed_at = time.monotonic()
    cluster.replicas[victim].proc.kill()
    cluster.killed = victim
    down_at = cluster.balancer.log.wait_for(rf"{victim} is DOWN", killed_at, DOWN_WITHIN + 5)
    time.sleep(2.0)
    stop.set()
    hung = []
    for key, t in zip(users_keys, users):
        t.join(60)
        if t.is_alive():
            hung.append(f"a client hung: {key} (of {before[key]}) since "
                        f"{running[key] - killed_at:.1f} s after the kill")
    cluster.maps["during"] = key_map(client)
    return SimpleNamespace(victim=victim, stored=stored, results=results, hung=hung, killed_at=killed_at,
                           down_at=down_at)


def test_a_killed_replica_costs_only_its_running_requests_and_no_stored_response(cluster, killed):
    client, before = cluster.balancer.client, cluster.maps["before"]
    victim, stored, results = killed.victim, killed.stored, killed.results
    killed_at, down_at = killed.killed_at, killed.down_at
    survivors = set(NAMES) - {victim}
    assert [s for s in stored if before[s[0]] == victim]
    assert not killed.hung, killed.hung
    print(f"\nHAProxy took {victim} out {down_at - killed_at:.2f} s after SIGKILL; {len(results)} streams")
    assert down_at - killed_at <= DOWN_WITHIN

    hit = [r for r in results if r["start"] < killed_at < r["end"]]
    # A stream the victim had not answered yet has no replica header; its key says where it went.
    on_victim = [r for r in hit if r["replica"] == victim or (r["replica"] == "" and before[r["key"]] == victim)]
    assert on_victim, "no request was running on the victim"
    for r in results:
        clean_ok = r["status"] == 200 and r["done"] and r["finish"] and r["error"] is None
        clean_failure = r["status"] in (502, 503) or (r["error"] is not None and r["replica"] in ("", victim))
        assert clean_ok or clean_failure, r
        if not clean_ok:  # only requests that were running on the victim when it died fail, at once
            assert r in hit and r["replica"] in ("", victim) and r["end"] - killed_at < 5, r
        if r["start"] > killed_at:
            assert clean_ok and r["replica"] in survivors, r

    # Every stored response is still there, and continues as it would have on the victim.
    for key, first, expected in stored:
        got = client.get(f"/v1/responses/{first['id']}")
        assert got.status_code == 200 and got.json()["output"] == first["output"], got.text
        again, served = respond(client, key, "And then?", first["id"])
        assert served in survivors
        assert text_of(again) == expected, (key, before[key])

    during = cluster.maps["during"]
    for key, name in before.items():
        assert during[key] == name if name != victim else during[key] in survivors, key


def test_a_replica_brought_back_takes_back_only_its_own_keys(cluster, killed):
    victim = killed.victim
    client, before = cluster.balancer.client, cluster.maps["before"]
    since = time.monotonic()
    cluster.start_replicas([victim], port=cluster.replicas[victim].port)  # where HAProxy looks for it
    up_at = cluster.balancer.log.wait_for(rf"{victim} is UP", since, 10)
    print(f"\nHAProxy took {victim} back {up_at - since:.2f} s after it was started (model load included)")
    after = key_map(client)
    for key, name in before.items():
        if name != victim:  # never moved, through the kill and the return
            assert cluster.maps["during"][key] == after[key] == name, key
    assert after == before


def test_a_replica_stopped_with_sigterm_drains_without_a_5xx(cluster):
    before = cluster.maps["before"]
    target = next(n for n in NAMES if n != cluster.killed)
    server = cluster.replicas[target]
    own_keys = [k for k, r in before.items() if r == target]
    results, probes, stop, started = [], [], threading.Event(), threading.Event()
    # Streams that outlast the drain delay, on a quiet machine or a busy one: about 6 s of
    # tokens at the rate this replica streams now.
    with httpx.Client(base_url=f"http://127.0.0.1:{server.port}", timeout=30) as direct:
        timed = stream(direct, own_keys[0], 64)
    tokens = max(64, min(20000, int(64 / (timed["end"] - timed["start"]) * 6)))

    def streamer(key: str) -> None:
        with httpx.Client(base_url=f"http://127.0.0.1:{cluster.balancer.port}", timeout=30) as own:
            results.append(stream(own, key, tokens, started))

    def prober() -> None:  # new requests for the target's keys, all through the episode
        with httpx.Client(base_url=f"http://127.0.0.1:{cluster.balancer.port}", timeout=30) as own:
            for n in range(200):
                if stop.is_set():
                    return
                start = time.monotonic()
                reply = own.post("/v1/chat/completions", json={
                    **GREEDY, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 2,
                    "prompt_cache_key": own_keys[n % len(own_keys)]})
                probes.append((start, reply.status_code, reply.headers.get("X-Ai00-Replica", "")))
                time.sleep(0.1)

    streams = [threading.Thread(target=streamer, args=(key,), daemon=True) for key in own_keys[:3]]
    for t in streams:
        t.start()
    assert started.wait(20)
    probing = threading.Thread(target=prober, daemon=True)
    probing.start()
    time.sleep(0.5)
    termed_at = time.monotonic()
    server.proc.send_signal(signal.SIGTERM)
    for _ in range(50):  # the signal reaches the server's event loop within milliseconds
        status, body = server.get("/health")
        if status != 200:
            break
        time.sleep(0.01)
    assert (status, json.loads(body)["status"]) == (503, "draining")
    assert time.monotonic() - termed_at < 1.0
    down_at = cluster.balancer.log.wait_for(rf"{target} is DOWN", termed_at, DOWN_WITHIN + 5)
    for t in streams:
        t.join(60)
        assert not t.is_alive(), "a stream hung"
    time.sleep(max(0.0, termed_at + DRAIN_DELAY + 1.0 - time.monotonic()))  # past the listener's close
    stop.set()
    probing.join(30)
    assert server.proc.wait(60) == 0
    print(f"\nHAProxy took {target} out {down_at - termed_at:.2f} s after SIGTERM; "
          f"{len(results)} streams of {tokens} tokens lasted {max(r['end'] for r in results) - termed_at:.1f} s "
          f"after it; {len(probes)} probes")
    assert down_at - termed_at <= DOWN_WITHIN

    for r in results:
        assert (r["status"], r["replica"], r["done"], r["error"]) == (200, target, True, None), r
        assert r["finish"] in ("stop", "length"), r
    assert any(r["end"] > termed_at + DRAIN_DELAY for r in results)  # running when the listener closed
    assert probes and all(status == 200 for _, status, _ in probes), probes
    assert any(replica == target for at, _, replica in probes if at > termed_at)  # served while draining
    late = [replica for at, _, replica in probes if at > down_at]
    assert late and target not in late
    # Nothing the replica answered was a 5xx, but /health: HAProxy's checks, 503 on purpose.
    log = [json.loads(line.split("ai00_like.access: ", 1)[1]) for line in server.output().splitlines()
           if "ai00_like.access: " in line]
    assert log and not [e for e in log if e["status"] >= 500 and e["route"] != "/health"]
    assert "still running at the end of the grace period" not in server.output()  # none was cut short
