"""Open WebUI in front of the server, driven in Debian's Chromium through Playwright as a
person uses it, through each of its two kinds of connection: OpenAI's (GET /v1/models,
POST /v1/chat/completions) and Ollama's, its default (`OLLAMA_BASE_URL`: GET /api/tags,
POST /api/chat streamed as NDJSON). Its model picker lists every model the server serves,
and a chat with each one answers (its `model` field picks the model; one not loaded yet is
loaded by that request).

Opt-in (marked `open_webui`; the default run leaves it out): Open WebUI is a large install
(with what it needs, PyTorch among it: 2.9 GB with the CPU build of torch and some 4-6
minutes on a 2-core machine; 7.4 GB and 11 minutes with the CUDA build pip takes by
itself), far beyond what the suite may spend on each CI run.
scripts/open_webui_env.sh installs it in a virtualenv of its own; then

    scripts/open_webui_env.sh && .venv/bin/python -m pytest -m open_webui tests/system/test_open_webui.py

Once selected, a missing install is a failure, not a skip. OPEN_WEBUI_VENV names the
virtualenv (the script's default otherwise). Open WebUI runs offline, without logins,
with our server as its only (OpenAI) connection and its data in the test's tmp folder.
A screenshot of each step goes to the test's tmp_path/screenshots.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import time
from pathlib import Path

import pytest
from process_helpers import ServerProcess, free_port, http_get, metrics_of

pytestmark = pytest.mark.open_webui

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "assets" / "models"
VENV = Path(os.environ.get("OPEN_WEBUI_VENV")
            or Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "ai00-like" / "open-webui")
OPEN_WEBUI = VENV / "bin" / "open-webui"
MODELS = ["demo", "demo-two"]  # [model] served by its file's stem, and [[models]]' served_name

START_TIMEOUT = 300  # s: Open WebUI's first start creates its database (about a minute here)
WAIT_MS = 60_000  # the page's own steps
# A reply: Open WebUI sends its built-in tools' definitions with every chat (some 10,000
# tokens of prompt; tens of seconds of prefill on 2 cores), and a tool call takes a second
# request.
ANSWER_MS = 300_000

CONFIG = f"""
[model]
path = "{DEMO}"
name = "demo.st"
device = "cpu"
max_batch = 2
[[models]]
name = "demo.st"
served_name = "demo-two"
tokenizer = "{DEMO / "demo_vocab.txt"}"
device = "cpu"
max_batch = 2
[server]
serve_folder = false
[tokenizer]
path = "{DEMO / "demo_vocab.txt"}"
[responses]
path = "responses"
[listen]
ip = "127.0.0.1"
"""


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """`python -m ai00_like` serving the demo model under two names; "demo" is loaded at
    start, "demo-two" by the first request that names it."""
    with ServerProcess(tmp_path_factory.mktemp("ai00"), CONFIG, ready=r"model demo loaded|loading \S+ failed") as s:
        status, body = s.get("/v1/models")
        assert status == 200, body[:300]
        yield s


def connection(kind: str, server_port: int) -> dict[str, str]:
    """Our server as Open WebUI's one connection, of that kind."""
    if kind == "ollama":
        return {"OLLAMA_BASE_URL": f"http://127.0.0.1:{server_port}", "ENABLE_OLLAMA_API": "true",
                "ENABLE_OPENAI_API": "false"}
    return {"OPENAI_API_BASE_URL": f"http://127.0.0.1:{server_port}/v1", "OPENAI_API_KEY": "unused",
            "ENABLE_OPENAI_API": "true", "ENABLE_OLLAMA_API": "false"}


