"""Proves a release zip works on this machine, as a user would run it.

Usage: .venv/bin/python scripts/release_check.py dist/ai00-like-<version>-<os>-<arch>.zip

1. unzips the release into an empty temporary folder (restoring the executable bits, as
   `unzip` does);
2. starts `ai00-like/ai00-like` there on a free port, without opening a browser, with a
   PATH that holds no Python (an empty folder) and no PYTHON* variables: the executable
   must carry its own interpreter and libraries;
3. waits (at most --timeout seconds; the first start compiles numba's kernels) for
   GET /health to answer 200, i.e. the demo model is loaded;
4. sends one chat completion through the official `openai` SDK (model "demo",
   max_tokens 16) and checks the reply is non-empty text;
5. checks that GET / serves the web page from the release's assets/www;
6. sends SIGTERM and waits for the graceful exit, status 0 (config.toml's
   [listen] shutdown_grace), and checks numba's kernel cache was written beside it.
   On Windows there is no SIGTERM: it sends Ctrl+Break and reports the exit code without
   requiring 0 (the server's graceful stop there is Ctrl+C in its console window).

It prints a summary, or `release_check: FAILED: <reason>` and exits 1 (with the tail of
the server's output when it got that far). The temporary folder is removed unless --keep.
It needs the dev venv (`openai`); the release itself needs nothing from it.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import zipfile
from pathlib import Path

WINDOWS = os.name == "nt"
EXE_NAME = "ai00-like.exe" if WINDOWS else "ai00-like"


class CheckFailed(Exception):
    pass


def extract(zip_path: Path, dest: Path) -> None:
    """extractall, plus what `unzip` restores and zipfile does not: Unix modes and symlinks."""
    with zipfile.ZipFile(zip_path) as zf:
        zf.extractall(dest)
        if WINDOWS:
            return
        for info in zf.infolist():
            mode = info.external_attr >> 16
            path = dest / info.filename
            if stat.S_ISLNK(mode):
                target = zf.read(info).decode()
                path.unlink()
                path.symlink_to(target)
            elif mode & 0o7777:
                os.chmod(path, mode & 0o7777)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def clean_env(empty_bin: Path) -> dict[str, str]:
    """This environment without Python in it: PATH is one empty folder, no PYTHON*/venv/numba settings."""
    env = {
        k: v for k, v in os.environ.items()
        if not k.startswith(("PYTHON", "NUMBA_", "AI00_LIKE_")) and k not in ("VIRTUAL_ENV", "LD_LIBRARY_PATH", "PATH")
    }
    env["PATH"] = str(empty_bin)
    for name in ("python", "python3", "py"):
        if shutil.which(name, path=env["PATH"]):
            raise CheckFailed(f"the check's PATH {env['PATH']} still has {name}")
    return env


def takes_no_browser(exe: Path, env: dict[str, str], cwd: Path) -> bool:
    """Whether the executable is the launcher (it has --no-browser) or the plain CLI."""
    try:
        out = subprocess.run([str(exe), "--help"], env=env, cwd=cwd, capture_output=True, text=True, timeout=120)
    except subprocess.TimeoutExpired:
        raise CheckFailed("`ai00-like --help` did not finish in 120 s") from None
    if out.returncode != 0:
        raise CheckFailed(f"`ai00-like --help` exited {out.returncode}: {(out.stderr or out.stdout).strip()[-500:]}")
    return "--no-browser" in out.stdout


def wait_healthy(url: str, proc: subprocess.Popen, timeout: float) -> dict:
    """Poll GET /health until 200 (the model is loaded); fail if the process dies or time runs out."""
    deadline = time.monotonic() + timeout
    last = "no answer"
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise CheckFailed(f"the server exited with status {proc.returncode} before /health said ok")
        try:
            with urllib.request.urlopen(url, timeout=5) as r:
                return json.loads(r.read())
        except urllib.error.HTTPError as e:  # 503 while loading
            last = f"{e.code} {e.read().decode(errors='replace')[:200]}"
        except OSError as e:  # not listening yet
            last = str(e)
        time.sleep(0.5)
    raise CheckFailed(f"/health not ok after {timeout:.0f} s (last: {last})")


def chat(port: int) -> tuple[str, object]:
    from openai import OpenAI

    client = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="release-check", timeout=120, max_retries=0)
    completion = client.chat.completions.create(
        model="demo",
        messages=[{"role": "user", "content": "Hello! What is your name?"}],
        max_tokens=16,
    )
    reply = completion.choices[0].message.content
    if not isinstance(reply, str) or not reply.strip():
        raise CheckFailed(f"the chat reply is empty: {completion.model_dump_json()[:300]}")
    return reply, completion.usage


def page(port: int) -> int:
    """GET /: the web page's index.html, in bytes."""
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/", timeout=30) as r:
        body = r.read()
    if b"<html" not in body.lower():
        raise CheckFailed(f"GET / did not serve the web page: {body[:120]!r}")
    return len(body)


