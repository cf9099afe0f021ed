"""A stand-in of the Hugging Face hub on the loopback, for `pull` and the page's downloads."""

from __future__ import annotations

import asyncio
import hashlib
import os
import subprocess
import sys
import threading

from aiohttp import web
from process_helpers import free_port


class StandInHub:
    """The hub's `resolve` route for one file: HEAD gives its size, commit and SHA-256 (as an
    LFS file's ETag), GET its bytes from any Range start. `cut` breaks the next download off
    halfway (`cut` times: huggingface_hub retries a broken download itself, five times
    without progress); `corrupt` serves other bytes than the SHA-256 says; `slow` takes two
    seconds over a download. `declared_size` is the size HEAD gives instead of the bytes'
    own (a file too large for the disk, without its bytes).

    `cdn` (another StandInHub with the same file, on another port: another origin) is where
    the file's bytes are sent from, as the real hub sends an LFS file's from a CDN: HEAD and
    GET answer 302 to it, HEAD with the file's headers (huggingface_hub reads the CDN's URL
    and the file's size and SHA-256 off that answer). `heard` lists each request as (method,
    path, headers with lower-case names), for tests of who was sent what."""

    def __init__(self, repo: str, file: str, data: bytes, *, cdn: StandInHub | None = None):
        self.repo, self.file, self.data = repo, file, data
        self.cdn = cdn
        self.cut, self.corrupt, self.slow = 0, False, False
        self.declared_size: int | None = None
        self.ranges: list[int] = []
        self.heard: list[tuple[str, str, dict[str, str]]] = []
        self.port = free_port()
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
        self.heard.append((request.method, request.path, {k.lower(): v for k, v in request.headers.items()}))
        repo = f"{request.match_info['owner']}/{request.match_info['repo']}"
        if repo != self.repo or request.match_info["path"] != self.file:
            return web.Response(status=404, headers={"X-Error-Code": "EntryNotFound"}, text="Entry not found")
        sha = hashlib.sha256(self.data).hexdigest()
        size = str(self.declared_size if self.declared_size is not None else len(self.data))
        headers = {"ETag": f'"{sha}"', "X-Linked-Etag": f'"{sha}"', "X-Repo-Commit": "c0ffee" * 6 + "c0ff",
                   "X-Linked-Size": size, "Accept-Ranges": "bytes"}
        if self.cdn is not None:
            return web.Response(status=302, headers={**headers, "Location": f"{self.cdn.url}{request.path_qs}"})
        if request.method == "HEAD":
            return web.Response(headers={**headers, "Content-Length": size})
        start = int(request.headers.get("Range", "bytes=0-").split("=")[1].split("-")[0])
        self.ranges.append(start)
        body = bytes(255 - b for b in self.data) if self.corrupt else self.data
        response = web.StreamResponse(status=206 if start else 200,
                                      headers={**headers, "Content-Length": str(len(self.data) - start)})
        await response.prepare(request)
        if self.cut:
            self.cut -= 1
            await response.write(body[start : start + (len(self.data) - start) // 2])
            request.transport.close()  # the connection drops mid-file
            return response
        step = len(body) // 20 if self.slow else len(body)  # slow: in 20 pieces over 2 s
        for at in range(start, len(body), step):
            await response.write(body[at : at + step])
            if self.slow:
                await asyncio.sleep(0.1)
        return response


def run_pull(endpoint: str, name: str, folder, home, **env: str) -> subprocess.CompletedProcess:
    """`ai00-like pull NAME --dir FOLDER` against the hub at `endpoint`, with `env` added
    (HF_TOKEN=...). Neither this machine's HF_TOKEN nor its HF_HOME (a stored token, the
    cache) is used: only what the test gives."""
    inherited = {k: v for k, v in os.environ.items() if k != "HF_TOKEN"}
    env = dict(inherited, HF_ENDPOINT=endpoint, HF_HOME=str(home), HF_HUB_DISABLE_TELEMETRY="1",
               HF_HUB_DISABLE_PROGRESS_BARS="1", **env)
    return subprocess.run([sys.executable, "-m", "ai00_like", "pull", name, "--dir", str(folder)], env=env,
                          capture_output=True, text=True, timeout=120)
