"""The web page in assets/www, driven in Debian's Chromium (headless) through Playwright.

Needs `apt-get install chromium` (/usr/bin/chromium) and `pip install playwright`; never
`playwright install` (no downloaded browser builds). A screenshot of each page goes to the
test's tmp_path/screenshots.
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import shutil
import time
import zipfile
from pathlib import Path

import msgspec
import numpy as np
import pytest
from api_helpers import ServerThread, config_for
from browser_helpers import playwright_or_skip
from safetensors.numpy import save_file

from ai00_like.config import parse_config
from ai00_like.rwkv.formats.safetensors import write_safetensors
from ai00_like.rwkv.synthetic import make_state

WWW = Path(__file__).resolve().parents[2] / "assets" / "www"
DEMO = Path(__file__).resolve().parents[2] / "assets" / "models"
ADMIN_KEY = "page-admin-key"

playwright_or_skip()

WAIT_MS = 60_000


APP_CONFIG = '[model]\npath = "../models"\nname = "demo.st"\nmax_batch = 2\n'


def zip_bytes(entries: dict[str, bytes]) -> bytes:
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        for name, data in entries.items():
            z.writestr(name, data)
    return buf.getvalue()


def write_demo_lora(path: Path) -> None:
    """A rank-2 LoRA of the demo model's (D256) first key matrix, in Ai00's names
    (lora.0 = A transposed [in, r], lora.1 = B [out, r]), as tests/engine/test_loader.py writes them."""
    a, b = np.zeros((256, 2), np.float32), np.zeros((256, 2), np.float32)
    a[3, 0], a[5, 1], b[7, 0], b[9, 1] = 1.0, 2.0, 3.0, -1.0
    save_file({"blocks.0.att.key.lora.0": a, "blocks.0.att.key.lora.1": b}, str(path))


def write_demo_state(path: Path) -> None:
    """A state-tuning file for the demo model (v7, 4 layers, D256, head size 64)."""
    write_safetensors(make_state(4, 256, 64, seed=11), path, dtype="fp32")


@pytest.fixture(scope="module")
def base_dir(tmp_path_factory):
    """A server folder: assets/models with the bundled demo model, a copy of it to load from
    the Models page, a LoRA and a state file for it, and two archives; assets/configs with a
    config to edit."""
    base = tmp_path_factory.mktemp("web")
    models = base / "assets" / "models"
    models.mkdir(parents=True)
    shutil.copy(DEMO / "demo.st", models / "demo.st")
    shutil.copy(DEMO / "demo.st", models / "demo-copy.st")
    write_demo_lora(models / "demo.lora")
    write_demo_state(models / "demo.state")
    (models / "pack.zip").write_bytes(zip_bytes({"pack/a.txt": b"alpha", "b.txt": b"beta"}))
    (models / "slip.zip").write_bytes(zip_bytes({"ok.txt": b"1", "../../evil.txt": b"evil"}))
    (base / "assets" / "configs").mkdir()
    (base / "assets" / "configs" / "app.toml").write_text(APP_CONFIG)
    return base


@pytest.fixture(scope="module")
def model_dir(base_dir):
    return base_dir / "assets" / "models"


@pytest.fixture(scope="module")
def server(base_dir):
    config = parse_config(f"""
