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

import asyncio
from contextvars import ContextVar

import msgspec
from aiohttp import web

_encode = msgspec.json.Encoder().encode

DONE = b"data: [DONE]\n\n"
PING = b": ping\n\n"
WAIT_BEFORE_STREAMING = 0.25  # seconds a stream waits for its model before it starts with pings
# The request whose handler runs (api/app.py's endpoint sets it).
REQUEST: ContextVar[web.Request | None] = ContextVar("request", default=None)


class EventStream:
    @classmethod
    def of(cls, request: web.Request) -> EventStream:
        """The request's stream: the one started while it waited for its model, or a new one."""
        return request.get(STARTED) or cls(request)

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
        if not self.response.prepared:
            await self.response.prepare(self.request)

    async def send(self, payload: msgspec.Struct) -> None:
        await self.send_raw(_encode(payload))

    async def send_raw(self, json_bytes: bytes) -> None:
        await self.response.write(b"data: " + json_bytes + b"\n\n")

    async def send_all(self, payloads: list[msgspec.Struct]) -> None:
        """Several events in one write: each still its own `data:` event, but one socket
        write and one wake-up of the client instead of one per event."""
        await self.response.write(b"".join([b"data: " + _encode(p) + b"\n\n" for p in payloads]))

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
        """The error that ends the stream: Anthropic's is a named event, OpenAI's plain data."""
        if getattr(envelope, "type", None) == "error":
            await self.send_typed(envelope)
        else:
            await self.send(envelope)
        await self.response.write_eof()


# The request's stream when it was started before its first event (keep_alive_while).
STARTED = web.RequestKey("early_event_stream", EventStream)


async def keep_alive_while(task: asyncio.Future, interval: float):
    """`await task` for a streaming request; if it takes more than a moment (a model being
    loaded), the stream starts and gets a ping every `interval` seconds meanwhile, so that
    clients and proxies do not give up on it. An error after that goes out as an error event
    (api/errors.py's error_middleware)."""
    request = REQUEST.get()
    try:
        done, _ = await asyncio.wait([task], timeout=min(interval, WAIT_BEFORE_STREAMING))
        if not done and request is not None:
            out = request[STARTED] = EventStream(request)
            await out.start()
            while not (await asyncio.wait([task], timeout=interval))[0]:
                await out.ping()
        return await task
    except asyncio.CancelledError:
        task.cancel()  # the client left: stop waiting (the load itself goes on)
        raise
