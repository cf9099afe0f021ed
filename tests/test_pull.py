"""`ai00-like pull` against a stand-in of the Hugging Face hub on the loopback (HF_ENDPOINT):
the real huggingface_hub client, the real command. A pull lands whole and verified under its
final name; an interrupted one resumes where it stopped; a file that does not match the
hub's SHA-256, a missing file and an unreachable hub each end in one line and leave no file
under the final name; a different file already there is never overwritten."""

from __future__ import annotations

import asyncio
import hashlib
import os
import socket
import subprocess
import sys
import threading

import pytest
from aiohttp import web

from ai00_like.hub.catalogue import load_catalogue, resolve

pytest.importorskip("huggingface_hub")

REPO, FILE = "BlinkDL/rwkv7-g1", "rwkv7-g1d-0.1b-20260129-ctx8192.pth"  # the catalogue's rwkv7-g1-0.1b
# Larger than huggingface_hub's 10 MB write chunk, so a download broken off halfway leaves
# something on disk to resume from.
DATA = os.urandom(24_000_000)


class StandInHub:
    """The hub's `resolve` route for one file: HEAD gives its size, commit and SHA-256 (as an
    LFS file's ETag), GET its bytes from any Range start. `cut` breaks the next download off
    halfway (`cut` times: huggingface_hub retries a broken download itself, five times
    without progress); `corrupt` serves other bytes than the SHA-256 says."""

    def __init__(self):
        self.cut, self.corrupt = 0, False
        self.ranges: list[int] = []
        self.port = _free_port()
        self._loop = asyncio.new_event_loop()
        self._started = threading.Event()
        threading.Thread(target=self._run, daemon=True).start()
        assert self._started.wait(10)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def _run(self):
        asyncio.set_event_loop(self._loop)
        app = web.Application()
        app.router.add_route("*", "/{owner}/{repo}/resolve/{revision}/{path:.*}", self._resolve)
        runner = web.AppRunner(app)
        self._loop.run_until_complete(runner.setup())
        self._loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", self.port).start())
        self._started.set()
        self._loop.run_forever()

    async def _resolve(self, request: web.Request):
        if f"{request.match_info['owner']}/{request.match_info['repo']}" != REPO or request.match_info["path"] != FILE:
            return web.Response(status=404, headers={"X-Error-Code": "EntryNotFound"}, text="Entry not found")
        sha = hashlib.sha256(DATA).hexdigest()
        headers = {"ETag": f'"{sha}"', "X-Linked-Etag": f'"{sha}"', "X-Repo-Commit": "c0ffee" * 6 + "c0ff",
                   "X-Linked-Size": str(len(DATA)), "Accept-Ranges": "bytes"}
        if request.method == "HEAD":
            return web.Response(headers={**headers, "Content-Length": str(len(DATA))})
        start = int(request.headers.get("Range", "bytes=0-").split("=")[1].split("-")[0])
        self.ranges.append(start)
        body = bytes(255 - b for b in DATA) if self.corrupt else DATA
        response = web.StreamResponse(status=206 if start else 200,
                                      headers={**headers, "Content-Length": str(len(DATA) - start)})
        await response.prepare(request)
        if self.cut:
            self.cut -= 1
            await response.write(body[start : start + (len(DATA) - start) // 2])
            request.transport.close()  # the connection drops mid-file
            return response
        await response.write(body[start:])
        return response


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def hub():
    return StandInHub()


def pull(endpoint: str, name: str, folder, home) -> subprocess.CompletedProcess:
    env = dict(os.environ, HF_ENDPOINT=endpoint, HF_HOME=str(home), HF_HUB_DISABLE_TELEMETRY="1",
               HF_HUB_DISABLE_PROGRESS_BARS="1")
    return subprocess.run([sys.executable, "-m", "ai00_like", "pull", name, "--dir", str(folder)], env=env,
                          capture_output=True, text=True, timeout=120)


def test_the_alias_is_the_catalogues_file():
    assert resolve("rwkv7-g1-0.1b") == (REPO, FILE, next(m for m in load_catalogue() if m.file == FILE))
    assert resolve("someone/some-repo/sub/model.pth")[:2] == ("someone/some-repo", "sub/model.pth")


def test_a_pull_lands_whole_under_its_final_name(hub, tmp_path):
    done = pull(hub.url, "rwkv7-g1-0.1b", tmp_path / "models", tmp_path)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "models" / FILE).read_bytes() == DATA
    assert done.stdout.splitlines()[0] == str(tmp_path / "models" / FILE)
    assert 'thinking = "effort"' in done.stdout  # how to serve it
    assert sorted(p.name for p in (tmp_path / "models").iterdir()) == [FILE]  # nothing left behind
    again = pull(hub.url, "rwkv7-g1-0.1b", tmp_path / "models", tmp_path)  # already there: nothing fetched
    assert again.returncode == 0 and (tmp_path / "models" / FILE).read_bytes() == DATA


def test_a_broken_download_resumes_within_the_pull(hub, tmp_path):
    hub.cut, hub.ranges = 1, []
    done = pull(hub.url, f"{REPO}/{FILE}", tmp_path / "models", tmp_path)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "models" / FILE).read_bytes() == DATA
    assert hub.ranges[0] == 0 and hub.ranges[1] > 0  # resumed, not begun again


