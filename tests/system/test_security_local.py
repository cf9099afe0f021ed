"""A web page the user opens must not be able to drive the server on 127.0.0.1.

Each attack is reproduced through real HTTP against a real server, and then in a real
browser (Debian's Chromium, headless, through Playwright) on a page served from another
loopback port: what the user would notice is checked — the status, and that nothing
happened (no download job, no file written, the model still loaded).
"""

from __future__ import annotations

import http.client
import json
import logging
import socket
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from api_helpers import TIMEOUT, RawResponse, ServerThread, config_for
from hub_helpers import StandInHub

from ai00_like.config import ConfigError, parse_config

EVIL = "https://evil.example"
CATALOGUE_REPO, CATALOGUE_FILE = "BlinkDL/rwkv7-g1", "rwkv7-g1d-0.1b-20260129-ctx8192.pth"  # rwkv7-g1-0.1b
CONFIG_TEXT = "# written by another site's page\n"


@pytest.fixture(scope="module")
def server(model_dir):
    """The default [listen] section: no keys, admin routes open on loopback, default CORS."""
    with ServerThread(config_for(model_dir)) as s:
        yield s


def send(port: int, method: str, path: str, headers: dict[str, str], body: bytes | None = None) -> RawResponse:
    """Exactly these headers (plus Host unless given): no default Content-Type."""
    conn = http.client.HTTPConnection("127.0.0.1", port, timeout=TIMEOUT)
    try:
        conn.request(method, path, body=body, headers={"Host": f"127.0.0.1:{port}", **headers})
        resp = conn.getresponse()
        return RawResponse(resp.status, dict(resp.getheaders()), resp.read())
    finally:
        conn.close()


def without_host(port: int, path: str) -> int:
    """An HTTP/1.0 request, which need not name a Host: its status."""
    with socket.create_connection(("127.0.0.1", port), timeout=TIMEOUT) as sock:
        sock.sendall(f"GET {path} HTTP/1.0\r\n\r\n".encode())
        answer = b""
        for _ in range(1000):  # bounded: the server closes an HTTP/1.0 connection after its answer
            chunk = sock.recv(65536)
            if not chunk:
                break
            answer += chunk
    return int(answer.split(b" ", 2)[1])


def save_body(name: str) -> bytes:
    return json.dumps({"path": name, "config": CONFIG_TEXT}).encode()


def code_of(r: RawResponse) -> str:
    return r.json()["error"]["code"]


# ------------------------------------------------------------------------------ Origin


def test_a_foreign_page_cannot_start_a_download(tmp_path, monkeypatch):
    hub = StandInHub(CATALOGUE_REPO, CATALOGUE_FILE, b"weights" * 1000)
    monkeypatch.setenv("HF_ENDPOINT", hub.url)  # a download that did start would stay on the loopback
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    with ServerThread(config_for(tmp_path, model="")) as server:
        body = json.dumps({"name": "rwkv7-g1-0.1b"}).encode()
        for origin in (EVIL, "null"):  # "null": a sandboxed frame or a file:// page
            r = send(server.port, "POST", "/admin/models/pull", {"Origin": origin, "Content-Type": "text/plain"}, body)
            assert r.status == 403 and code_of(r) == "origin_not_allowed", r
            assert "access-control-allow-origin" not in r.headers
        assert server.get("/admin/models/pull").json() == []  # no download was started
        # The same request from a client that is not a page (no Origin, JSON) does start one.
        started = server.post("/admin/models/pull", {"name": "rwkv7-g1-0.1b"})
        assert started.status == 200, started
        assert [job["name"] for job in server.get("/admin/models/pull").json()] == ["rwkv7-g1-0.1b"]
        for _ in range(300):  # let it end before the server does (a few KB from the loopback)
            if server.get("/admin/models/pull").json()[0]["status"] != "running":
                break
            time.sleep(0.1)


