"""The web page in assets/www, driven in Debian's Chromium (headless) through Playwright.

Needs `apt-get install chromium` (/usr/bin/chromium) and `pip install playwright`; never
`playwright install` (no downloaded browser builds). A screenshot of each page goes to the
test's tmp_path/screenshots.
"""

from __future__ import annotations

import shutil
import time
from pathlib import Path

import pytest
from api_helpers import ServerThread, config_for

CHROMIUM = "/usr/bin/chromium"
WWW = Path(__file__).resolve().parents[1] / "assets" / "www"
DEMO = Path(__file__).resolve().parents[1] / "assets" / "models"
ADMIN_KEY = "page-admin-key"

if not Path(CHROMIUM).exists():
    pytest.skip(f"browser tests need Debian's Chromium at {CHROMIUM} (apt-get install chromium)",
                allow_module_level=True)
sync_api = pytest.importorskip("playwright.sync_api", reason="browser tests need Playwright (pip install playwright)")

WAIT_MS = 60_000


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """The bundled demo model, and a copy of it to load from the Models page."""
    d = tmp_path_factory.mktemp("web")
    shutil.copy(DEMO / "demo.st", d / "demo.st")
    shutil.copy(DEMO / "demo.st", d / "demo-copy.st")
    return d


@pytest.fixture(scope="module")
def server(model_dir):
    extra = f'[tokenizer]\npath = "{DEMO / "demo_vocab.txt"}"\n[web]\npath = "{WWW}"\n'
    config = config_for(model_dir, extra, model="demo.st", max_batch=2, listen_extra=f'admin_key = "{ADMIN_KEY}"')
    with ServerThread(config) as s:
        assert s.serving.model is not None, s.serving.last_error
        yield s


@pytest.fixture(scope="module")
def browser():
    with sync_api.sync_playwright() as p:
        b = p.chromium.launch(executable_path=CHROMIUM, args=[
            "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
            "--disable-component-update", "--disable-sync", "--no-first-run"])
        yield b
        b.close()


@pytest.fixture
def page(browser, server, tmp_path):
    context = browser.new_context(viewport={"width": 1280, "height": 800})
    page = context.new_page()
    page.set_default_timeout(WAIT_MS)
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(f"http://127.0.0.1:{server.port}/")
    page.shots = tmp_path / "screenshots"  # type: ignore[attr-defined]
    page.shots.mkdir()
    yield page
    context.close()
    assert not errors, errors


def set_setting(page, name: str, value: str) -> None:
    field = page.locator(f'[data-settings="chat"] [name="{name}"]')
    field.fill(value)
    field.dispatch_event("change")


def wait_idle(server) -> None:
    """Until the server runs no generation (the stopped one was cancelled)."""
    deadline = time.monotonic() + WAIT_MS / 1000
    while time.monotonic() < deadline:
        if server.get("/api/models/info").json()["running"] == 0:
            return
        time.sleep(0.05)
    raise AssertionError("the server still runs a generation")


def test_page_is_served_at_root(server):
    r = server.get("/")
    assert r.status == 200 and b"<title>ai00-like</title>" in r.body


def test_chat_streams_a_reply(page, server):
    set_setting(page, "max_tokens", "24")
    page.fill("#chat-input", "Hello there")
    page.click("#chat-send")
    # While it streams, the reply grows and Stop is enabled; at the end it is marked done.
    page.locator(".msg.assistant.done").wait_for()
    reply = page.locator(".msg.assistant").inner_text()
    assert reply.strip()
    assert page.locator(".msg.user").inner_text() == "Hello there"
    assert page.is_disabled("#chat-stop") and page.is_enabled("#chat-send")
    # The conversation is kept in the browser: it is there after a reload.
    page.reload()
    assert page.locator(".msg.user").inner_text() == "Hello there"
    assert page.locator(".msg.assistant").inner_text() == reply
    page.screenshot(path=page.shots / "chat.png")


def test_stop_a_reply_mid_stream(page, server):
    set_setting(page, "max_tokens", "4000")
    set_setting(page, "stop", "@@never@@")  # so the reply cannot end on its own before Stop
    page.fill("#chat-input", "Tell me a long story")
    page.click("#chat-send")
    page.wait_for_function("document.querySelector('.msg.assistant.streaming')?.textContent.length > 20")
    page.click("#chat-stop")
    page.locator(".msg.assistant.done").wait_for()
    wait_idle(server)
    text = page.locator(".msg.assistant").inner_text()
    print("stopped reply:", len(text), "chars")
    # 4000 tokens of the demo model's word vocabulary would be some 20000 characters.
    assert 20 < len(text) < 4000
    assert page.evaluate("JSON.parse(localStorage.getItem('ai00like.conversations'))[0].messages[1].content") \
        .strip() == text.strip()
    assert page.is_enabled("#chat-send")


