"""Debian's Chromium, headless, through Playwright: how the browser tests start it."""

from __future__ import annotations

CHROMIUM = "/usr/bin/chromium"
# No sandbox (tests run as root), no GPU, and nothing that reaches beyond the loopback.
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", "--no-first-run"]


def launch(playwright):
    return playwright.chromium.launch(executable_path=CHROMIUM, args=ARGS)
