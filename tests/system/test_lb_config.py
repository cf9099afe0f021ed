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
