"""What the benches that start servers share: a free loopback port and progress notes."""

from __future__ import annotations

import socket
import sys


def note(text: str) -> None:
    """Progress, on stderr: stdout holds the tables and ends with the results' JSON line."""
    print(text, file=sys.stderr, flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