[model]
path = "assets/models"
name = "demo.st"
max_batch = 2
token_chunk_size = 64
max_tokens_limit = 4096
[tokenizer]
path = "{DEMO / "demo_vocab.txt"}"
[web]
path = "{WWW}"
[listen]
ip = "127.0.0.1"
port = 0
ping_interval = 0.05
admin_key = "{ADMIN_KEY}"
""", source="test-config.toml", base_dir=base_dir)
    with ServerThread(config) as s:
        assert s.serving.model is not None, s.serving.last_error
        yield s


@contextlib.contextmanager
def open_page(browser, server, tmp_path):
    """The server's page in a fresh browser context; screenshots go to tmp_path/screenshots.
    A script error in the page fails the test."""
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


@pytest.fixture
def page(browser, server, tmp_path):
    with open_page(browser, server, tmp_path) as page:
        yield page


def set_setting(page, name: str, value: str) -> None:
    field = page.locator(f'[data-settings="chat"] [name="{name}"]')
    field.fill(value)
    field.dispatch_event("change")


def endless_replies(page) -> None:
    """The page's chat requests, with end-of-text barred (`logit_bias`), so a reply streams
    until Stop: the demo model ends its turns with end-of-text, as its training text does."""
    def add_bias(route):
        body = json.loads(route.request.post_data)
        route.continue_(post_data=json.dumps({**body, "logit_bias": {"0": -100}}))

    page.route("**/v1/chat/completions", add_bias)


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
    endless_replies(page)
    set_setting(page, "max_tokens", "4000")
    set_setting(page, "stop", "@@never@@")  # so the reply cannot end on its own before Stop
    page.fill("#chat-input", "Tell me a long story")
    page.click("#chat-send")
    page.wait_for_function("document.querySelector('.msg.assistant.streaming')?.textContent.length > 20")
    page.click("#chat-stop")
    page.locator(".msg.assistant.done").wait_for()
    wait_idle(server)
    # 4000 tokens of the demo model's word vocabulary would be some 20000 characters. The
    # demo model streams some 700 tokens a second, and on a busy machine the click reaches
    # the server a second or two after the first words (a CI run saw 4409 characters).
    streamed = page.locator(".msg.assistant").evaluate("e => e.textContent")  # thinking included
    print("stopped reply:", len(streamed), "chars")
    assert 20 < len(streamed) < 10000
    # The demo model may open with a thought, shown folded under the reply: the reply is the rest.
    page.locator(".msg.assistant").evaluate("e => e.querySelector('details.thinking')?.remove()")
    text = page.locator(".msg.assistant").inner_text()
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
    page.locator("#load-result", has_text="Loaded demo:").wait_for()


def test_markdown_is_rendered_and_html_is_escaped(page):
    # The page's modules keep their functions to themselves: import the one under test.
    html = page.evaluate("""async () => (await import('/markdown.js')).renderMarkdown(
        '**bold** and `code` <img src=x onerror="window.pwned=1">\\n\\n'
        + '- one\\n- two\\n\\n```\\n<script>window.pwned=1</script>\\n```\\n[x](javascript:alert(1))')""")
    # Into the live page (replacing the page would leave its timers without their elements).
    page.evaluate("(html) => { const d = document.createElement('div'); d.id = 'out'; d.innerHTML = html; "
                  "document.body.appendChild(d); }", html)
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


# ------------------------------------------------------------------------------ sampler settings

STATE_ID = "5d7c2a1e-7e57-4000-8000-00000000beef"


def settings_field(page, which: str, name: str):
    return page.locator(f'[data-settings="{which}"] [name="{name}"]')


def field_names(page, which: str) -> list[str]:
    return page.eval_on_selector_all(f'[data-settings="{which}"] input[type=number]', "els => els.map(e => e.name)")


def test_sampler_stop_words_and_initial_state_are_sent(browser, model_dir, tmp_path):
    """Mirostat with its fields, stop words and a configured [[state]] in the chat; Typical in
    the continuation: what the page sends, and that the server streams a reply to it."""
    extra = f"""[tokenizer]
