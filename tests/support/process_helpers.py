"""The server as a separate process (`python -m ai00_like`), for what a thread cannot show:
its memory (RSS), signals and exit status. Plus small clients for streams and metrics."""

from __future__ import annotations

import http.client
import json
import os
import re
import signal
import socket
import subprocess
import sys
import shutil
import threading
import time
from pathlib import Path
from typing import Self

import psutil
import redis

TIMEOUT = 60
REDIS = shutil.which("redis-server") or "/usr/bin/redis-server"


class ServerProcess:
    """`with ServerProcess(directory, config_text) as server:` — listening, and the `ready`
    line (by default: the configured model loaded, or its load failed) logged."""

    def __init__(self, directory: Path, config_text: str, *, log_level: str = "info",
                 ready: str = r"model \S+ loaded|loading \S+ failed", port: int = 0, env: dict | None = None):
        self.path = directory / "server-config.toml"
        self.path.write_text(config_text)
        self.log_level = log_level
        self.ready = ready  # the line that ends startup, logged after the socket listens
        self.lines: list[str] = []
        self._changed = threading.Condition()
        self.proc: subprocess.Popen | None = None
        self.port = port  # 0: any free port; a fixed one brings a stopped replica back where it was
        self.env = env or {}  # on top of this process's environment

    def __enter__(self) -> Self:
        env = {**os.environ, "PYTHONUNBUFFERED": "1", **self.env}
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "ai00_like", "--config", str(self.path), "--port", str(self.port),
             "--log-level", self.log_level],
            stderr=subprocess.PIPE, stdout=subprocess.DEVNULL, text=True, env=env)
        threading.Thread(target=self._read, daemon=True).start()
        try:
            self.wait_for_line(self.ready)
            # The port from the process itself: above `info` the "listening on" line is not shown.
            ports = [c.laddr.port for c in psutil.Process(self.proc.pid).net_connections("tcp")
                     if c.status == psutil.CONN_LISTEN]
            assert len(ports) == 1, ports
        except BaseException:
            self.__exit__()
            raise
        self.port = ports[0]
        return self

    def __exit__(self, *exc) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(TIMEOUT)

    def _read(self) -> None:
        for line in self.proc.stderr:
            with self._changed:
                self.lines.append(line)
                self._changed.notify_all()
        with self._changed:
            self.lines.append("")  # end of output
            self._changed.notify_all()

    def wait_for_line(self, pattern: str, timeout: float = TIMEOUT) -> str:
        regex = re.compile(pattern)
        deadline = time.monotonic() + timeout
        seen = 0
        with self._changed:
            while True:
                for line in self.lines[seen:]:
                    if regex.search(line):
                        return line
                    if line == "":
                        raise AssertionError(f"server exited without {pattern!r}: {''.join(self.lines)[-2000:]}")
                seen = len(self.lines)
                left = deadline - time.monotonic()
                assert left > 0, f"no {pattern!r} within {timeout} s: {''.join(self.lines)[-2000:]}"
                self._changed.wait(left)

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def rss(self) -> int:
        return psutil.Process(self.proc.pid).memory_info().rss

    def terminate(self, sig: int = signal.SIGTERM) -> int:
        self.proc.send_signal(sig)
        return self.proc.wait(TIMEOUT)

    def output(self) -> str:
        """All the server wrote to stderr, once its stderr is closed (it has exited)."""
        with self._changed:
            ended = self._changed.wait_for(lambda: self.lines[-1:] == [""], TIMEOUT)
            assert ended, f"stderr still open after {TIMEOUT} s: {''.join(self.lines)[-2000:]}"
            return "".join(self.lines)

    def get(self, path: str, headers: dict | None = None) -> tuple[int, bytes]:
        return http_get(self.port, path, headers)


def process_config(directory: Path, *, name: str = "tiny.st", max_batch: int = 4, grace: float = 10.0,
                   chunk: int = 16, drain_delay: float = 0.0, replica: str = "", responses: str = "responses") -> str:
    """A config for ServerProcess: the model `name` in `directory`, loopback, quick pings.
    Servers sharing `directory` need a `responses` folder each (one server per store)."""
    return f"""
[responses]
path = "{responses}"
[cache]
path = "{responses}.cache"
[model]
path = "{directory}"
name = "{name}"
max_batch = {max_batch}
token_chunk_size = {chunk}
cache_bytes = 1048576
[listen]
ip = "127.0.0.1"
ping_interval = 0.02
shutdown_grace = {grace}
drain_delay = {drain_delay}
replica = "{replica}"
"""


def free_port() -> int:
    """A loopback port free right now (for a process that must be told its port)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http_get(port: int, path: str, headers: dict | None = None) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=TIMEOUT)
    try:
        conn.request("GET", path, headers=headers or {})
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def wait_until_healthy(port: int, proc: subprocess.Popen, seconds: float = 180.0, log: Path | None = None) -> None:
    """Until GET /health is 200 (a model is loaded); fails if the process ends first, with
    the end of its log file when there is one."""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise AssertionError(f"the server exited ({proc.returncode})"
                                 + (f": {log.read_text()[-2000:]}" if log and log.exists() else ""))
        try:
            if http_get(port, "/health")[0] == 200:
                return
        except OSError:
            pass
        time.sleep(0.2)
    raise AssertionError(f"no model was ready within {seconds:.0f} s")


def parse_metrics(text: str) -> dict[str, float]:
    """Prometheus text → {"name{labels}": value} and {"name": sum over labels}."""
    from prometheus_client.parser import text_string_to_metric_families

    values: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            labels = ",".join(f'{k}="{v}"' for k, v in sorted(sample.labels.items()))
            values[f"{sample.name}{{{labels}}}"] = sample.value
            values[sample.name] = values.get(sample.name, 0.0) + sample.value
    return values


def metrics_of(port: int, headers: dict | None = None) -> dict[str, float]:
    status, body = http_get(port, "/metrics", headers)
    assert status == 200, body[:300]
    return parse_metrics(body.decode())


def stream_chat(port: int, body: dict, headers: dict | None = None) -> list:
    """POST a streaming chat request; the decoded events, "[DONE]" included."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=TIMEOUT)
    try:
        conn.request("POST", "/v1/chat/completions", body=json.dumps({**body, "stream": True}),
                     headers={"Content-Type": "application/json", **(headers or {})})
        resp = conn.getresponse()
        assert resp.status == 200, resp.read()[:300]
        events = []
        for block in resp.read().decode().split("\n\n"):
            if block.startswith("data: "):
                data = block[6:]
                events.append(data if data == "[DONE]" else json.loads(data))
        return events
    finally:
        conn.close()


class RedisProcess:
    """redis-server on a loopback port, nothing written to disk; stop() and start() again
    keep the port (and lose the data, as a restart without persistence does)."""

    def __init__(self, folder):
        self.folder, self.port, self.proc = folder, free_port(), None
        self.url = f"redis://127.0.0.1:{self.port}/0"

    def start(self) -> RedisProcess:
        self.proc = subprocess.Popen([REDIS, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "",
                                      "--appendonly", "no"], cwd=self.folder, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL)
        client = redis.Redis(port=self.port, socket_connect_timeout=1)
        for _ in range(100):  # 10 s at most
            try:
                client.ping()
                return self
            except redis.ConnectionError:
                assert self.proc.poll() is None, "redis-server exited"
                time.sleep(0.1)
        raise AssertionError("redis-server did not answer within 10 s")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(10)

    def client(self) -> redis.Redis:
        return redis.Redis(port=self.port)
