"""The web page's Models tab with several served models, in Debian's Chromium through
Playwright: every model the server can serve is listed with its state, the memory budget
shows as a bar, and each model's Load, Unload and Pin/Unpin buttons act on the server.

The server serves tiny.st as [model] (loaded at start, pinned) and other.st, a second
synthetic file in the models folder, on demand.
"""

from __future__ import annotations

import contextlib
import re
import threading
from pathlib import Path

import pytest
from api_helpers import InterceptedGenerates, ServerThread, config_for, write_model
from browser_helpers import playwright_or_skip

WWW = Path(__file__).resolve().parents[2] / "assets" / "www"
ADMIN_KEY = "models-tab-admin-key"
WAIT_MS = 60_000
MIB = 2**20

sync_api = playwright_or_skip()
expect = sync_api.expect


@pytest.fixture(scope="module")
def server(model_dir):
    write_model(model_dir / "other.st", seed=7)
    extra = f'[server]\nmemory_budget = "4 GiB"\nmax_loaded_models = 3\n[web]\npath = "{WWW}"\n'
    with ServerThread(config_for(model_dir, extra, listen_extra=f'admin_key = "{ADMIN_KEY}"')) as s:
        assert s.serving.model is not None, s.serving.last_error
        yield s


@contextlib.contextmanager
def open_models_tab(browser, server, tmp_path):
    """The Models tab in a fresh browser context, the admin key given when asked; a script
    error in the page fails the test. Screenshots go to tmp_path/screenshots."""
    context = browser.new_context(viewport={"width": 1280, "height": 900})
    page = context.new_page()
    page.set_default_timeout(WAIT_MS)
    errors: list[str] = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.asked = []  # type: ignore[attr-defined]
    page.on("dialog", lambda d: (page.asked.append(d.message), d.accept(ADMIN_KEY)))
    page.goto(f"http://127.0.0.1:{server.port}/")
    page.click("#tab-models")
    page.shots = tmp_path / "screenshots"  # type: ignore[attr-defined]
    page.shots.mkdir()
    yield page
    context.close()
    assert not errors, errors


def row(page, model: str):
    return page.locator(f'#served-table tr[data-model="{model}"]')


def served(server, model: str) -> dict:
    return next(m for m in server.get("/api/models/info").json()["models"] if m["id"] == model)


def bar_used(page) -> int:
    return int(page.get_attribute("#budget-bar", "aria-valuenow"))


