"""Structured request logs: one JSON line per request on the `ai00_like.access` logger.

Each line has the request id (the client's `X-Request-Id` when it sends a sane one, else
a new one; echoed in the response), method, route, status, duration and, for generation,
the prompt and completion tokens and the time to the first token. Handlers do not log:
the generation observer (api/metrics.py) fills the record of the request it runs in,
found through a context variable, so no handler signature changes. A client that leaves
is status 499 (nginx's code for it): one line, never a traceback.
"""

from __future__ import annotations

import contextvars
import json
import logging
import re
import time
import uuid
from dataclasses import dataclass

from aiohttp import web

access_log = logging.getLogger("ai00_like.access")
REQUEST_ID = "X-Request-Id"
_SANE_ID = re.compile(r"^[A-Za-z0-9._:-]{1,128}$")


@dataclass
class RequestStats:
    id: str
    prompt_tokens: int = 0
    completion_tokens: int = 0
    ttft: float | None = None


_current: contextvars.ContextVar[RequestStats | None] = contextvars.ContextVar("request_stats", default=None)


def current_request_stats() -> RequestStats | None:
    return _current.get()


@web.middleware
async def request_log_middleware(request: web.Request, handler):
    given = request.headers.get(REQUEST_ID, "")
    stats = RequestStats(given if _SANE_ID.match(given) else uuid.uuid4().hex)
    token = _current.set(stats)
    started = time.monotonic()
    status = 500
    try:
        response = await handler(request)
        status = response.status
        if not response.prepared:  # streams got theirs from add_request_id
            response.headers[REQUEST_ID] = stats.id
        return response
    except web.HTTPException as e:
        status = e.status
        raise
    except ConnectionError:
        if not client_gone(request):
            raise
        # A write met the transport of a client that left (aiohttp.ClientConnectionResetError)
        # before aiohttp cancelled the handler. Raised on, aiohttp would log it with a
        # traceback; a response handed back instead meets the same closed transport, which
        # aiohttp takes quietly as a premature disconnection. Nothing of it reaches the wire.
        status = 499
        return web.Response(status=499)
    except BaseException:
        status = 499  # the client went away (nginx's code for it); bugs become 500 in error_middleware
        raise
    finally:
        _current.reset(token)
        if access_log.isEnabledFor(logging.INFO):
            route = request.match_info.route.resource
            record = {
                "id": stats.id, "method": request.method,
                "route": route.canonical if route is not None else request.path,
                "status": status, "ms": round((time.monotonic() - started) * 1000, 1),
                "remote": request.remote,
            }
            if stats.prompt_tokens or stats.completion_tokens:
                record["prompt_tokens"], record["completion_tokens"] = stats.prompt_tokens, stats.completion_tokens
            if stats.ttft is not None:
                record["ttft_ms"] = round(stats.ttft * 1000, 1)
            access_log.info(json.dumps(record))


def client_gone(request: web.Request) -> bool:
    """Whether the request's connection is closed or closing: nothing can reach its client."""
    transport = request.transport
    return transport is None or transport.is_closing()


async def add_request_id(request: web.Request, response: web.StreamResponse) -> None:
    """on_response_prepare: streams, prepared inside the handler, name their request id."""
    stats = _current.get()
    if stats is not None:
        response.headers[REQUEST_ID] = stats.id


LOG_LEVELS = ("debug", "info", "warning", "error")


def configure_logging(level: str = "info") -> None:
    logging.basicConfig(level=getattr(logging, level.upper()),
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # aiohttp's own access log would repeat ours in a less useful form.
    logging.getLogger("aiohttp.access").setLevel(logging.WARNING)