def test_continuation_and_status_pages(page, server):
    page.click("#tab-continue")
    page.fill("#continue-text", "In the beginning")
    page.fill('[data-settings="continue"] [name="max_tokens"]', "16")
    page.dispatch_event('[data-settings="continue"] [name="max_tokens"]', "change")
    page.click("#continue-go")
    page.wait_for_function("document.querySelector('#continue-text').value.length > 'In the beginning'.length "
                           "&& !document.querySelector('#continue-go').disabled")
    page.screenshot(path=page.shots / "continue.png")
    page.click("#tab-status")
    page.locator("#status-live", has_text="live").wait_for()
    assert "demo" in page.locator("#status-view").inner_text()
    assert float(page.locator(".stat", has_text="last reply").locator("b").inner_text()) > 0
    page.screenshot(path=page.shots / "status.png")


def test_load_a_model_from_the_models_page(page, server):
    dialogs: list[str] = []

    def answer(dialog):
        dialogs.append(dialog.message)
        dialog.accept(ADMIN_KEY)

    page.on("dialog", answer)
    page.click("#tab-models")
    page.locator('#models-table tr.loaded[data-path="demo.st"]').wait_for()
    page.select_option("#load-model", "demo-copy.st")
    page.fill('#load-form [name="max_batch"]', "2")
    page.click("#load-button")
    page.locator("#load-result", has_text="Loaded demo-copy").wait_for()
    page.locator('#models-table tr.loaded[data-path="demo-copy.st"]').wait_for()
    assert "demo-copy.st" in page.locator("#loaded-info").inner_text()
    assert server.get("/api/models/info").json()["reload"]["model_path"] == "demo-copy.st"
    assert len(dialogs) == 1 and "admin key" in dialogs[0]  # asked once, then kept
    page.screenshot(path=page.shots / "models.png")
    page.click("#unload-button")
    page.locator("#load-result", has_text="Unloaded").wait_for()
    assert len(dialogs) == 1
    assert page.locator("#loaded-info").inner_text() == "No model is loaded."
    # Put the first model back for the other tests.
    page.select_option("#load-model", "demo.st")
    page.click("#load-button")
    page.locator("#load-result", has_text="Loaded demo.").wait_for()


def test_markdown_is_rendered_and_html_is_escaped(page):
    html = page.evaluate("""renderMarkdown('**bold** and `code` <img src=x onerror="window.pwned=1">\\n\\n'
        + '- one\\n- two\\n\\n```\\n<script>window.pwned=1</script>\\n```\\n[x](javascript:alert(1))')""")
    page.set_content(f"<div id=out>{html}</div>")
    out = page.locator("#out")
    assert out.locator("strong").inner_text() == "bold"
    assert out.locator("li").count() == 2
    assert out.locator("img, script, a").count() == 0
    assert "<img src=x" in out.inner_text() and "<script>" in out.locator("pre").inner_text()
    assert page.evaluate("window.pwned") is None


def test_regenerate_and_several_conversations(page, server):
    set_setting(page, "max_tokens", "8")
    page.fill("#chat-input", "First")
    page.click("#chat-send")
    page.locator(".msg.assistant.done").wait_for()
    page.click("#chat-regenerate")
    page.locator(".msg.assistant.done").wait_for()
    assert page.locator(".msg.assistant").count() == 1 and page.locator(".msg.user").count() == 1
    page.click("#chat-new")
    assert page.locator(".msg").count() == 0
    page.fill("#chat-input", "Second")
    page.click("#chat-send")
    page.locator(".msg.assistant.done").wait_for()
    assert page.locator("#conversations li").count() == 2
    page.locator("#conversations li", has_text="First").click()
    assert page.locator(".msg.user").inner_text() == "First"
    page.reload()
    assert page.locator("#conversations li").count() == 2


def test_the_api_key_is_asked_for_once(browser, model_dir, tmp_path):
    extra = f'[tokenizer]\npath = "{DEMO / "demo_vocab.txt"}"\n[web]\npath = "{WWW}"\n'
    config = config_for(model_dir, extra, model="demo.st", max_batch=2, listen_extra='api_keys = ["page-api-key"]')
    with ServerThread(config) as server:
        context = browser.new_context()
        page = context.new_page()
        page.set_default_timeout(WAIT_MS)
        dialogs: list[str] = []
        page.on("dialog", lambda d: (dialogs.append(d.message), d.accept("page-api-key")))
        page.goto(f"http://127.0.0.1:{server.port}/")
        page.locator("#model-badge", has_text="demo").wait_for()
        set_setting(page, "max_tokens", "8")
        page.fill("#chat-input", "Hello")
        page.click("#chat-send")
        page.locator(".msg.assistant.done").wait_for()
        assert page.locator(".msg.assistant .error").count() == 0
        assert page.locator(".msg.assistant").inner_text().strip()
        assert len(dialogs) == 1 and "API key" in dialogs[0]
        context.close()
