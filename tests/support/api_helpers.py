"""The real HTTP server on a free loopback port, in a background thread, plus what tests
need to talk to it: raw HTTP (bytes in, bytes out), SSE parsing and OpenAI schema checks."""

from __future__ import annotations

import asyncio
import http.client
import json
import shutil
import tempfile
import threading
from pathlib import Path
from typing import Self

import jsonschema
import yaml

from ai00_like.api.app import RunningServer, start_server
from ai00_like.config import Config, parse_config
from ai00_like.messages import Generate
from ai00_like.middleware import Middleware
from ai00_like.rwkv.formats.safetensors import write_safetensors
from ai00_like.rwkv.synthetic import make_checkpoint, make_state

TIMEOUT = 60
LOAD_TIMEOUT = 300  # s: a model load that compiles kernels on a busy machine
SPEC_PATH = Path(__file__).resolve().parents[1] / "data" / "openai" / "openapi-subset.yaml"  # see its README


def write_model(path: Path, version: str = "7", seed: int = 3) -> Path:
    # World vocabulary size so every token of the shipped tokenizer exists; narrow and shallow.
    write_safetensors(make_checkpoint(version, n_layer=2, n_embd=64, head_size=32, vocab=65536, seed=seed), path)
    return path


def replica_folders(root: Path) -> Path:
    """Folders a and b with one model's file (copied: the same weights at another path) and
    c with other weights under the same name: three replicas' model folders."""
    for name in "abc":
        (root / name).mkdir()
    write_model(root / "a" / "tiny.st")
    shutil.copy(root / "a" / "tiny.st", root / "b" / "tiny.st")
    write_model(root / "c" / "tiny.st", seed=4)
    return root


def write_state(path: Path, seed: int = 5) -> Path:
    write_safetensors(make_state(2, 64, 32, seed=seed), path, dtype="fp32")
    return path


def config_for(directory: Path, extra: str = "", *, model: str = "tiny.st", max_batch: int = 4,
               ping_interval: float = 0.05, max_body_bytes: int = 1 << 20, listen_extra: str = "") -> Config:
    text = f"""
[model]
path = "{directory}"
name = "{model}"
max_batch = {max_batch}
token_chunk_size = 64
cache_bytes = 67108864
max_tokens_limit = 4096
{extra}
[listen]
ip = "127.0.0.1"
port = 0
max_body_bytes = {max_body_bytes}
ping_interval = {ping_interval}
{listen_extra}
"""
    if "[responses]" not in extra:  # stored responses never land in a shared models folder
        text += f'[responses]\npath = "{tempfile.mkdtemp(prefix="responses-")}"\n'
    if "[cache]" not in extra:  # nor the prefix cache's disk tier: no test finds another's states
        text += f'[cache]\npath = "{tempfile.mkdtemp(prefix="prefix-cache-")}"\n'

    return parse_config(text, source="test-config.toml", base_dir=directory)


class ServerThread:
    """`with ServerThread(config) as server:` — listening, model loaded (or load ended).

    `builder` replaces the middleware's model builder (a test can hold a load back);
    with `wait_for_load=False` the block starts as soon as the server listens."""

    def __init__(self, config: Config, *, builder=None, wait_for_load: bool = True):
        self.config = config
        self.builder = builder
        self.wait_for_load = wait_for_load
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever, name="test-http", daemon=True)
        self.middleware: Middleware | None = None
        self.running: RunningServer | None = None

    def __enter__(self) -> Self:
        self.thread.start()
        self.middleware = Middleware() if self.builder is None else Middleware(self.builder)
        self.running = self.call(start_server(self.config, self.middleware))
        if self.wait_for_load:
            # The first load in a fresh checkout compiles the kernels (numba's cache is cold).
            self.call(self.running.serving.wait_idle(), LOAD_TIMEOUT)
        return self

    def __exit__(self, *exc) -> None:
        self.call(self.running.stop())
        self.middleware.close()
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(TIMEOUT)
        self.loop.close()

    def call(self, coroutine, timeout: float = TIMEOUT):
        """Run a coroutine on the server's loop and wait for its result."""
        return asyncio.run_coroutine_threadsafe(coroutine, self.loop).result(timeout)

    @property
    def serving(self):
        return self.running.serving

    @property
    def port(self) -> int:
        return self.running.port

    @property
    def base_url(self) -> str:
        return f"{self.running.url}/v1"

    # ------------------------------------------------------------------ raw HTTP

    def request(self, method: str, path: str, body: bytes | str | dict | list | None = None,
                headers: dict | None = None, chunked: bool = False) -> RawResponse:
        if isinstance(body, (dict, list)):
            body = json.dumps(body)
        if isinstance(body, str):
            body = body.encode()
        if chunked:  # no Content-Length: the server learns the size only by reading
            body = iter([body[i : i + 65536] for i in range(0, len(body), 65536)])
        conn = http.client.HTTPConnection("127.0.0.1", self.port, timeout=TIMEOUT)
        try:
            hdrs = {"Content-Type": "application/json", **(headers or {})}
            conn.request(method, path, body=body, headers=hdrs, encode_chunked=chunked)
            resp = conn.getresponse()
            return RawResponse(resp.status, dict(resp.getheaders()), resp.read())
        finally:
            conn.close()

    def post(self, path: str, body, **kw) -> RawResponse:
        return self.request("POST", path, body, **kw)

    def get(self, path: str, **kw) -> RawResponse:
        return self.request("GET", path, **kw)


