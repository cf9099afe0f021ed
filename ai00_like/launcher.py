"""The double-click start: what the release's executable runs (`ai00-like-app` when
installed with pip).

Its home is the folder it lives in (the release's folder; the current folder when run
from Python). It serves the `config.toml` there, writing a default one that serves the
bundled demo model if there is none; logs to `ai00-like.log` there as well as to the
console; keeps numba's compiled kernels in `.cache/numba` there (a release's own folder
may be read-only to Python's usual cache places); takes the next free port when the
configured one is taken, saying so; and opens the web page in the default browser once
the server answers, unless `--no-browser` or `[web] open_browser = false`.
"""

from __future__ import annotations

import argparse
import logging
import os
import socket
import sys
import threading
import time
import urllib.error
import urllib.request
import webbrowser
from pathlib import Path

log = logging.getLogger("ai00_like.launcher")

LOG_FILE = "ai00-like.log"
PORT_TRIES = 20
# What a release serves when its folder has no config.toml: the bundled demo model and the
# page, from the assets/ folder beside it (a release), or else the package's own (pip).
# config.toml in the repository documents every key.
DEFAULT_CONFIG = """\
# Written by ai00-like on first start. Every key is documented in the project's config.toml.
[model]
path = '{assets}/models'
name = "demo.st"
thinking = "effort"
reasoning_effort = "none"

[tokenizer]
path = '{assets}/models/demo_vocab.txt'

[listen]
ip = "127.0.0.1"
port = 65530

[web]
path = '{assets}/www'
open_browser = true
"""


def home() -> Path:
    """The release's folder when frozen (PyInstaller), else the current folder."""
    return Path(sys.executable).resolve().parent if getattr(sys, "frozen", False) else Path.cwd()


def free_port(ip: str, wanted: int) -> int:
    """`wanted`, or the next of PORT_TRIES ports that nothing listens on."""
    for port in range(wanted, wanted + PORT_TRIES):
        with socket.socket() as s:
            if os.name != "nt":  # as the server binds: a port a moment ago ours (TIME_WAIT) is free
                s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            try:
                s.bind((ip, port))
            except OSError:
                continue
        if port != wanted:
            log.warning("port %d is taken; listening on %d instead", wanted, port)
        return port
    raise OSError(f"ports {wanted} to {wanted + PORT_TRIES - 1} are all taken")


def open_when_ready(url: str, timeout: float = 120.0) -> None:
    """Open `url` in the default browser as soon as the server answers there."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url + "health", timeout=2):
                pass
        except OSError as e:  # 503 (no model yet) is an answer too
            if not isinstance(e, urllib.error.HTTPError):
                time.sleep(0.2)
                continue
        webbrowser.open(url)
        return


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="ai00-like", description=__doc__.split("\n\n")[0])
    parser.add_argument("--no-browser", action="store_true", help="do not open the web page")
    parser.add_argument("-p", "--port", type=int, default=None, help="port to listen on (default: the config's)")
    args = parser.parse_args(argv)

    folder = home()
    os.environ.setdefault("NUMBA_CACHE_DIR", str(folder / ".cache" / "numba"))
    from .api.app import ApiStartError, serve_forever
    from .assets import assets_root
    from .cli import give_gpu_drivers_a_runtime_dir

    give_gpu_drivers_a_runtime_dir()  # else Mesa prints an error line at every GPU probe
    from .api.logs import configure_logging
    from .config import ConfigError, load_config

    configure_logging("info")
    file_log = logging.FileHandler(folder / LOG_FILE, encoding="utf-8")
    file_log.setFormatter(logging.Formatter("%(asctime)s %(levelname)s %(name)s: %(message)s"))
    logging.getLogger().addHandler(file_log)
    config_file = folder / "config.toml"
    if not config_file.exists():
        assets = "assets" if (folder / "assets").is_dir() else assets_root().as_posix()
        config_file.write_text(DEFAULT_CONFIG.format(assets=assets), encoding="utf-8")
        log.info("wrote a default %s", config_file)
    try:
        config = load_config(config_file)
        port = free_port(config.listen.ip, args.port if args.port is not None else config.listen.port)
        if config.web is not None and config.web.open_browser and not args.no_browser:
            host = "127.0.0.1" if config.listen.ip in ("0.0.0.0", "::") else config.listen.ip
            threading.Thread(target=open_when_ready, args=(f"http://{host}:{port}/",), daemon=True).start()
        serve_forever(config, port=port)
    except (ConfigError, ApiStartError, OSError) as e:
        log.error("%s", e)
        return 2
    except KeyboardInterrupt:  # Ctrl+C where no signal handler could be installed (Windows)
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
