"""Ollama's streams: one JSON object per line (application/x-ndjson).

It has EventStream's methods, so that generation.run_as_sse runs it as it runs SSE; it has
no comment lines, so a silence is not filled (models are loaded before it starts: the
routes ask for their model with stream=False), and an error after the 200 is one last line
`{"error": "…"}`, as Ollama ends a stream that failed.
"""

from __future__ import annotations

import msgspec
from aiohttp import web

from .types import Error

_encode = msgspec.json.Encoder().encode
CONTENT_TYPE = "application/x-ndjson"


class NdjsonStream:
    def __init__(self, request: web.Request):
        self.request = request
        self.response = web.StreamResponse(status=200, headers={"Content-Type": CONTENT_TYPE,
                                                                "Cache-Control": "no-cache",
                                                                "X-Accel-Buffering": "no"})

    async def start(self) -> None:
        if not self.response.prepared:
            await self.response.prepare(self.request)

    async def send(self, payload: msgspec.Struct) -> None:
        await self.response.write(_encode(payload) + b"\n")

    async def ping(self) -> None:
        """Nothing: a line would be an object the client must read."""

    async def done(self, marker: bool = False) -> None:
        await self.response.write_eof()

    async def error(self, envelope: msgspec.Struct) -> None:
        """The last line: the error's message in Ollama's shape, whatever envelope it came in."""
        body = getattr(envelope, "error", envelope)
        await self.send(Error(body if isinstance(body, str) else getattr(body, "message", str(body))))
        await self.response.write_eof()