def open_webui_env(data_dir: Path, server_port: int, kind: str) -> dict[str, str]:
    """Our server as Open WebUI's one connection; no logins, nothing fetched from outside
    (no embedding model, no update check, no telemetry), no extra task requests (titles,
    tags, follow-ups), and the configuration from these variables alone."""
    return {
        **os.environ,
        "DATA_DIR": str(data_dir),
        "WEBUI_AUTH": "false",
        "WEBUI_SECRET_KEY": "open-webui-test-secret",
        **connection(kind, server_port),
        "ENABLE_PERSISTENT_CONFIG": "false",
        "OFFLINE_MODE": "true",
        "HF_HUB_OFFLINE": "1",
        "USE_SLIM_DOCKER": "true",  # no local embedding model: it would be downloaded
        "RAG_EMBEDDING_MODEL_AUTO_UPDATE": "false",
        "RAG_RERANKING_MODEL_AUTO_UPDATE": "false",
        "ENABLE_VERSION_UPDATE_CHECK": "false",
        "ENABLE_COMMUNITY_SHARING": "false",
        "ENABLE_TITLE_GENERATION": "false",
        "ENABLE_TAGS_GENERATION": "false",
        "ENABLE_FOLLOW_UP_GENERATION": "false",
        "ENABLE_AUTOCOMPLETE_GENERATION": "false",
        "ANONYMIZED_TELEMETRY": "false",
        "SCARF_NO_ANALYTICS": "true",
        "DO_NOT_TRACK": "true",
        "PYTHONUNBUFFERED": "1",
    }


@pytest.fixture(scope="module", params=["openai", "ollama"])
def open_webui(server, tmp_path_factory, request):
    """Open WebUI connected to our server as to OpenAI, then as to Ollama: its base URL."""
    with open_webui_at(server.port, tmp_path_factory, request.param) as url:
        yield url


@contextlib.contextmanager
def open_webui_at(server_port: int, tmp_path_factory, kind: str):
    """Open WebUI (`open-webui serve`) on a free loopback port, with our server on
    `server_port` as its one connection of `kind`: its base URL."""
    assert OPEN_WEBUI.exists(), (f"Open WebUI is not installed at {VENV} (scripts/open_webui_env.sh installs it; "
                                 "OPEN_WEBUI_VENV names another virtualenv)")
    folder = tmp_path_factory.mktemp("open-webui")
    port = free_port()
    log = folder / "open-webui.log"
    with log.open("w") as out:
        proc = subprocess.Popen([str(OPEN_WEBUI), "serve", "--host", "127.0.0.1", "--port", str(port)],
                                cwd=folder, env=open_webui_env(folder / "data", server_port, kind),
                                stdout=out, stderr=subprocess.STDOUT)
    try:
        started = time.monotonic()
        while http_status(port, "/health") != 200:
            assert proc.poll() is None, f"Open WebUI exited ({proc.returncode}): {log.read_text()[-3000:]}"
            assert time.monotonic() - started < START_TIMEOUT, \
                f"Open WebUI did not answer /health within {START_TIMEOUT} s: {log.read_text()[-3000:]}"
            time.sleep(0.5)
        print(f"Open WebUI answered after {time.monotonic() - started:.0f} s")
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        try:
            proc.wait(30)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(30)


def http_status(port: int, path: str) -> int | None:
    try:
        return http_get(port, path)[0]
    except OSError:
        return None


@contextlib.contextmanager
def open_page(browser, url: str, tmp_path: Path):
    """Open WebUI's page in a fresh browser context, signed in (it signs in by itself
    without logins), its "What's new" notes closed whenever they show."""
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    page = context.new_page()
    page.set_default_timeout(WAIT_MS)
    page.shots = tmp_path / "screenshots"  # type: ignore[attr-defined]
    page.shots.mkdir()
    whats_new = page.get_by_role("button", name="Okay, Let's Go!")
    page.add_locator_handler(whats_new, lambda: whats_new.click())
    page.goto(url)
    page.locator("#model-selector-model-button").wait_for()
    try:
        yield page
    finally:
        context.close()


def picker_options(page) -> list[str]:
    """Opens the model picker; the models it lists, in its order."""
    page.locator("#model-selector-model-button").click()
    options = page.locator('[role="option"][data-value]')
    options.first.wait_for()
    return [options.nth(i).get_attribute("data-value") for i in range(options.count())]


def finished(server, model: str) -> float:
    """How many requests for `model` the server has finished (its /metrics)."""
    return metrics_of(server.port).get(
        f'rwkv:e2e_request_latency_seconds_count{{model_name="{model}",replica=""}}', 0.0)


