"""One server per store folder.

Two servers on one SQLite folder each took the other's state files for orphans of a crash
and deleted them (43 of 600 saved states in a stress run). The folder is locked for as
long as a server uses it: an OS lock on `lock` (released by the OS if the process dies,
so a crash never leaves the folder locked) and, beside it, `lock.owner` naming who holds
it, so the second server's refusal can say which process to look for.
"""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path

from filelock import FileLock, Timeout

from .errors import StoreError


def lock_folder(folder: Path) -> FileLock:
    """The folder's lock, held; StoreError naming the holder when another process has it."""
    lock = FileLock(folder / "lock", timeout=0, thread_local=False)
    owner = folder / "lock.owner"
    try:
        lock.acquire()
    except Timeout:
        raise StoreError(f"{folder}: the response store is in use by {_holder(owner)}; give each server its own "
                         "[responses] path, or share stored responses between servers with [store] url") from None
    owner.write_text(json.dumps({"pid": os.getpid(), "host": socket.gethostname(), "since": int(time.time())}))
    return lock


def _holder(owner: Path) -> str:
    try:
        who = json.loads(owner.read_text())
        since = time.strftime("%Y-%m-%d %H:%M:%S", time.localtime(who["since"]))
        return f"process {who['pid']} on {who['host']} (since {since})"
    except (OSError, ValueError, KeyError, TypeError):
        return "another process"