def test_a_foreign_page_cannot_write_a_config_file(server, model_dir):
    for origin in (EVIL, "null", f"http://127.0.0.1:{server.port + 1}"):  # another port is another site
        r = send(server.port, "POST", "/admin/files/config/save", {"Origin": origin, "Content-Type": "text/plain"},
                 save_body("planted.toml"))
        assert r.status == 403 and code_of(r) == "origin_not_allowed", (origin, r)
        assert not (model_dir / "planted.toml").exists()
    # Nor with a preflight (its JSON request would need one): refused before any handler.
    pre = send(server.port, "OPTIONS", "/admin/files/config/save", {
        "Origin": EVIL, "Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "content-type"})
    assert pre.status == 403 and "access-control-allow-origin" not in pre.headers


def test_another_sites_image_cannot_unload_the_model(model_dir):
    with ServerThread(config_for(model_dir)) as server:
        # An <img src=".../admin/models/unload"> carries no Origin; Fetch Metadata names its site.
        for site in ("cross-site", "same-site"):
            r = send(server.port, "GET", "/admin/models/unload", {"Sec-Fetch-Site": site})
            assert r.status == 403 and code_of(r) == "origin_not_allowed", r
            assert server.get("/api/models/info").json()["loaded"], "the model was unloaded"
        # The server's own page (same-origin) and a typed URL (none) still unload it.
        assert send(server.port, "GET", "/admin/models/unload", {"Sec-Fetch-Site": "same-origin"}).status == 200
        assert server.serving.model is None


def test_the_servers_own_page_may_call_it(server, model_dir):
    port = server.port
    own = [f"http://127.0.0.1:{port}", f"http://localhost:{port}", f"http://[::1]:{port}"]
    for n, origin in enumerate(own):
        name = f"own-{n}.toml"
        r = send(port, "POST", "/admin/files/config/save", {"Origin": origin, "Content-Type": "application/json"},
                 save_body(name))
        assert r.status == 200, (origin, r)
        assert r.headers["access-control-allow-origin"] == origin and "Origin" in r.headers["vary"]
        assert (model_dir / name).read_text() == CONFIG_TEXT
        (model_dir / name).unlink()
    # Opened as http://localhost:PORT/, the page's Origin is its Host: the same origin.
    r = send(port, "GET", "/v1/models", {"Host": f"localhost:{port}", "Origin": f"http://localhost:{port}"})
    assert r.status == 200 and r.headers["access-control-allow-origin"] == f"http://localhost:{port}"
    pre = send(port, "OPTIONS", "/v1/chat/completions", {
        "Origin": own[0], "Access-Control-Request-Method": "POST", "Access-Control-Request-Headers": "content-type"})
    assert pre.status == 204 and pre.headers["access-control-allow-origin"] == own[0]


def test_listed_origins_pass_and_null_only_when_listed(model_dir):
    listen = 'cors_origins = ["http://app.example:3000", "null"]'
    with ServerThread(config_for(model_dir, listen_extra=listen)) as server:
        for origin in ("http://app.example:3000", "null"):
            r = server.get("/v1/models", headers={"Origin": origin})
            assert r.status == 200 and r.headers["access-control-allow-origin"] == origin, r
        for origin in ("http://app.example:3001", "https://app.example:3000", EVIL):
            assert server.get("/v1/models", headers={"Origin": origin}).status == 403, origin


# ------------------------------------------------------------------------------ JSON-only admin bodies


def test_admin_bodies_must_be_json_even_from_an_allowed_origin(model_dir):
    # cors_origins = ["*"] lets any page past the Origin check: the body's type still guards.
    with ServerThread(config_for(model_dir, listen_extra='cors_origins = ["*"]')) as server:
        port = server.port
        for kind in ("text/plain", "application/x-www-form-urlencoded", "multipart/form-data; boundary=x"):
            r = send(port, "POST", "/admin/files/config/save", {"Origin": EVIL, "Content-Type": kind},
                     save_body("typed.toml"))
            assert r.status == 415 and code_of(r) == "unsupported_media_type", (kind, r)
        r = send(port, "POST", "/admin/files/config/save", {}, save_body("typed.toml"))  # no Content-Type
        assert r.status == 415, r
        assert not (model_dir / "typed.toml").exists()
        r = send(port, "POST", "/admin/files/config/save", {"Content-Type": "application/json; charset=utf-8"},
                 save_body("typed.toml"))
        assert r.status == 200, r
        (model_dir / "typed.toml").unlink()
        # A POST with no body at all (http.client sends Content-Length: 0) needs no type.
        assert send(port, "POST", "/admin/models/unload", {}).status == 200
        assert server.serving.model is None


# ------------------------------------------------------------------------------ Host (DNS rebinding)


def test_a_rebound_host_name_is_refused(server, model_dir):
    port = server.port
    # evil.example made to resolve to 127.0.0.1: its page is "same-origin" with the server.
    r = send(port, "POST", "/admin/files/config/save", {
        "Host": f"evil.example:{port}", "Origin": f"http://evil.example:{port}", "Content-Type": "application/json"},
        save_body("rebound.toml"))
    assert r.status == 403 and code_of(r) == "host_not_allowed", r
    assert "allowed_hosts" in r.json()["error"]["message"]
    assert not (model_dir / "rebound.toml").exists()
    assert send(port, "GET", "/v1/models", {"Host": f"evil.example:{port}"}).status == 403
    for host in (f"localhost:{port}", f"127.0.0.1:{port}", f"[::1]:{port}", f"app.localhost:{port}", "LocalHost"):
        assert send(port, "GET", "/v1/models", {"Host": host}).status == 200, host
    assert without_host(port, "/v1/models") == 200


def test_allowed_hosts_lets_a_named_host_through(model_dir):
    listen = 'allowed_hosts = ["ai.example.com", ".lan.example"]'
    with ServerThread(config_for(model_dir, listen_extra=listen)) as server:
        port = server.port
        for host in ("ai.example.com", f"ai.example.com:{port}", "lan.example", f"box.lan.example:{port}"):
            assert send(port, "GET", "/v1/models", {"Host": host}).status == 200, host
        for host in ("evil.example", "example.com", "notlan.example"):
            assert send(port, "GET", "/v1/models", {"Host": host}).status == 403, host
        # The page opened as http://ai.example.com:PORT/ is the server's own.
        own = f"http://ai.example.com:{port}"
        r = send(port, "GET", "/v1/models", {"Host": f"ai.example.com:{port}", "Origin": own})
        assert r.status == 200 and r.headers["access-control-allow-origin"] == own


def test_beyond_loopback_only_allowed_hosts_is_checked(model_dir):
    for listen, refused in (("", []), ('allowed_hosts = ["lb.example"]', ["other.example"])):
        with ServerThread(config_for(model_dir, listen_extra=listen)) as server:
            server.serving.listen_host = "0.0.0.0"  # as if started with --ip 0.0.0.0
            port = server.port
            for host in ("lb.example", "other.example", f"127.0.0.1:{port}", f"localhost:{port}"):
                expected = 403 if host in refused else 200
                assert send(port, "GET", "/v1/models", {"Host": host}).status == expected, (listen, host)


# ------------------------------------------------------------------------------ keys


def test_an_empty_bearer_token_is_no_key(model_dir):
    config = config_for(model_dir, listen_extra='api_keys = ["sk-user"]')
    config.listen.api_keys.append("")  # as a config built in code, past parse_config's check, could hold
    with ServerThread(config) as server:
        for header in ("Bearer ", "Bearer    ", "bearer"):
            r = server.get("/v1/models", headers={"Authorization": header})
            assert r.status == 401 and "Missing API key" in r.json()["error"]["message"], (header, r)
            assert server.get("/admin/files/roots", headers={"Authorization": header}).status == 401
        assert server.get("/v1/models", headers={"Authorization": "Bearer sk-user"}).status == 200


@pytest.mark.parametrize("listen, where, words", [
    ('api_keys = [""]', "listen.api_keys[0]", "empty key"),
    ('api_keys = ["sk-one", "   "]', "listen.api_keys[1]", "empty key"),
    ('api_keys = [" sk-one"]', "listen.api_keys[0]", "spaces"),
    ('admin_key = " "', "listen.admin_key", "empty key"),
    ('cors_origins = ["http://app.example/chat"]', "listen.cors_origins[0]", "must be an origin"),
    ('cors_origins = ["app.example"]', "listen.cors_origins[0]", "must be an origin"),
    ('allowed_hosts = ["ok.example", "http://ai.example"]', "listen.allowed_hosts[1]", "must be a host name"),
    ('allowed_hosts = ["ai.example:8080"]', "listen.allowed_hosts[0]", "without scheme or port"),
    ('allowed_hosts = [""]', "listen.allowed_hosts[0]", "must be a host name"),
])
def test_keys_origins_and_hosts_that_cannot_work_are_refused_at_start(listen, where, words):
    with pytest.raises(ConfigError) as e:
        parse_config(f"[listen]\n{listen}\n", source="my.toml")
    assert str(e.value).startswith(f"my.toml: {where}: ") and words in str(e.value)
    assert "\n" not in str(e.value)


def test_what_is_valid_stays_valid():
    listen = parse_config('[listen]\nadmin_key = ""\napi_keys = ["sk-1"]\ncors_origins = ["*", "null", '
                          '"http://localhost:3000/", "chrome-extension://abc"]\nallowed_hosts = ["*", ".example.com", '
                          '"[::1]", "10.0.0.2"]\n', source="my.toml").listen
    assert listen.admin_key == "" and listen.api_keys == ["sk-1"]
    defaults = parse_config("", source="my.toml").listen
    assert defaults.cors_origins == [] and defaults.allowed_hosts == []


# ------------------------------------------------------------------------------ in a real browser


OTHER_PAGE = b"<!doctype html><title>another site</title><p>nothing to see</p>"
ATTACK = """async (base) => {
  const out = {};
  const body = JSON.stringify({model: "tiny", messages: [{role: "user", content: "hi"}], max_tokens: 2});
  try {
    const r = await fetch(base + "/v1/chat/completions", {method: "POST", body,
                                                          headers: {"Content-Type": "application/json"}});
    out.chat = "read " + r.status;
  } catch (e) { out.chat = "blocked"; }
  try {
    const r = await fetch(base + "/v1/models");
    out.models = "read " + (await r.text());
  } catch (e) { out.models = "blocked"; }
  try {
    const saved = JSON.stringify({path: "browser.toml", config: "# written by another site's page\\n"});
    await fetch(base + "/admin/files/config/save", {method: "POST", mode: "no-cors", body: saved,
                                                     headers: {"Content-Type": "text/plain"}});
    out.save = "sent";
  } catch (e) { out.save = "failed: " + e; }
  await new Promise((done) => {
    const img = new Image();
    img.onload = img.onerror = () => done();
    img.src = base + "/admin/models/unload";
  });
  out.unload = "sent";
  return out;
}"""


class OtherSite:
    """A page on another loopback port: another origin, as any site the user visits."""

    def __init__(self):
        class Page(BaseHTTPRequestHandler):
            def do_GET(self):
                self.send_response(200)
                self.send_header("Content-Type", "text/html")
                self.send_header("Content-Length", str(len(OTHER_PAGE)))
                self.end_headers()
                self.wfile.write(OTHER_PAGE)

            def log_message(self, *args):
                pass

        self.httpd = ThreadingHTTPServer(("127.0.0.1", 0), Page)
        self.url = f"http://127.0.0.1:{self.httpd.server_address[1]}/"
        threading.Thread(target=self.httpd.serve_forever, daemon=True).start()

    def close(self):
        self.httpd.shutdown()
        self.httpd.server_close()


def run_in_page(browser, url: str, script: str, arg):
    context = browser.new_context()
    try:
        page = context.new_page()
        page.set_default_timeout(TIMEOUT * 1000)
        page.goto(url)
        return page.evaluate(script, arg)
    finally:
        context.close()


def test_a_page_from_another_origin_cannot_drive_the_server(browser, model_dir, caplog):
    www = model_dir / "www"
    www.mkdir(exist_ok=True)
    (www / "index.html").write_text("<!doctype html><title>the server's page</title>")
    site = OtherSite()
    try:
        with ServerThread(config_for(model_dir, f'[web]\npath = "{www}"\n')) as server, \
                caplog.at_level(logging.INFO, logger="ai00_like.access"):
            base = f"http://127.0.0.1:{server.port}"
            out = run_in_page(browser, site.url, ATTACK, base)
            assert out == {"chat": "blocked", "models": "blocked", "save": "sent", "unload": "sent"}, out
            assert not (model_dir / "browser.toml").exists()
            assert server.serving.model is not None, "another site's page unloaded the model"
            # The browser did send them, and the server refused each before its handler.
            logged = [json.loads(r.getMessage()) for r in caplog.records if r.name == "ai00_like.access"]
            refused = {(r["method"], r["route"]) for r in logged if r["status"] == 403}
            assert {("POST", "/admin/files/config/save"), ("GET", "/admin/models/unload"),
                    ("OPTIONS", "/v1/chat/completions")} <= refused, logged
            # The same calls from the server's own page: the chat and the models are read.
            own = run_in_page(browser, base + "/", ATTACK, base)
            assert own["chat"] == "read 200" and json.loads(own["models"].removeprefix("read "))["data"], own
    finally:
        site.close()
