"""The web page's saved states (the States tab and the chat's Save as state / Attach a
document), in Debian's Chromium through Playwright against a real server with an API key:
a document read into a state that the chat then starts from, a conversation saved, listed,
started from, downloaded as a .st file, uploaded back and deleted.

The page holds the API key from the start (localStorage), so every call it makes, the
download and the upload included, must carry it to succeed.
"""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path

import pytest
from api_helpers import ServerThread
from browser_helpers import playwright_or_skip

from ai00_like.config import parse_config

WWW = Path(__file__).resolve().parents[2] / "assets" / "www"
DEMO = Path(__file__).resolve().parents[2] / "assets" / "models"
KEY = "states-page-key"
WAIT_MS = 60_000
DOCUMENT = "The lighthouse keeper's cat is called Marmalade.\nIt sleeps on the lamp room's warm floor.\n"

sync_api = playwright_or_skip()
expect = sync_api.expect


@pytest.fixture(scope="module")
def server(tmp_path_factory):
    """The demo model, with the response store (which keeps saved states) in the folder's
    `responses/` and one API key."""
    base = tmp_path_factory.mktemp("states-web")
    (base / "models").mkdir()
    shutil.copy(DEMO / "demo.st", base / "models" / "demo.st")
    config = parse_config(f"""
[model]
path = "models"
name = "demo.st"
max_batch = 2
[tokenizer]
path = "{DEMO / "demo_vocab.txt"}"
[web]
path = "{WWW}"
[listen]
ip = "127.0.0.1"
port = 0
api_keys = ["{KEY}"]
""", source="test-config.toml", base_dir=base)
    with ServerThread(config) as s:
        assert s.serving.model is not None, s.serving.last_error
        yield s


@pytest.fixture
def page(browser, server, tmp_path):
    """The page in a fresh browser context that already holds the API key; a script error
    in the page, or a prompt for the key, fails the test."""
    context = browser.new_context(viewport={"width": 1280, "height": 800}, accept_downloads=True)
    context.add_init_script(f"localStorage.setItem('ai00like.apiKey', {json.dumps(json.dumps(KEY))})")
    page = context.new_page()
    page.set_default_timeout(WAIT_MS)
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.on("dialog", lambda d: (errors.append("dialog: " + d.message), d.dismiss()))
    page.goto(f"http://127.0.0.1:{server.port}/")
    page.shots = tmp_path / "screenshots"  # type: ignore[attr-defined]
    page.shots.mkdir()
    yield page
    context.close()
    assert not errors, errors


def auth() -> dict:
    return {"Authorization": f"Bearer {KEY}"}


def saved_states(server) -> list[dict]:
    reply = server.get("/v1/saved_states", headers=auth())
    assert reply.status == 200, reply
    return reply.json()["data"]


def short_replies(page) -> None:
    field = page.locator('[data-settings="chat"] [name="max_tokens"]')
    field.fill("8")
    field.dispatch_event("change")


def send_and_capture(page, text: str) -> dict:
    """Sends `text` in the chat and waits for the reply to end well; the request's body."""
    replies = page.locator(".msg.assistant.done").count()
    with page.expect_request("**/v1/chat/completions") as request:
        page.fill("#chat-input", text)
        page.click("#chat-send")
    expect(page.locator(".msg.assistant.done")).to_have_count(replies + 1, timeout=WAIT_MS)
    expect(page.locator(".msg.assistant.failed")).to_have_count(0, timeout=WAIT_MS)
    return json.loads(request.value.post_data)


def state_row(page, name: str):
    return page.locator("#states-table tbody tr", has=page.locator("td:first-child", has_text=name))


def test_attach_a_document_and_chat_about_it(page, server, tmp_path):
    short_replies(page)
    doc = tmp_path / "keeper-notes.txt"
    doc.write_text(DOCUMENT)
    page.click("#chat-attach-open")
    page.set_input_files("#chat-attach-file", str(doc))
    expect(page.locator("#chat-attach-name")).to_have_value("keeper-notes.txt", timeout=WAIT_MS)
    expect(page.locator("#chat-attach-text")).to_have_value(DOCUMENT, timeout=WAIT_MS)
    page.click("#chat-attach-go")
    expect(page.locator("#chat-attached")).to_contain_text("keeper-notes.txt", timeout=WAIT_MS)
    expect(page.locator("#chat-attach")).to_be_hidden(timeout=WAIT_MS)
    # The server read the document into a state named after the file.
    made = [s for s in saved_states(server) if s["name"] == "keeper-notes.txt"]
    assert len(made) == 1 and made[0]["tokens"] > 10 and made[0]["bytes"] > 0, made
    state_id = made[0]["id"]
    # The chat starts from it: the request names it and carries only the conversation's
    # messages; the reply ends well, so the server found the state for this key.
    body = send_and_capture(page, "What is the cat called?")
    assert body["state"] == state_id
    assert body["messages"] == [{"role": "user", "content": "What is the cat called?"}]
    assert page.locator("#conversations li.active").get_attribute("class").split() == ["active", "from-state"]
    page.screenshot(path=page.shots / "attached.png")
    # The conversation keeps its state across a reload, and chats from it again.
    page.reload()
    expect(page.locator("#chat-attached")).to_contain_text("keeper-notes.txt", timeout=WAIT_MS)
    assert send_and_capture(page, "And where does it sleep?")["state"] == state_id
    # Detached, it chats from the model's own state again.
    page.click("#chat-detach")
    expect(page.locator("#chat-attached")).to_be_hidden(timeout=WAIT_MS)
    assert "state" not in send_and_capture(page, "Hello")


