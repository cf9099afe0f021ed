"""The double-click start (ai00_like/launcher.py), run as a user runs it: in a folder with
the release's assets/ and nothing else, it writes a default config.toml that serves the
demo model, logs to a file there, takes the next port when its own is taken (saying so),
opens the page in the default browser (here a stand-in $BROWSER that writes down the
address) unless told not to, and stops cleanly on SIGTERM."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest
from process_helpers import http_get, wait_until_healthy

ROOT = Path(__file__).resolve().parents[2]


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture
def release(tmp_path):
    """A folder as the release unzips: assets/ (linked here) and no config.toml."""
    (tmp_path / "assets").symlink_to(ROOT / "assets")
    return tmp_path


def start(folder: Path, *args: str, browser: Path | None = None) -> subprocess.Popen:
    env = dict(os.environ, PYTHONUNBUFFERED="1")
    if browser is not None:
        env["BROWSER"] = f"{browser} %s"
    return subprocess.Popen([sys.executable, "-m", "ai00_like.launcher", *args], cwd=folder, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)


def stop(proc: subprocess.Popen) -> int:
    proc.send_signal(signal.SIGTERM)
    return proc.wait(60)


def test_a_first_start_writes_its_config_serves_the_demo_and_logs(release):
    port = free_port()
    proc = start(release, "--no-browser", "-p", str(port))
    try:
        wait_until_healthy(port, proc, 120)
        reply = httpx.post(f"http://127.0.0.1:{port}/v1/chat/completions", timeout=60,
                           json={"model": "demo", "max_tokens": 8, "messages": [{"role": "user", "content": "Hi"}]})
        assert reply.status_code == 200 and reply.json()["choices"][0]["message"]["content"]
    finally:
        assert stop(proc) == 0
    assert 'name = "demo.st"' in (release / "config.toml").read_text()
    logged = (release / "ai00-like.log").read_text()
    assert "wrote a default" in logged and "loaded in" in logged and "/v1/chat/completions" in logged
    assert (release / ".cache" / "numba").is_dir()  # compiled kernels kept beside it


def test_a_taken_port_moves_to_the_next_and_the_browser_opens(release):
    browser = release / "browser.sh"
    browser.write_text(f'#!/bin/sh\necho "$1" >> "{release / "opened.txt"}"\n')
    browser.chmod(0o755)
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        proc = start(release, "-p", str(port), browser=browser)
        try:
            for _ in range(600):  # the page opens once the server answers
                if (release / "opened.txt").exists():
                    break
                assert proc.poll() is None, "the launcher exited"
                time.sleep(0.2)
            opened = (release / "opened.txt").read_text().split()
            assert len(opened) == 1 and opened[0].startswith("http://127.0.0.1:") and opened[0].endswith("/")
            moved = int(opened[0].rsplit(":", 1)[1].strip("/"))
            assert moved != port and httpx.get(f"http://127.0.0.1:{moved}/health", timeout=5).status_code in (200, 503)
        finally:
            assert stop(proc) == 0
    assert f"port {port} is taken; listening on {moved} instead" in (release / "ai00-like.log").read_text()


def test_open_browser_false_keeps_the_browser_shut(release):
    browser = release / "browser.sh"
    browser.write_text(f'#!/bin/sh\necho "$1" >> "{release / "opened.txt"}"\n')
    browser.chmod(0o755)
    port = free_port()
    (release / "config.toml").write_text(
        f'[model]\npath = "assets/models"\nname = "demo.st"\n[tokenizer]\npath = "assets/models/demo_vocab.txt"\n'
        f'[listen]\nport = {port}\n[web]\npath = "assets/www"\nopen_browser = false\n')
    proc = start(release, browser=browser)
    try:
        for _ in range(600):  # until the server answers (503 while the model loads), when the page would open
            try:
                http_get(port, "/health")
                break
            except OSError:
                assert proc.poll() is None, "the launcher exited"
                time.sleep(0.2)
        time.sleep(1)
    finally:
        assert stop(proc) == 0
    assert not (release / "opened.txt").exists()


def test_a_bad_config_is_one_logged_line_and_status_2(release):
    (release / "config.toml").write_text("[model]\nno_such_key = 1\n")
    proc = start(release, "--no-browser")
    assert proc.wait(60) == 2
    assert "no_such_key" in (release / "ai00-like.log").read_text()