class InterceptedGenerates:
    """Records every Generate the HTTP tier sends; with `hold`, keeps them until `release()`."""

    def __init__(self, serving, hold: bool = False):
        self.middleware, self.hold = serving.middleware, hold
        self.sent: list = []
        self.arrived = threading.Event()
        self._send = self.middleware.send

    def __enter__(self):
        def send(message):
            if isinstance(message, Generate):
                self.sent.append(message)
                self.arrived.set()
                if self.hold:
                    return
            self._send(message)

        self.middleware.send = send
        return self

    def release(self):
        self.middleware.send = self._send
        for message in self.sent:
            self._send(message)

    def __exit__(self, *exc):
        self.middleware.send = self._send


class RawResponse:
    def __init__(self, status: int, headers: dict, body: bytes):
        self.status, self.headers, self.body = status, {k.lower(): v for k, v in headers.items()}, body

    def json(self):
        return json.loads(self.body)

    def events(self) -> list[str]:
        return sse_events(self.body)

    def chunks(self) -> list[dict]:
        """The JSON payloads of a stream that ended with [DONE] (asserted)."""
        events = payloads(self.events())  # pings may come anywhere when the machine is busy
        assert events and events[-1] == "[DONE]", events[-3:]
        return [json.loads(e) for e in events[:-1]]

    def __repr__(self) -> str:
        return f"<{self.status} {self.body[:300]!r}>"


def sse_events(raw: bytes) -> list[str]:
    """Strict SSE framing: events separated by a blank line, each `data: …` lines or `:` comments."""
    text = raw.decode("utf-8")
    assert text.endswith("\n\n"), f"stream does not end with a blank line: {text[-40:]!r}"
    events = []
    for block in text[:-2].split("\n\n"):
        lines = block.split("\n")
        if all(line.startswith(":") for line in lines):
            events.append(":" + lines[0][1:].strip())  # a comment (ping); kept so tests can see it
            continue
        assert all(line.startswith("data: ") for line in lines), block
        events.append("\n".join(line[6:] for line in lines))
    return events


def payloads(events: list[str]) -> list[str]:
    return [e for e in events if not e.startswith(":")]


# ---------------------------------------------------------------------------------- schemas


def _with_nullable(node):
    """OpenAPI 3.0's `nullable: true` (which OpenAI's 3.1 document still uses in places) as
    JSON Schema: the same schema, or null. Without this the validator would ignore the
    keyword and reject the nulls the spec allows; nothing else is changed."""
    if isinstance(node, list):
        return [_with_nullable(x) for x in node]
    if not isinstance(node, dict):
        return node
    node = {k: _with_nullable(v) for k, v in node.items()}
    if node.pop("nullable", False) is True:
        return {"anyOf": [node, {"type": "null"}]}
    return node


class OpenAISchemas:
    def __init__(self, path: Path = SPEC_PATH):
        document = yaml.safe_load(path.read_text())
        self.components = _with_nullable(document["components"])
        self._validators: dict[str, jsonschema.Validator] = {}

    def validator(self, name: str) -> jsonschema.Validator:
        if name not in self._validators:
            assert name in self.components["schemas"], name
            root = {"$ref": f"#/components/schemas/{name}", "components": self.components}
            self._validators[name] = jsonschema.Draft202012Validator(root)
        return self._validators[name]

    def check(self, name: str, instance) -> None:
        errors = sorted(self.validator(name).iter_errors(instance), key=lambda e: list(e.path))
        assert not errors, f"{name}: " + "; ".join(
            f"{'/'.join(map(str, e.path))}: {e.message[:200]}" for e in errors[:5])


SCHEMAS = OpenAISchemas()