def test_pasted_text_attaches_and_a_refusal_is_shown(page, server):
    page.click("#chat-attach-open")
    page.click("#chat-attach-go")  # nothing to read yet: said, and nothing sent
    expect(page.locator("#chat-state-result.error")).to_contain_text("paste the document", timeout=WAIT_MS)
    page.fill("#chat-attach-text", "   ")
    page.click("#chat-attach-go")
    expect(page.locator("#chat-state-result.error")).to_contain_text("paste the document", timeout=WAIT_MS)
    # A name the server refuses (it must be printable): its own words, in the error style.
    page.fill("#chat-attach-text", DOCUMENT)
    page.fill("#chat-attach-name", "bad\tname")
    page.click("#chat-attach-go")
    expect(page.locator("#chat-state-result.error")).to_contain_text("HTTP 400", timeout=WAIT_MS)
    expect(page.locator("#chat-state-result.error")).to_contain_text("printable", timeout=WAIT_MS)
    expect(page.locator("#chat-attached")).to_be_hidden(timeout=WAIT_MS)
    page.fill("#chat-attach-name", "pasted notes")
    page.click("#chat-attach-go")
    expect(page.locator("#chat-attached")).to_contain_text("pasted notes", timeout=WAIT_MS)
    assert [s for s in saved_states(server) if s["name"] == "pasted notes"]


def test_save_list_start_download_upload_and_delete(page, server, tmp_path):
    short_replies(page)
    page.click("#chat-save-state")  # an empty conversation: refused in the page
    expect(page.locator("#chat-state-result.error")).to_contain_text("empty", timeout=WAIT_MS)
    send_and_capture(page, "Remember the word apple")
    page.click("#chat-save-state")
    saying = page.locator("#chat-state-result")
    expect(saying).to_contain_text('Saved as the state "Remember the word apple"', timeout=WAIT_MS)
    saved = [s for s in saved_states(server) if s["name"] == "Remember the word apple"]
    assert len(saved) == 1, saved
    state_id = saved[0]["id"]

    page.click("#tab-states")
    row = state_row(page, "Remember the word apple")
    expect(row).to_have_count(1, timeout=WAIT_MS)
    cells = row.locator("td").all_inner_texts()
    assert cells[1] == "demo" and cells[2] == str(saved[0]["tokens"]) and int(cells[2]) > 4
    page.screenshot(path=page.shots / "states.png")

    # Start a chat from it: a new conversation tied to the state, kept across a reload.
    row.get_by_role("button", name="Start a chat").click()
    expect(page.locator("#page-chat")).to_be_visible(timeout=WAIT_MS)
    expect(page.locator("#chat-attached")).to_contain_text("Remember the word apple", timeout=WAIT_MS)
    assert page.locator(".msg").count() == 0 and page.locator("#conversations li").count() == 2
    body = send_and_capture(page, "Which word?")
    assert body["state"] == state_id and len(body["messages"]) == 1
    page.reload()
    expect(page.locator("#chat-attached")).to_contain_text("Remember the word apple", timeout=WAIT_MS)

    # Download it: a safetensors file (an 8-byte little-endian header length, then JSON).
    page.click("#tab-states")
    with page.expect_download() as download:
        state_row(page, "Remember the word apple").get_by_role("button", name="Download").click()
    assert download.value.suggested_filename.endswith(".st")
    path = tmp_path / download.value.suggested_filename
    download.value.save_as(path)
    data = path.read_bytes()
    (header_len,) = struct.unpack("<Q", data[:8])
    header = json.loads(data[8:8 + header_len])
    assert header and len(data) > 8 + header_len, (len(data), header_len)

    # A file that is not a state: the server's refusal in the tab's error box.
    junk = tmp_path / "junk.st"
    junk.write_bytes(b"not a state file at all")
    page.set_input_files("#states-file", str(junk))
    page.click("#states-upload")
    expect(page.locator("#states-error")).to_contain_text("Not a state file", timeout=WAIT_MS)

    # Upload the download back under a new name: listed again.
    page.set_input_files("#states-file", str(path))
    page.fill("#states-name", "apple again")
    page.click("#states-upload")
    expect(state_row(page, "apple again")).to_have_count(1, timeout=WAIT_MS)
    expect(page.locator("#states-error")).to_be_empty(timeout=WAIT_MS)
    uploaded = [s for s in saved_states(server) if s["name"] == "apple again"]
    assert len(uploaded) == 1 and uploaded[0]["bytes"] == saved[0]["bytes"]

    # Delete: gone from the page and from the server.
    state_row(page, "apple again").get_by_role("button", name="Delete").click()
    expect(state_row(page, "apple again")).to_have_count(0, timeout=WAIT_MS)
    assert not [s for s in saved_states(server) if s["name"] == "apple again"]
    gone = server.get(f"/v1/saved_states/{uploaded[0]['id']}", headers=auth())
    assert gone.status == 404
    expect(state_row(page, "Remember the word apple")).to_have_count(1, timeout=WAIT_MS)
