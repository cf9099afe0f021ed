"""The built wheel, installed with pip into a new virtualenv, serves from any folder: the
demo model, its vocabulary and the web page travel inside the package (setup.py puts them
in ai00_like/_assets), and `ai00-like-app` started in an empty folder writes a config that
points at them, answers a chat through the openai SDK and stops cleanly on SIGTERM."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import httpx
import openai
import pytest
from process_helpers import free_port, wait_until_healthy

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def installed(tmp_path_factory) -> Path:
    """A new virtualenv with the wheel built from this checkout installed: its bin/ folder."""
    folder = tmp_path_factory.mktemp("wheel")
    built = subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", str(ROOT), "-w", str(folder)],
                           capture_output=True, text=True, timeout=600)
    assert built.returncode == 0, built.stderr[-2000:]
    (wheel,) = folder.glob("ai00_like-*.whl")
    subprocess.run([sys.executable, "-m", "venv", str(folder / "venv")], check=True, timeout=300)
    done = subprocess.run([str(folder / "venv" / "bin" / "pip"), "install", "-q", "--disable-pip-version-check",
                           str(wheel)], capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stderr[-2000:]
    return folder / "venv" / "bin"


def test_the_installed_wheel_serves_the_demo_from_any_folder(installed, tmp_path):
    port = free_port()
    env = dict(os.environ, PATH=f"{installed}:/usr/bin:/bin", PYTHONUNBUFFERED="1")
    env.pop("VIRTUAL_ENV", None)
    proc = subprocess.Popen([str(installed / "ai00-like-app"), "--no-browser", "-p", str(port)], cwd=tmp_path, env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        wait_until_healthy(port, proc, 180, tmp_path / "ai00-like.log")  # the first start compiles numba's kernels
        client = openai.OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="unused", max_retries=0)
        reply = client.chat.completions.create(model="demo", max_tokens=8, messages=[{"role": "user", "content": "Hi"}])
        assert reply.choices[0].message.content
        page = httpx.get(f"http://127.0.0.1:{port}/", timeout=10)
        assert page.status_code == 200 and "<html" in page.text
    finally:
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(60) == 0
    assert "_assets/models" in (tmp_path / "config.toml").read_text()  # the package's own files