def test_the_model_picker_lists_every_served_model(browser, server, open_webui, tmp_path):
    status, body = server.get("/v1/models")
    served = [m["id"] for m in json.loads(body)["data"]]
    assert sorted(served) == sorted(MODELS)
    with open_page(browser, open_webui, tmp_path) as page:
        listed = picker_options(page)
        page.screenshot(path=page.shots / "picker.png")
    assert sorted(listed) == sorted(MODELS), listed


@pytest.mark.parametrize("model", MODELS)
def test_a_chat_with_each_model_answers(browser, server, open_webui, tmp_path, model):
    before = finished(server, model)
    with open_page(browser, open_webui, tmp_path) as page:
        assert model in picker_options(page)
        page.locator(f'[role="option"][data-value="{model}"]').click()
        assert page.locator("#model-selector-model-button").inner_text().strip() == model
        page.locator("#chat-input").click()
        page.keyboard.type("Hello, who are you?")
        page.keyboard.press("Enter")

        # The reply: its model's name, its text, and (once the stream has ended) its buttons.
        reply = page.locator('#messages-container div[id^="message-"]:has(.chat-assistant)').last
        try:
            reply.get_by_role("button", name="Regenerate").wait_for(timeout=ANSWER_MS)
        finally:
            page.screenshot(path=page.shots / f"chat-{model}.png")
        assert reply.locator("#response-message-model-name").inner_text().strip() == model
        text = " ".join(reply.locator(".chat-assistant .markdown-prose").all_inner_texts()).strip()
        print(f"{model} answered: {text!r}")
        assert text, reply.inner_text()
    assert finished(server, model) > before


def computed_and_total(port: int) -> tuple[float, float]:
    """(prompt tokens the model ran, prompt tokens of all requests) so far: the difference is
    what the prefix cache spared."""
    metrics = metrics_of(port)
    return metrics["rwkv:prompt_tokens_computed_total"], metrics["rwkv:prompt_tokens_total"]


def chat_once(browser, url: str, tmp_path: Path, text: str) -> None:
    """A new chat in Open WebUI's page with "demo", until its reply has ended."""
    with open_page(browser, url, tmp_path) as page:
        picker_options(page)
        page.locator('[role="option"][data-value="demo"]').click()
        page.locator("#chat-input").click()
        page.keyboard.type(text)
        page.keyboard.press("Enter")
        reply = page.locator('#messages-container div[id^="message-"]:has(.chat-assistant)').last
        reply.get_by_role("button", name="Regenerate").wait_for(timeout=ANSWER_MS)


def test_the_first_chat_after_a_restart_reads_the_tools_prompt_from_disk(browser, tmp_path_factory):
    """Open WebUI sends its tools' definitions with every chat. The server keeps the state
    after them in memory and, when it stops cleanly, on disk ([cache]): a restarted server's
    first chat reads them from there instead of running them through the model again."""
    folder, port = tmp_path_factory.mktemp("restart"), free_port()
    config = CONFIG.replace('[listen]', '[cache]\npath = "states"\n[listen]')
    with ServerProcess(folder, config, ready=r"model demo loaded|loading \S+ failed", port=port) as first, \
            open_webui_at(port, tmp_path_factory, "openai") as url:
        chat_once(browser, url, tmp_path_factory.mktemp("shots"), "Hello, who are you?")
        computed, total = computed_and_total(first.port)
        assert computed > 2000, (computed, total)  # the tools' prompt was read: thousands of tokens
        first.proc.terminate()  # a clean stop: the states go to disk
        assert first.proc.wait(60) == 0
        assert list((folder / "states").glob("*/*.pcs"))
        with ServerProcess(folder, config, ready=r"model demo loaded|loading \S+ failed", port=port) as second:
            chat_once(browser, url, tmp_path_factory.mktemp("shots"), "Hello again, what can you do?")
            computed, total = computed_and_total(second.port)
    print(f"after the restart: {computed:.0f} of {total:.0f} prompt tokens computed")
    assert total > 2000 and computed < total / 10, (computed, total)
