"""Fixtures of the system tier: whole processes (the command line, HAProxy, Redis, the wheel)
and Debian's Chromium. Every test here is marked `slow` (tests/conftest.py); `model_dir`,
a folder of the module's own with the tiny synthetic model, comes from tests/conftest.py."""

from __future__ import annotations

from pathlib import Path

import pytest
from browser_helpers import CHROMIUM, launch


@pytest.fixture(scope="module")
def browser():
    """Debian's Chromium, headless, through Playwright (browser_helpers.launch); the test is
    skipped where either is missing."""
    if not Path(CHROMIUM).exists():
        pytest.skip(f"browser tests need Debian's Chromium at {CHROMIUM} (apt-get install chromium)")
    sync_api = pytest.importorskip("playwright.sync_api",
                                   reason="browser tests need Playwright (pip install playwright)")
    with sync_api.sync_playwright() as p:
        b = launch(p)
        yield b
        b.close()