def test_a_failed_pull_resumes_on_the_next_one(hub, tmp_path):
    hub.cut, hub.ranges = 99, []
    failed = pull(hub.url, f"{REPO}/{FILE}", tmp_path / "models", tmp_path)
    assert failed.returncode == 2 and failed.stderr.count("\n") == 1 and "a retry resumes" in failed.stderr
    assert not (tmp_path / "models" / FILE).exists()  # nothing partial under the final name
    hub.cut, hub.ranges = 0, []
    done = pull(hub.url, f"{REPO}/{FILE}", tmp_path / "models", tmp_path)
    assert done.returncode == 0, done.stderr
    assert (tmp_path / "models" / FILE).read_bytes() == DATA
    assert hub.ranges[0] > 0  # from where the failed pull stopped


def test_a_file_that_does_not_match_its_checksum_is_removed(hub, tmp_path):
    hub.corrupt = True
    try:
        failed = pull(hub.url, "rwkv7-g1-0.1b", tmp_path / "models", tmp_path)
    finally:
        hub.corrupt = False
    assert failed.returncode == 2
    assert failed.stderr.count("\n") == 1 and "SHA-256" in failed.stderr
    assert not (tmp_path / "models" / FILE).exists()


@pytest.mark.parametrize("name, words", [
    (f"{REPO}/no-such-file.pth", "not on the hub"),
    ("no-such-alias", "unknown model"),
])
def test_what_is_not_there_is_one_line(hub, tmp_path, name, words):
    failed = pull(hub.url, name, tmp_path / "models", tmp_path)
    assert failed.returncode == 2 and failed.stderr.count("\n") == 1 and words in failed.stderr
    assert not (tmp_path / "models").exists() or not any((tmp_path / "models").iterdir())


def test_an_unreachable_hub_is_one_line(tmp_path):
    failed = pull(f"http://127.0.0.1:{_free_port()}", "rwkv7-g1-0.1b", tmp_path / "models", tmp_path)
    assert failed.returncode == 2 and failed.stderr.count("\n") == 1 and "could not download" in failed.stderr


def test_a_different_file_under_the_name_is_kept(hub, tmp_path):
    (tmp_path / "models").mkdir()
    mine = tmp_path / "models" / FILE
    mine.write_bytes(b"my own weights")
    failed = pull(hub.url, "rwkv7-g1-0.1b", tmp_path / "models", tmp_path)
    assert failed.returncode == 2 and "move it away" in failed.stderr
    assert mine.read_bytes() == b"my own weights"
