"""Server-sent events as OpenAI clients read them.

Each event is ``data: <json>\\n\\n`` (with the space after the colon that Ai00 leaves out),
the stream ends with ``data: [DONE]\\n\\n`` in its own event (RWKV-Runner #57 glued it to
the previous one), and silence is filled with comment lines (``: ping``), which every SSE
parser skips. An error after the 200 has gone out is sent as ``data: {"error": …}``,
which the openai SDK raises as APIError.

A write after the client left raises aiohttp.ClientConnectionResetError (a
ConnectionResetError) where aiohttp has not yet cancelled the handler: it ends the handler
like the cancellation would, and request_log_middleware (api/logs.py) logs the 499.
"""

from __future__ import annotations

import msgspec
from aiohttp import web

_encode = msgspec.json.Encoder().encode

DONE = b"data: [DONE]\n\n"
PING = b": ping\n\n"


class EventStream:
    def __init__(self, request: web.Request):
        self.request = request
        self.response = web.StreamResponse(
            status=200,
            headers={
                "Content-Type": "text/event-stream; charset=utf-8",
                "Cache-Control": "no-cache",
                "X-Accel-Buffering": "no",  # nginx: pass events through as they come
            },
        )

    async def start(self) -> None:
        await self.response.prepare(self.request)

    async def send(self, payload: msgspec.Struct) -> None:
        await self.send_raw(_encode(payload))

    async def send_raw(self, json_bytes: bytes) -> None:
        await self.response.write(b"data: " + json_bytes + b"\n\n")

    async def send_typed(self, event) -> None:
        """A Responses API event: named by its `type` as well (`event:` line), as OpenAI sends them."""
        await self.response.write(b"event: " + event.type.encode() + b"\ndata: " + _encode(event) + b"\n\n")

    async def ping(self) -> None:
        await self.response.write(PING)

    async def done(self, marker: bool = True) -> None:
        """The end of the stream: `data: [DONE]` (chat, completions), or just the end (Responses)."""
        if marker:
            await self.response.write(DONE)
        await self.response.write_eof()

    async def error(self, envelope: msgspec.Struct) -> None:
        await self.send(envelope)
        await self.response.write_eof()
