"""Debian's Chromium, headless, through Playwright: how the browser tests start it."""

from __future__ import annotations

from pathlib import Path

import pytest

CHROMIUM = "/usr/bin/chromium"
# No sandbox (tests run as root), no GPU, and nothing that reaches beyond the loopback.
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run"]


def launch(playwright):
    return playwright.chromium.launch(executable_path=CHROMIUM, args=ARGS)


def playwright_or_skip():
    """Playwright's sync API, or the calling test module skipped where Debian's Chromium or
    Playwright is missing (call it at the module's top level)."""
    if not Path(CHROMIUM).exists():
        pytest.skip(f"browser tests need Debian's Chromium at {CHROMIUM} (apt-get install chromium)",
                    allow_module_level=True)
    return pytest.importorskip("playwright.sync_api", reason="browser tests need Playwright (pip install playwright)")