def test_every_served_model_is_listed_and_loads_pins_and_unloads(browser, server, tmp_path):
    with open_models_tab(browser, server, tmp_path) as page:
        tiny, other = row(page, "tiny"), row(page, "other")
        # Both models, with their state: [model] loaded and pinned, the folder's file not loaded.
        expect(tiny.locator("td.status")).to_have_text("loaded", timeout=WAIT_MS)
        expect(other.locator("td.status")).to_have_text("unloaded", timeout=WAIT_MS)
        expect(tiny.locator("td.pinned")).to_have_text("never (pinned)")
        expect(tiny.locator("td.slots")).to_have_text("0 / 4")
        expect(tiny.locator("td.memory")).to_have_text(re.compile(r"^\d[\d,]* MiB$"))
        expect(tiny.locator("td.idle")).to_have_text(re.compile(r"^\d+ (s|min)"))
        expect(other.locator("td.pinned")).to_have_text("after 5 min idle")
        expect(other.locator("td.slots")).to_have_text("–")
        expect(tiny.locator("button")).to_have_text(["Unload", "Unpin"])
        expect(other.locator("button")).to_have_text(["Load", "Pin"])
        # The budget: what [model] takes of 4 GiB, one of three models.
        expect(page.locator("#budget-text")).to_have_text(re.compile(r"of 4,096 MiB · 1 of 3 models loaded$"))
        used_before = bar_used(page)
        assert used_before == server.get("/api/models/info").json()["budget"]["used_bytes"] > 0
        page.screenshot(path=page.shots / "served-models.png")

        # Load: the model is loaded, its slots show, and the bar grows.
        other.locator("button[data-action=load]").click()
        expect(other.locator("td.status")).to_have_text("loaded", timeout=WAIT_MS)
        expect(page.locator("#served-result")).to_have_text(re.compile(r"^Loaded other \(\d[\d,]* MiB\)\.$"))
        expect(page.locator("#budget-text")).to_have_text(re.compile(r"· 2 of 3 models loaded$"))
        assert bar_used(page) > used_before
        assert bar_used(page) == server.get("/api/models/info").json()["budget"]["used_bytes"]
        expect(other.locator("td.slots")).to_have_text(re.compile(r"^0 / \d+$"))
        expect(other.locator("button")).to_have_text(["Unload", "Pin"])
        assert served(server, "other")["status"] == "loaded"
        # The card of the default model still describes tiny, not the one just loaded.
        expect(page.locator("#model-badge")).to_have_text("tiny")
        assert page.asked == [page.asked[0]] and "admin key" in page.asked[0]  # asked once, then kept

        # A request running on it: "in use" rather than an idle time.
        with InterceptedGenerates(server.serving, hold=True) as held:
            request = threading.Thread(target=server.post, args=(
                "/v1/completions", {"model": "other", "prompt": "Hi", "max_tokens": 2}), daemon=True)
            request.start()
            assert held.arrived.wait(WAIT_MS / 1000)
            expect(other.locator("td.idle")).to_have_text("in use", timeout=WAIT_MS)
            held.release()
            request.join(WAIT_MS / 1000)
        expect(other.locator("td.idle")).to_have_text(re.compile(r"^\d+ s$"), timeout=WAIT_MS)

        # Pin: shown pinned, and the server keeps it for good (keep_alive -1).
        other.locator("button[data-action=pin]").click()
        expect(other.locator("td.pinned")).to_have_text("never (pinned)", timeout=WAIT_MS)
        expect(other).to_have_class(re.compile(r"\bpinned\b"))
        expect(page.locator("#served-result")).to_have_text("Pinned other: it stays loaded.")
        assert served(server, "other")["keep_alive"] == -1
        expect(other.locator("button")).to_have_text(["Unload", "Unpin"])
        page.screenshot(path=page.shots / "served-models-pinned.png")
        # Unpin: unloaded again after five idle minutes.
        other.locator("button[data-action=unpin]").click()
        expect(other.locator("td.pinned")).to_have_text("after 5 min idle", timeout=WAIT_MS)
        assert served(server, "other")["keep_alive"] == 300

        # Unload: unloaded, the bar back where it was; tiny is untouched.
        other.locator("button[data-action=unload]").click()
        expect(other.locator("td.status")).to_have_text("unloaded", timeout=WAIT_MS)
        expect(page.locator("#served-result")).to_have_text("Unloaded other.")
        expect(page.locator("#budget-text")).to_have_text(re.compile(r"· 1 of 3 models loaded$"))
        assert bar_used(page) == used_before
        expect(other.locator("button")).to_have_text(["Load", "Pin"])
        expect(tiny.locator("td.status")).to_have_text("loaded")
        assert served(server, "other")["status"] == "unloaded"
        assert len(page.asked) == 1


def test_the_tab_follows_the_status_stream(browser, server, tmp_path):
    """A model loaded by someone else (here the API) shows up without a click or a refresh."""
    with open_models_tab(browser, server, tmp_path) as page:
        other = row(page, "other")
        expect(other.locator("td.status")).to_have_text("unloaded", timeout=WAIT_MS)
        r = server.post("/admin/models/load", {"model": "other"}, headers={"Authorization": f"Bearer {ADMIN_KEY}"})
        assert r.status == 200, r
        try:
            expect(other.locator("td.status")).to_have_text("loaded", timeout=WAIT_MS)
            expect(page.locator("#budget-text")).to_have_text(re.compile(r"· 2 of 3 models loaded$"))
        finally:
            r = server.post("/admin/models/unload", {"model": "other"},
                            headers={"Authorization": f"Bearer {ADMIN_KEY}"})
            assert r.status == 200, r
        expect(other.locator("td.status")).to_have_text("unloaded", timeout=WAIT_MS)


def test_a_budget_without_a_memory_cap(browser, server, tmp_path):
    """With no byte cap known (memory_bytes null) the bar says so; without a model cap it counts."""
    def no_cap(route):
        response = route.fetch()
        status = response.json()
        status["budget"] = {**status["budget"], "memory_bytes": None, "max_loaded_models": 0}
        route.fulfill(response=response, json=status)

    context = browser.new_context()
    try:
        page = context.new_page()
        page.set_default_timeout(WAIT_MS)
        page.route("**/api/models/state", lambda route: route.abort())  # only /api/models/info reports
        page.route("**/api/models/info", no_cap)
        page.goto(f"http://127.0.0.1:{server.port}/#models")
        expect(page.locator("#budget-text")).to_have_text(
            re.compile(r"^Memory: \d[\d,]* MiB used \(no memory cap\) · 1 model loaded$"), timeout=WAIT_MS)
        expect(page.locator("#budget-bar")).to_be_hidden()
        expect(row(page, "tiny").locator("td.status")).to_have_text("loaded")
        expect(row(page, "other").locator("td.status")).to_have_text("unloaded")
    finally:
        context.close()