path = "{DEMO / "demo_vocab.txt"}"
[web]
path = "{WWW}"
[[state]]
path = "demo.state"
name = "tuned"
id = "{STATE_ID}"
"""
    with ServerThread(config_for(model_dir, extra, model="demo.st", max_batch=2)) as server, \
            open_page(browser, server, tmp_path) as page:
        assert server.serving.model is not None, server.serving.last_error
        # The configured state is offered once the page has the model's status.
        state = settings_field(page, "chat", "state")
        state.locator(f'option[value="{STATE_ID}"]', has_text="tuned").wait_for(state="attached")
        page.select_option('[data-settings="chat"] [name="sampler"]', "Mirostat")
        assert field_names(page, "chat") == ["tau", "rate", "max_tokens"]
        set_setting(page, "tau", "2.5")
        set_setting(page, "rate", "0.25")
        set_setting(page, "max_tokens", "24")
        set_setting(page, "stop", "User:\n\\n\\n")  # a typed "\n" is a newline
        state.select_option(STATE_ID)
        page.fill("#chat-input", "Hello there")
        with page.expect_response("**/v1/chat/completions") as response:
            page.click("#chat-send")
        body = last_request_body(response.value.request)
        assert body["sampler_override"] == {"type": "Mirostat", "tau": 2.5, "rate": 0.25}
        assert body["stop"] == ["User:", "\n\n"]
        assert body["state"] == STATE_ID
        assert body["max_tokens"] == 24 and body["stream"] is True
        assert body["messages"] == [{"role": "user", "content": "Hello there"}]
        assert response.value.status == 200
        assert response.value.headers["content-type"].startswith("text/event-stream")
        page.locator(".msg.assistant.done").wait_for()
        assert page.locator(".msg.assistant .error").count() == 0
        assert page.locator(".msg.assistant").inner_text().strip()
        reply = page.evaluate("JSON.parse(localStorage.getItem('ai00like.conversations'))[0].messages[1].content")
        assert reply.strip() and "User:" not in reply and "\n\n" not in reply.strip()
        page.screenshot(path=page.shots / "chat-mirostat-state.png")
        # The settings are kept in the browser.
        page.reload()
        state.locator(f'option[value="{STATE_ID}"]').wait_for(state="attached")
        assert page.input_value('[data-settings="chat"] [name="sampler"]') == "Mirostat"
        assert settings_field(page, "chat", "tau").input_value() == "2.5"
        assert state.input_value() == STATE_ID
        # A model without that state: the page shows the choice it still sends, and the
        # server's refusal; "(none)" sends no state.
        assert server.post("/admin/models/load", {"model_path": "demo.st"}).status == 200
        page.reload()
        page.locator("#model-badge", has_text="demo").wait_for()
        assert state.input_value() == STATE_ID
        assert "not loaded" in state.locator("option:checked").inner_text()
        with page.expect_request("**/v1/chat/completions") as request:
            page.click("#chat-regenerate")
        assert last_request_body(request.value)["state"] == STATE_ID
        page.locator(".msg.assistant.failed .error", has_text="HTTP 400: Unknown state").wait_for()
        state.select_option("")
        with page.expect_request("**/v1/chat/completions") as request:
            page.click("#chat-regenerate")
        assert "state" not in last_request_body(request.value)
        page.locator(".msg.assistant.done").wait_for()
        assert page.locator(".msg.assistant .error").count() == 0

        # Typical in the continuation, whose settings are its own (no stop words, no state).
        page.click("#tab-continue")
        page.select_option('[data-settings="continue"] [name="sampler"]', "Typical")
        assert field_names(page, "continue")[:3] == ["tau", "top_k", "temperature"]
        for name, value in [("tau", "0.8"), ("top_k", "20"), ("temperature", "0.7"), ("max_tokens", "12")]:
            settings_field(page, "continue", name).fill(value)
            settings_field(page, "continue", name).dispatch_event("change")
        prompt = "In the beginning"
        page.fill("#continue-text", prompt)
        with page.expect_request("**/v1/completions") as request:
            page.click("#continue-go")
        body = last_request_body(request.value)
        assert body["sampler_override"] == {"type": "Typical", "tau": 0.8, "top_k": 20, "temperature": 0.7,
                                            "presence_penalty": 0.3, "frequency_penalty": 0.3,
                                            "penalty_decay": 0.99654026}
        assert "stop" not in body and "state" not in body and body["prompt"] == prompt
        page.wait_for_function(f"document.querySelector('#continue-text').value.length > {len(prompt)} "
                               "&& !document.querySelector('#continue-go').disabled")
        assert not page.inner_text("#continue-error")
        page.screenshot(path=page.shots / "continue-typical.png")


# ------------------------------------------------------------------------------ status


def stat(page, key: str) -> str:
    return page.locator(f'.stat[data-key="{key}"] b').inner_text()


def test_status_shows_live_tokens_per_second_and_cache_hits(page, server):
    endless_replies(page)
    set_setting(page, "max_tokens", "4000")
    set_setting(page, "stop", "@@never@@")
    page.fill("#chat-input", "Tell me of the kings of old")
    page.click("#chat-send")
    page.wait_for_function("document.querySelector('.msg.assistant.streaming')?.textContent.length > 5")
    page.click("#tab-status")
    # While the reply streams, the server's own rate shows, and one slot is busy.
    page.wait_for_function("Number(document.querySelector('.stat[data-key=generated_rate] b')?.textContent) > 0")
    page.wait_for_function("document.querySelector('.stat[data-key=slots] b')?.textContent.startsWith('1 /')")
    # The chart gains a point a second.
    page.wait_for_function("document.querySelector('#status-chart polyline')?.points.numberOfItems >= 3 "
                           "&& Number(document.querySelector('#status-peak').textContent) > 0")
    page.screenshot(path=page.shots / "status-streaming.png")
    page.click("#tab-chat")
    # The demo model may have ended its reply by now (end-of-text); a disabled button ignores it.
    page.evaluate("document.querySelector('#chat-stop').click()")
    page.locator(".msg.assistant.done").wait_for()
    wait_idle(server)

    # The same prompt twice: the second one's prefix comes from the state cache.
    page.click("#tab-status")
    hits_before = int(stat(page, "cache_hits").split("/")[0].replace(",", ""))
    page.click("#tab-continue")
    page.fill('[data-settings="continue"] [name="max_tokens"]', "4")
    page.dispatch_event('[data-settings="continue"] [name="max_tokens"]', "change")
    prompt = "And the LORD spake unto Moses, saying, Speak unto the children of Israel"
    for _ in range(2):
        page.fill("#continue-text", prompt)
        page.click("#continue-go")
        page.wait_for_function("document.querySelector('#continue-text').value.length > "
                               f"{len(prompt)} && !document.querySelector('#continue-go').disabled")
    page.click("#tab-status")
    page.wait_for_function(f"parseInt(document.querySelector('.stat[data-key=cache_hits] b').textContent"
                           f".replace(/,/g, '')) > {hits_before}")
    assert int(stat(page, "cache_hit_tokens").replace(",", "")) > 0
    info = server.get("/api/models/info").json()
    assert info["cache_hits"] > hits_before
    assert "%" in stat(page, "cache_hits")


# ------------------------------------------------------------------------------ grammar fields


def last_request_body(request) -> dict:
    return json.loads(request.post_data)


def test_grammar_and_response_format_are_sent_and_refusals_shown(page, server):
    grammar = 'start::="yes"|"no";'
    page.fill('[data-settings="chat"] [name="bnf_schema"]', grammar)
    page.dispatch_event('[data-settings="chat"] [name="bnf_schema"]', "change")
    page.select_option('[data-settings="chat"] [name="response_format"]', "json_schema")
    # A schema that is not JSON is caught in the page: nothing is sent.
    sent: list[str] = []
    page.on("request", lambda r: sent.append(r.url) if "/chat/completions" in r.url else None)
    set_setting(page, "json_schema", '{"type": ')
    page.fill("#chat-input", "Yes or no?")
    page.click("#chat-send")
    page.locator(".msg.assistant.failed .error", has_text="not JSON").wait_for()
    assert not sent
    # A schema the server refuses (no such JSON type): the page shows the server's own message.
    set_setting(page, "json_schema", '{"type": "no-such-type"}')
    with page.expect_request("**/v1/chat/completions") as request:
        page.click("#chat-regenerate")
    body = last_request_body(request.value)
    assert body["bnf_schema"] == grammar
    assert body["response_format"] == {"type": "json_schema", "json_schema": {
        "name": "schema", "schema": {"type": "no-such-type"}, "strict": True}}
    answer = server.post("/v1/chat/completions", body)
    assert answer.status == 400
    message = answer.json()["error"]["message"]
    error = page.locator(".msg.assistant.failed .error")
    error.wait_for()
    assert error.inner_text() == f"HTTP 400: {message}"
    page.screenshot(path=page.shots / "chat-refused.png")

    # Continuation sends the grammar too, and shows a refusal in the page.
    page.click("#tab-continue")
    settings = '[data-settings="continue"]'
    page.fill(f"{settings} [name=bnf_schema]", grammar)
    page.dispatch_event(f"{settings} [name=bnf_schema]", "change")
    page.fill(f"{settings} [name=max_tokens]", "100000000")
    page.dispatch_event(f"{settings} [name=max_tokens]", "change")
    page.fill("#continue-text", "Answer yes or no:")
    with page.expect_request("**/v1/completions") as request:
        page.click("#continue-go")
    body = last_request_body(request.value)
    assert body["bnf_schema"] == grammar and "response_format" not in body
    answer = server.post("/v1/completions", body)
    assert answer.status == 400
    page.locator("#continue-error", has_text=answer.json()["error"]["message"]).wait_for()
    assert page.input_value("#continue-text") == "Answer yes or no:"
    page.screenshot(path=page.shots / "continue-refused.png")


# ------------------------------------------------------------------------------ models: save, load options


def answer_dialogs(page, *keys: str) -> list[str]:
    """Answers each prompt for a key with the next of `keys` (the last one from then on)."""
    asked: list[str] = []

    def answer(dialog):
        asked.append(dialog.message)
        dialog.accept(keys[min(len(asked), len(keys)) - 1])

    page.on("dialog", answer)
    return asked


def test_models_page_saves_the_model_and_sends_load_options(page, server, model_dir):
    asked = answer_dialogs(page, ADMIN_KEY)
    page.click("#tab-models")
    page.locator('#models-table tr.loaded[data-path="demo.st"]').wait_for()
    # The save box offers Ai00's kind of name: <model>-<quant_type as the status spells it>_<quant>-<time>.
    assert page.input_value("#save-path").lower().startswith("demo-none_0-")
    page.fill("#save-path", "saved-demo.st")
    page.click("#save-button")
    page.locator("#save-result", has_text="Saved saved-demo.st").wait_for()
    row = page.locator('#models-table tr[data-path="saved-demo.st"]')
    row.wait_for()
    assert "L4" in row.inner_text() or "4 layers" in row.inner_text()
    assert (model_dir / "saved-demo.st").is_file()
    # Saving never overwrites: the server's 409 is shown.
    page.click("#save-button")
    page.locator("#save-result.error", has_text="HTTP 409").wait_for()
    assert "exists already" in page.inner_text("#save-result")
    assert len(asked) == 1

    # Device, precision and quantisation go to the server as Ai00's fields; its answer shows.
    page.select_option("#load-model", "demo-copy.st")
    page.select_option('#load-form [name="device"]', "cpu")
    page.select_option('#load-form [name="precision"]', "bf16")
    page.select_option('#load-form [name="quant_type"]', "Int8")
    page.fill('#load-form [name="quant"]', "2")
    page.check('#load-form [name="quant_head"]')
    with page.expect_response("**/admin/models/load") as response:
        page.click("#load-button")
    body = last_request_body(response.value.request)
    assert (body["model_path"], body["device"], body["precision"], body["quant_type"], body["quant"],
            body["quant_head"]) == ("demo-copy.st", "cpu", "bf16", "Int8", 2, True)
    if response.value.ok:  # the fp16 file kept as bf16, as asked, its head Int8
        page.locator("#load-result", has_text="Loaded demo-copy: device cpu, bf16").wait_for()
        page.locator("#load-result", has_text="head int8").wait_for()
        assert response.value.json()["reload"]["quant_head"] is True
    else:
        message = response.value.json()["error"]["message"]
        page.locator("#load-result.error", has_text=message).wait_for()
    page.screenshot(path=page.shots / "models-options.png")
    # Back to the plain demo model for the other tests.
    page.select_option('#load-form [name="quant_type"]', "None")
    page.fill('#load-form [name="quant"]', "0")
    page.uncheck('#load-form [name="quant_head"]')
    page.select_option('#load-form [name="precision"]', "auto")
    page.select_option("#load-model", "demo.st")
    page.click("#load-button")
    page.locator("#load-result", has_text="Loaded demo:").wait_for()


def test_models_page_loads_with_loras_states_and_chunk_size(page, server):
    asked = answer_dialogs(page, ADMIN_KEY)
    page.click("#tab-models")
    page.locator('#models-table tr.loaded[data-path="demo.st"]').wait_for()
    # The LoRA and the state file of the models folder are offered; model files are not.
    lora = page.locator("#load-loras label", has_text="demo.lora")
    state = page.locator("#load-states label", has_text="demo.state")
    assert page.locator("#load-loras label").all_inner_texts() == [lora.inner_text()]
    assert page.locator("#load-states label").all_inner_texts() == [state.inner_text()]
    models = page.locator("#load-model option").all_inner_texts()
    assert "demo.st" in models and "demo.lora" not in models and "demo.state" not in models
    page.select_option("#load-model", "demo-copy.st")
    page.fill('#load-form [name="max_batch"]', "1")
    page.fill('#load-form [name="token_chunk_size"]', "32")
    lora.locator("input[type=checkbox]").check()
    lora.locator("input[type=number]").fill("2.5")
    state.locator("input[type=checkbox]").check()
    state.locator("input[type=radio]").check()
    # The first call asks for the admin key (401), the page sends it again with the key.
    with page.expect_response(lambda r: r.url.endswith("/admin/models/load") and r.status != 401) as response:
        page.click("#load-button")
    assert len(asked) == 1
    body = last_request_body(response.value.request)
    assert body["model_path"] == "demo-copy.st"
    assert (body["max_batch"], body["token_chunk_size"]) == (1, 32)
    assert body["lora"] == [{"path": "demo.lora", "alpha": 2.5}]
    assert body["state"] == [{"path": "demo.state", "default": True}]
    assert response.value.ok, response.value.text()
    page.locator("#load-result", has_text="Loaded demo-copy").wait_for()
    page.locator('#models-table tr.loaded[data-path="demo-copy.st"]').wait_for()
    loaded = page.inner_text("#loaded-info")
    assert "Token chunk size: 32" in loaded and "Max batch: 1" in loaded
    assert "LoRAs: demo.lora ×2.5" in loaded and "States: demo.state (default)" in loaded
    reload = server.get("/api/models/info").json()["reload"]
    assert reload["lora"] == [{"path": "demo.lora", "alpha": 2.5}]
    assert [(s["path"], s["default"]) for s in reload["state"]] == [("demo.state", True)]
    assert (reload["model_path"], reload["token_chunk_size"], reload["max_batch"]) == ("demo-copy.st", 32, 1)
    page.screenshot(path=page.shots / "models-lora-state.png")
    # The loaded state is now offered in the chat's settings, marked as the default.
    page.locator('[data-settings="chat"] [name="state"] option', has_text="demo.state (default)") \
        .wait_for(state="attached")
    # The status page: one slot, nothing waiting.
    page.click("#tab-status")
    page.locator('.stat[data-key="slots"] b', has_text="0 / 1").wait_for()
    assert stat(page, "queue") == "0"
    page.screenshot(path=page.shots / "status-lora-state.png")

    # Back to the plain demo model for the other tests.
    page.click("#tab-models")
    lora.locator("input[type=checkbox]").uncheck()
    state.locator("input[type=checkbox]").uncheck()
    page.fill('#load-form [name="max_batch"]', "2")
    page.fill('#load-form [name="token_chunk_size"]', "")
    page.select_option("#load-model", "demo.st")
    with page.expect_request("**/admin/models/load") as request:
        page.click("#load-button")
    assert last_request_body(request.value)["lora"] == [] and last_request_body(request.value)["state"] == []
    page.locator("#load-result", has_text="Loaded demo:").wait_for()
    assert server.get("/api/models/info").json()["states"] == []


# ------------------------------------------------------------------------------ files


def test_files_page_browses_unzips_and_edits_a_config(page, server, base_dir):
    asked = answer_dialogs(page, ADMIN_KEY)
    page.click("#tab-files")
    # The models folder is listed first, with model info; archives offer to be unpacked.
    page.locator('#files-table tr[data-path="assets/models/demo.st"]', has_text="layers").wait_for()
    assert page.locator("#files-root option").all_inner_texts()[:2] == ["assets/models", "assets/configs"]
    page.check("#files-sha")
    page.click("#files-list")
    pack = page.locator('#files-table tr[data-path="assets/models/pack.zip"]')
    digest = hashlib.sha256((base_dir / "assets/models/pack.zip").read_bytes()).hexdigest()
    pack.locator(f"text={digest}").wait_for()

    pack.locator("button", has_text="Unzip").click()
    assert page.input_value("#unzip-output") == "assets/unzip/pack"
    page.click("#unzip-button")
    page.locator("#unzip-result", has_text="Unpacked 2 files").wait_for()
    assert (base_dir / "assets/unzip/pack/pack/a.txt").read_text() == "alpha"
    # An archive with an entry that would land outside is refused whole; nothing is written.
    page.locator('#files-table tr[data-path="assets/models/slip.zip"] button').click()
    page.click("#unzip-button")
    page.locator("#unzip-result.error", has_text="HTTP 403").wait_for()
    assert "outside" in page.inner_text("#unzip-result")
    assert not (base_dir / "assets/unzip/slip").exists() and not (base_dir / "evil.txt").exists()
    # A sub-folder that climbs out is refused by the server, and the page says why.
    page.fill("#files-sub", "../..")
    page.click("#files-list")
    page.locator("#files-error", has_text="HTTP 403").wait_for()
    assert page.locator("#files-table tbody tr").count() == 0
    page.screenshot(path=page.shots / "files-refused.png")

    # The config: listed in its folder, loaded into the editor, validated before it is saved.
    page.fill("#files-sub", "")
    page.select_option("#files-root", "assets/configs")
    page.locator('#files-table tr[data-path="assets/configs/app.toml"] button', has_text="Edit").click()
    page.locator("#config-result", has_text="valid config").wait_for()
    assert page.input_value("#config-text") == APP_CONFIG
    config_file = base_dir / "assets/configs/app.toml"
    page.fill("#config-text", APP_CONFIG.replace("max_batch = 2", 'max_batch = "many"'))
    page.click("#config-save")
    page.locator("#config-result.error", has_text="HTTP 400").wait_for()
    assert "max_batch" in page.inner_text("#config-result")
    assert config_file.read_text() == APP_CONFIG  # the refused text was not written
    page.screenshot(path=page.shots / "files-config-refused.png")
    edited = APP_CONFIG.replace("max_batch = 2", "max_batch = 3")
    page.fill("#config-text", edited)
    page.click("#config-save")
    page.locator("#config-result", has_text="Saved assets/configs/app.toml").wait_for()
    assert config_file.read_text() == edited
    page.click("#config-load")
    page.locator("#config-result", has_text="valid config").wait_for()
    page.screenshot(path=page.shots / "files.png")
    assert len(asked) == 1


def test_a_wrong_admin_key_is_asked_for_again(page, server):
    asked = answer_dialogs(page, "wrong-key", ADMIN_KEY)
    page.click("#tab-files")
    page.locator("#files-error", has_text="Invalid admin key").wait_for()
    assert page.evaluate("localStorage.getItem('ai00like.adminKey')") == '""'
    page.click("#files-list")
    page.locator('#files-table tr[data-path="assets/models/demo.st"]').wait_for()
    assert len(asked) == 2 and all("admin key" in m for m in asked)
    assert page.evaluate("localStorage.getItem('ai00like.adminKey')") == json.dumps(ADMIN_KEY)


def test_constrained_replies_in_the_page(page, server):
    """The happy path of the grammar settings, once the server decodes under constraints."""
    request_schema = server.get("/api-docs/openapi.json").json()["components"]["schemas"]["ChatCompletionRequest"]
    assert "bnf_schema" in request_schema["properties"], "the OpenAPI document lists no bnf_schema"
    schema = {"type": "object", "properties": {"answer": {"type": "string", "enum": ["yes", "no"]}},
              "required": ["answer"], "additionalProperties": False}
    set_setting(page, "max_tokens", "64")
    page.select_option('[data-settings="chat"] [name="response_format"]', "json_schema")
    set_setting(page, "json_schema", json.dumps(schema))
    page.fill("#chat-input", "Is the sky blue? Answer in JSON.")
    page.click("#chat-send")
    page.locator(".msg.assistant.done").wait_for()
    assert json.loads(page.locator(".msg.assistant").inner_text())["answer"] in ("yes", "no")

    page.click("#tab-continue")
    settings = '[data-settings="continue"]'
    page.fill(f"{settings} [name=bnf_schema]", 'start::="yes"|"no";')
    page.dispatch_event(f"{settings} [name=bnf_schema]", "change")
    page.fill(f"{settings} [name=max_tokens]", "16")
    page.dispatch_event(f"{settings} [name=max_tokens]", "change")
    prompt = "Is the sky blue? Answer yes or no: "
    page.fill("#continue-text", prompt)
    page.click("#continue-go")
    page.wait_for_function(f"document.querySelector('#continue-text').value.length > {len(prompt)} "
                           "&& !document.querySelector('#continue-go').disabled")
    assert page.input_value("#continue-text")[len(prompt):] in ("yes", "no")
    assert not page.inner_text("#continue-error")


def test_think_control_and_the_thinking_folded_under_the_reply(page, server):
    """With a reasoning model loaded, the Think control sends reasoning_effort and the reply's
    thinking shows folded away under it; earlier thinking is not sent back."""
    spec = server.serving.model.spec
    server.call(server.serving.load(msgspec.structs.replace(spec, thinking="effort", reasoning_effort="none")))
    try:
        sent = []
        page.on("request", lambda r: sent.append(json.loads(r.post_data)) if r.url.endswith("/chat/completions")
                else None)
        page.select_option('[data-settings="chat"] [name="think"]', "low")
        page.fill("#chat-input", "What does Micah 6:8 say?")
        page.click("#chat-send")
        page.locator(".msg.assistant.done").wait_for()
        assert sent[-1]["reasoning_effort"] == "low"
        fold = page.locator(".msg.assistant details.thinking")
        assert not fold.evaluate("e => e.open")  # folded away
        fold.locator("summary").click()
        assert fold.locator("div").inner_text().strip()  # the demo model thinks before it answers
        assert "<think>" not in page.locator(".msg.assistant").inner_text()
        page.screenshot(path=page.shots / "chat-thinking.png")
        page.fill("#chat-input", "And then?")
        page.click("#chat-send")
        page.wait_for_function("document.querySelectorAll('.msg.assistant').length === 2 "
                               "&& document.querySelector('.msg.assistant.done')")
        assert all("reasoning" not in m and "<think>" not in m["content"] for m in sent[-1]["messages"])
    finally:
        server.call(server.serving.load(spec))


# ------------------------------------------------------------------------------ downloads


def test_a_model_downloads_with_a_live_bar_and_loads_in_one_click(browser, tmp_path, monkeypatch):
    from hub_helpers import StandInHub

    from api_helpers import write_model

    file = "rwkv7-g1d-0.1b-20260129-ctx8192.pth"  # the catalogue's rwkv7-g1-0.1b, here a small real model
    hub = StandInHub("BlinkDL/rwkv7-g1", file, write_model(tmp_path / "model.st").read_bytes())
    hub.slow = True
    monkeypatch.setenv("HF_ENDPOINT", hub.url)
    extra = f'[tokenizer]\npath = "{DEMO / "demo_vocab.txt"}"\n[web]\npath = "{WWW}"\n'
    with ServerThread(config_for(tmp_path / "models", extra, model=""), wait_for_load=False) as server, \
            open_page(browser, server, tmp_path) as page:
        page.click("#tab-models")
        row = page.locator('#download-table tr[data-alias="rwkv7-g1-0.1b"]')
        row.locator("button.download").click()
        row.locator("progress").wait_for()  # the live bar while it downloads
        page.screenshot(path=page.shots / "downloading.png")
        row.locator("button.load-downloaded").click()
        page.locator("#download-result", has_text="Loaded").wait_for()
        assert server.get("/api/models/info").json()["reload"]["model_path"] == file
        page.locator(f'#models-table tr[data-path="{file}"]').wait_for()  # the file list caught up
