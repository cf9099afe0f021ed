"""What the benches that start servers share: a free loopback port, progress notes, and a
bare streaming client."""

from __future__ import annotations

import asyncio
import json
import socket
import sys


def note(text: str) -> None:
    """Progress, on stderr: stdout holds the tables and ends with the results' JSON line."""
    print(text, file=sys.stderr, flush=True)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class StreamTail(asyncio.Protocol):
    """Reads one chunked HTTP response as it arrives and keeps only its last bytes.

    The clients share the machine with the server, and their own work should not count
    against it, so they do the least a client can: no HTTP client library, no SSE parsing;
    only the end of the stream (the usage chunk, then [DONE]) is read."""

    def __init__(self, done: asyncio.Future):
        self.done, self.tail, self.head = done, b"", b""

    def data_received(self, data: bytes) -> None:
        if not self.head:
            self.head = data[:12]
            if not data.startswith(b"HTTP/1.1 200"):
                self.done.set_exception(SystemExit(f"HTTP error: {data[:300]!r}"))
                return
        self.tail = (self.tail + data)[-4096:]
        if self.tail.endswith(b"\r\n0\r\n\r\n") and not self.done.done():  # the last chunk
            self.done.set_result(self.tail)

    def connection_lost(self, exc) -> None:
        if not self.done.done():
            self.done.set_exception(exc or ConnectionError("the server closed the stream"))


async def stream_completion(port: int, body: dict, reader=StreamTail, timeout: float = 600):
    """POST `body` to /v1/completions as a stream with its usage, read by `reader` (a
    StreamTail); returns (the reader, the reply's completion_tokens)."""
    data = json.dumps({**body, "stream": True, "stream_options": {"include_usage": True}}).encode()
    loop = asyncio.get_running_loop()
    done = loop.create_future()
    transport, protocol = await loop.create_connection(lambda: reader(done), "127.0.0.1", port)
    try:
        transport.write(b"POST /v1/completions HTTP/1.1\r\nHost: 127.0.0.1\r\n"
                        b"Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s" % (len(data), data))
        tail = await asyncio.wait_for(done, timeout)
    finally:
        transport.close()
    usage = tail[tail.rindex(b'data: {"'):].split(b"\n", 1)[0]
    return protocol, json.loads(usage[6:])["usage"]["completion_tokens"]
