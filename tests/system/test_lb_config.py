"""`ai00-like lb-config` with Debian's real HAProxy (installed by scripts/test.sh) in front of
two replicas on the loopback: every turn of a conversation lands on one replica, whether
its key is `prompt_cache_key`, the X-Session-Id header, `user` or its first message, and
the conversations spread over both."""

from __future__ import annotations

import shutil
import subprocess
import sys
import time

import httpx
import pytest
from process_helpers import ServerProcess, free_port, process_config

from api_helpers import write_model
from ai00_like.lb_config import haproxy_config

HAPROXY = shutil.which("haproxy") or "/usr/sbin/haproxy"
pytestmark = pytest.mark.skipif(not shutil.which(HAPROXY), reason="HAProxy is not installed (apt-get install haproxy)")


@pytest.fixture(scope="module")
def balancer(tmp_path_factory):
    folder = tmp_path_factory.mktemp("lb")
    write_model(folder / "tiny.st")
    with ServerProcess(folder, process_config(folder, responses="responses-1")) as one, \
            ServerProcess(folder, process_config(folder, responses="responses-2")) as two:
        port = free_port()
        config = folder / "haproxy.cfg"
        made = subprocess.run([sys.executable, "-m", "ai00_like", "lb-config", "--replica",
                               f"http://127.0.0.1:{one.port}", "--replica", f"127.0.0.1:{two.port}", "--port",
                               str(port), "--bind", "127.0.0.1", "-o", str(config)], capture_output=True, text=True)
        assert made.returncode == 0, made.stderr
        proxy = subprocess.Popen([HAPROXY, "-db", "-f", str(config)], stdout=subprocess.DEVNULL,
                                 stderr=subprocess.PIPE, text=True)
        try:
            with httpx.Client(base_url=f"http://127.0.0.1:{port}", timeout=60) as client:
                for _ in range(100):  # 20 s at most
                    try:
                        if client.get("/health").status_code == 200:
                            break
                    except httpx.HTTPError:
                        pass
                    assert proxy.poll() is None, proxy.stderr.read()
                    time.sleep(0.2)
                yield client, {"replica1", "replica2"}
        finally:
            proxy.terminate()
            proxy.wait(10)


def served_by(client, body: dict, headers: dict | None = None) -> str:
    reply = client.post("/v1/chat/completions", json={"model": "tiny", "max_tokens": 2, **body}, headers=headers or {})
    assert reply.status_code == 200, reply.text
    return reply.headers["X-Ai00-Replica"]