def stop(proc: subprocess.Popen, timeout: float = 60) -> int:
    """SIGTERM (Ctrl+Break on Windows), then wait for the graceful exit."""
    if WINDOWS:
        proc.send_signal(signal.CTRL_BREAK_EVENT)
    else:
        proc.send_signal(signal.SIGTERM)
    try:
        return proc.wait(timeout)
    except subprocess.TimeoutExpired:
        proc.kill()
        proc.wait()
        raise CheckFailed(f"the server did not exit within {timeout:.0f} s of SIGTERM (killed)") from None


def folder_bytes(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file() and not p.is_symlink())


def mib(n: int) -> str:
    return f"{n / 2**20:.1f} MiB"


def check(zip_path: Path, timeout: float, keep: bool) -> None:
    if not zip_path.is_file():
        raise CheckFailed(f"{zip_path}: no such file")
    # Loopback only: a proxy from the environment must not take the SDK's requests.
    os.environ["NO_PROXY"] = os.environ["no_proxy"] = "127.0.0.1,localhost"
    tmp = Path(tempfile.mkdtemp(prefix="ai00-like-release-check-"))
    proc = None
    log_path = tmp / "server-output.txt"
    try:
        release = tmp / "release"
        release.mkdir()
        t0 = time.monotonic()
        extract(zip_path, release)
        unzip_s = time.monotonic() - t0
        app = release / "ai00-like"
        exe = app / EXE_NAME
        for needed in (exe, app / "config.toml", app / "assets" / "models" / "demo.st", app / "assets" / "www" / "index.html"):
            if not needed.is_file():
                raise CheckFailed(f"the release has no {needed.relative_to(release)}")
        if not WINDOWS and not os.access(exe, os.X_OK):
            raise CheckFailed(f"{exe.relative_to(release)} is not executable")
        empty_bin = tmp / "empty-bin"
        empty_bin.mkdir()
        env = clean_env(empty_bin)
        # Started from a folder other than the release's: the launcher must find its home itself.
        launcher = takes_no_browser(exe, env, cwd=tmp)
        port = free_port()
        cmd = [str(exe), "-p", str(port)] + (["--no-browser"] if launcher else [])
        # The plain CLI reads ./config.toml; the launcher ignores the current folder.
        cwd = tmp if launcher else app
        print(f"release_check: {' '.join(cmd[1:])} (PATH={env['PATH']}, cwd={cwd})", flush=True)
        with open(log_path, "wb") as out:
            t0 = time.monotonic()
            proc = subprocess.Popen(
                cmd, cwd=cwd, env=env, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                creationflags=subprocess.CREATE_NEW_PROCESS_GROUP if WINDOWS else 0,
            )
            health = wait_healthy(f"http://127.0.0.1:{port}/health", proc, timeout)
            health_s = time.monotonic() - t0
            t1 = time.monotonic()
            reply, usage = chat(port)
            chat_s = time.monotonic() - t1
            page_bytes = page(port)
            code = stop(proc)
        if code != 0 and not WINDOWS:
            raise CheckFailed(f"the server exited with status {code} after SIGTERM (expected 0)")
        cache = app / ".cache" / "numba"
        cached = sum(1 for _ in cache.rglob("*.nbc")) if cache.is_dir() else 0
        if cached == 0:
            raise CheckFailed(f"numba wrote no kernel cache under {cache.relative_to(release)}")
        print("release_check: OK")
        print(f"  release:          {zip_path} ({mib(zip_path.stat().st_size)}; {mib(folder_bytes(app))} unpacked, in {unzip_s:.1f} s)")
        print(f"  entry:            {'launcher (--no-browser)' if launcher else 'cli'}; port {port}")
        print(f"  time to /health:  {health_s:.1f} s -> {json.dumps(health)}")
        print(f"  chat completion:  {chat_s:.1f} s, usage {usage.prompt_tokens}+{usage.completion_tokens} tokens")
        print(f"  reply:            {reply!r}")
        print(f"  web page:         GET / -> {page_bytes} bytes of HTML")
        print(f"  exit code:        {code} (after {'Ctrl+Break' if WINDOWS else 'SIGTERM'})")
        print(f"  numba cache:      {cached} compiled kernels in {cache.relative_to(release)}")
        log_file = app / "ai00-like.log"
        if launcher:
            print(f"  log file:         {log_file.relative_to(release)}: {'present' if log_file.is_file() else 'MISSING'}")
    except BaseException:
        if proc is not None and proc.poll() is None:
            proc.kill()
            proc.wait()
        if log_path.exists():
            tail = log_path.read_text(errors="replace").splitlines()[-25:]
            print("release_check: last lines of the server's output:", *("  | " + line for line in tail), sep="\n", file=sys.stderr)
        raise
    finally:
        if keep:
            print(f"  kept:             {tmp}")
        else:
            shutil.rmtree(tmp, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("zip", type=Path, help="the release zip (dist/ai00-like-*.zip)")
    parser.add_argument("--timeout", type=float, default=300, help="seconds to wait for /health (default: 300)")
    parser.add_argument("--keep", action="store_true", help="keep the unzipped release and its output")
    args = parser.parse_args()
    try:
        check(args.zip, args.timeout, args.keep)
    except CheckFailed as e:
        print(f"release_check: FAILED: {e}", file=sys.stderr)
        return 1
    except Exception as e:  # noqa: BLE001 — one line for the SDK's errors too
        print(f"release_check: FAILED: {type(e).__name__}: {e}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