def test_the_config_is_valid_for_haproxy(tmp_path):
    config = tmp_path / "haproxy.cfg"
    config.write_text(haproxy_config(["http://10.0.0.2:65530", "10.0.0.3:65530", "http://[::1]:65530"]))
    checked = subprocess.run([HAPROXY, "-c", "-f", str(config)], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr


@pytest.mark.parametrize("affinity", ["prompt_cache_key", "X-Session-Id", "user", "first message"])
def test_every_turn_of_a_conversation_lands_on_one_replica(balancer, affinity):
    client, replicas = balancer
    seen = set()
    for conversation in range(12):
        key = f"conversation-{affinity}-{conversation}"
        where = set()
        for turn in range(3):
            messages = [{"role": "user", "content": key if affinity == "first message" else "Hello"}]
            messages += [{"role": "assistant", "content": "Hi"}, {"role": "user", "content": f"turn {turn}"}] * turn
            body, headers = {"messages": messages}, {}
            if affinity == "X-Session-Id":
                headers["X-Session-Id"] = key
            elif affinity != "first message":
                body[affinity] = key
            where.add(served_by(client, body, headers))
        assert len(where) == 1, f"{key} went to {where}"
        seen |= where
    assert seen == replicas  # the conversations spread over both


def test_bad_replica_addresses_are_one_line():
    failed = subprocess.run([sys.executable, "-m", "ai00_like", "lb-config", "--replica", "https://x:1/v1"],
                            capture_output=True, text=True)
    assert failed.returncode == 2 and failed.stderr.count("\n") == 1 and "replica" in failed.stderr


# ------------------------------------------------------------------ replicas serving different models


def routes_of(text: str) -> tuple[dict[str, set[str]], set[str]]:
    """What a config does with a request's model: {model: the servers of its backend}, and
    the servers of the default backend (where any other model, or none, goes)."""
    backends, current = {}, None
    for line in text.splitlines():
        if line.startswith("backend "):
            current = backends.setdefault(line.split()[1], set())
        elif line.startswith("    server ") and current is not None:
            current.add(line.split()[1])
    routes = {}
    for line in text.splitlines():
        if line.startswith("    use_backend "):
            backend, condition = line.split()[1], line.split(" if ", 1)[1]
            assert condition.startswith("{ var(txn.model) -m str '") and condition.endswith("' }"), line
            for quoted in condition[len("{ var(txn.model) -m str "):-len(" }")].split(" "):
                assert quoted[0] == quoted[-1] == "'", line
                routes[quoted[1:-1]] = backends[backend]
    return routes, backends["replicas"]


def haproxy_check(tmp_path, text: str) -> None:
    config = tmp_path / "haproxy.cfg"
    config.write_text(text)
    checked = subprocess.run([HAPROXY, "-c", "-f", str(config)], capture_output=True, text=True)
    assert checked.returncode == 0, checked.stdout + checked.stderr


def test_replicas_without_model_lists_get_todays_config():
    text = haproxy_config(["http://10.0.0.2:65530", "10.0.0.3:65530"])
    assert "txn.model" not in text and "use_backend" not in text and text.count("\nbackend ") == 1
    assert routes_of(text) == ({}, {"replica1", "replica2"})


def test_a_model_of_one_replica_goes_to_that_replica(tmp_path):
    text = haproxy_config(["http://10.0.0.2:65530=small,RWKV/rwkv-7-world:0.1B", "http://10.0.0.3:65530=large"])
    haproxy_check(tmp_path, text)
    assert "    http-request set-var(txn.model) req.body,json_query('$.model')\n" in text
    routes, default = routes_of(text)
    assert routes == {"small": {"replica1"}, "RWKV/rwkv-7-world:0.1B": {"replica1"}, "large": {"replica2"}}
    assert default == {"replica1", "replica2"}  # no model, or another one: any replica
    assert "    use_backend replicas_1 if { var(txn.model) -m str 'RWKV/rwkv-7-world:0.1B' 'small' }\n" in text
    # Every backend hashes the affinity key and retries; each replica is checked once, and tracked elsewhere.
    assert text.count("balance hash var(txn.key)") == text.count("hash-type consistent") == 3
    assert text.count("retry-on conn-failure empty-response 503") == 3
    assert text.count("http-response set-header X-Ai00-Replica %s") == 3
    assert "    server replica1 10.0.0.2:65530 track replicas/replica1\n" in text
    assert "    server replica2 10.0.0.3:65530 track replicas/replica2\n" in text


def test_replicas_without_a_list_are_the_default_and_serve_every_model(tmp_path):
    text = haproxy_config(["http://10.0.0.2:65530", "http://10.0.0.3:65530=tiny,big-1.5b",
                           "http://[::1]:65530=tiny", "http://10.0.0.5:65530=tiny,big-1.5b"])
    haproxy_check(tmp_path, text)
    routes, default = routes_of(text)
    assert default == {"replica1"}  # an unlisted model may be in its folder: only it serves every model
    assert routes == {"big-1.5b": {"replica1", "replica2", "replica4"},
                      "tiny": {"replica1", "replica2", "replica3", "replica4"}}
    # Replicas 2-4 are not in the default backend: each is checked in the first backend that
    # has it (replicas_1_2_3_4), and tracked in the others.
    assert text.index("backend replicas_1_2_3_4") < text.index("backend replicas_1_2_4")
    for server in ("replica2 10.0.0.3:65530", "replica3 [::1]:65530", "replica4 10.0.0.5:65530"):
        assert text.count(f"    server {server} check inter 1s fall 2 rise 1\n") == 1
    assert "    server replica2 10.0.0.3:65530 track replicas_1_2_3_4/replica2\n" in text
    assert "    server replica1 10.0.0.2:65530 track replicas/replica1\n" in text
    assert text.count("option httpchk GET /health") == 2


def test_a_model_every_replica_lists_needs_no_backend_of_its_own(tmp_path):
    text = haproxy_config(["10.0.0.2:65530=tiny,small", "10.0.0.3:65530=tiny"])
    routes, default = routes_of(text)
    assert routes == {"small": {"replica1"}} and default == {"replica1", "replica2"}


def test_many_models_split_over_lines(tmp_path):
    models = [f"org-{n:02d}/model.v{n}:{'q' * 60}" for n in range(40)]
    text = haproxy_config([f"10.0.0.2:65530={','.join(models)}", "10.0.0.3:65530=other"])
    haproxy_check(tmp_path, text)
    assert routes_of(text)[0] == {**{m: {"replica1"} for m in models}, "other": {"replica2"}}
    assert text.count("use_backend replicas_1 ") > 1
    assert max(len(line) for line in text.splitlines()) < 1000


@pytest.mark.parametrize("replica, error", [
    ("http://10.0.0.2:65530=", "the list of models after '=' is empty"),
    ("http://10.0.0.2:65530=a,,b", "an empty model name"),
    ("http://10.0.0.2:65530=small,", "an empty model name"),
    ("http://10.0.0.2:65530=it's", "'it's' is not a model name"),
    ("http://10.0.0.2:65530=a b", "'a b' is not a model name"),
    ("http://10.0.0.2:65530=-m", "'-m' is not a model name"),
    ("http://10.0.0.2:65530=x#y", "'x#y' is not a model name"),
    ("http://10.0.0.2:x=small", "is not a replica address"),
])
def test_bad_model_lists_are_one_line(replica, error):
    failed = subprocess.run([sys.executable, "-m", "ai00_like", "lb-config", "--replica", replica],
                            capture_output=True, text=True)
    assert failed.returncode == 2 and failed.stderr.count("\n") == 1 and error in failed.stderr, failed.stderr


def test_a_replica_given_twice_is_an_error():
    with pytest.raises(ValueError, match="given twice"):
        haproxy_config(["http://10.0.0.2:65530=small", "10.0.0.2:65530=large"])
