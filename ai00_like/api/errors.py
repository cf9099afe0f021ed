"""Errors in the envelope of the API a request came through.

OpenAI's routes (and every path of none of the others) answer
``{"error": {"message", "type", "param", "code"}}``; Ollama's ``{"error": "message"}``;
Anthropic's ``{"type": "error", "error": {"type", "message"}}``. Every error a client can
meet, including aiohttp's own (unknown route, wrong method, body too large), the key and
site checks before a handler, and bugs of ours, leaves the server in its route's shape with
a real status code: 4xx for the client's mistakes, 5xx only for ours, because the SDKs
retry 5xx. Handlers raise one `ApiError` whatever their API; the route table tags each
handler with its API (`SURFACE`), and the middleware here picks the envelope by it.
"""

from __future__ import annotations

import logging
import re

import msgspec
from aiohttp import web

from ..messages import Failed
from .logs import client_gone
from .sse import STARTED

log = logging.getLogger(__name__)


class ErrorBody(msgspec.Struct):
    message: str
    type: str
    param: str | None = None
    code: str | None = None


class ErrorEnvelope(msgspec.Struct):
    error: ErrorBody


class OllamaError(msgspec.Struct):
    error: str


class AnthropicErrorBody(msgspec.Struct):
    type: str
    message: str


class AnthropicError(msgspec.Struct):
    error: AnthropicErrorBody
    type: str = "error"  # also the name of its event in a stream (sse.EventStream.error)


# The APIs a route belongs to: the envelope of its errors.
OPENAI, OLLAMA, ANTHROPIC = "openai", "ollama", "anthropic"

# Anthropic names its errors by status (its docs' "HTTP errors" table).
_ANTHROPIC_TYPES = {400: "invalid_request_error", 401: "authentication_error", 402: "billing_error",
                    403: "permission_error", 404: "not_found_error", 413: "request_too_large",
                    429: "rate_limit_error", 503: "overloaded_error", 529: "overloaded_error"}


class ApiError(Exception):
    """Raised anywhere in a handler; the error middleware turns it into the envelope."""

    def __init__(self, status: int, message: str, *, type: str | None = None, param: str | None = None,
                 code: str | None = None, headers: dict[str, str] | None = None):
        super().__init__(message)
        self.status, self.message, self.param, self.code = status, message, param, code
        self.type = type or _default_type(status)
        self.headers = headers or {}

    def envelope(self, surface: str = OPENAI) -> msgspec.Struct:
        if surface == OLLAMA:
            return OllamaError(self.message)
        if surface == ANTHROPIC:
            kind = _ANTHROPIC_TYPES.get(self.status) or ("api_error" if self.status >= 500 else "invalid_request_error")
            return AnthropicError(AnthropicErrorBody(kind, self.message))
        return ErrorEnvelope(ErrorBody(self.message, self.type, self.param, self.code))

    def response(self, surface: str = OPENAI) -> web.Response:
        return web.Response(status=self.status, body=msgspec.json.encode(self.envelope(surface)),
                            content_type="application/json", headers=self.headers)


def _default_type(status: int) -> str:
    if status == 401:
        return "authentication_error"
    if status == 404:
        return "not_found_error"
    if status == 429:
        return "rate_limit_error"
    if status == 503:
        return "unavailable_error"
    if status >= 500:
        return "server_error"
    return "invalid_request_error"


def bad_request(message: str, param: str | None = None, code: str | None = "invalid_value") -> ApiError:
    return ApiError(400, message, param=param, code=code)


def model_not_found(requested: str, served: str) -> ApiError:
    return ApiError(404, f"The model `{requested}` does not exist; this server serves `{served}`.",
                    type="invalid_request_error", param="model", code="model_not_found")


_AT = re.compile(r" - at `\$\.?(.*)`$")
_MISSING = re.compile(r"^Object missing required field `(.*)`$")


def from_validation(error: msgspec.ValidationError) -> ApiError:
    """msgspec's "Expected `int` >= 1 - at `$.n`" → 400 naming `n` in both message and param."""
    text = str(error)
    match = _AT.search(text)
    param = match.group(1) if match else None
    problem = _AT.sub("", text)
    missing = _MISSING.match(problem)
    if missing:  # name the missing field itself, not the object that lacks it
        param = f"{param}.{missing.group(1)}" if param else missing.group(1)
        return bad_request(f"Missing required field '{param}'", param, code="missing_required_field")
    message = f"Invalid value for '{param}': {problem}" if param else f"Invalid request body: {problem}"
    return bad_request(message, param)


def from_failed(failed: Failed, param: str | None = None) -> ApiError:
    """A backend failure as the status the client should see; `param`: the field a
    bad_request most likely concerns (the middleware checks only what we cannot)."""
    if failed.kind in ("no_model", "unloaded"):
        return ApiError(503, failed.message, code="model_not_loaded", headers={"Retry-After": "1"})
    if failed.kind == "too_long":
        return bad_request(failed.message, param, code="context_length_exceeded")
    if failed.kind == "bad_request":
        return bad_request(failed.message, param)
    return ApiError(500, failed.message, code=None)


# aiohttp's own HTTP errors (no route, wrong method, body too large) in our envelope.
_HTTP_CODES = {404: "unknown_url", 405: "method_not_allowed", 413: "request_too_large"}


def surface_of(request: web.Request) -> str:
    """The API of the route a request matched (api/app.py tags each handler); OpenAI's for
    paths of no route."""
    return getattr(request.match_info.handler, SURFACE, OPENAI)


SURFACE = "api_surface"  # the handler attribute that names its route's API


@web.middleware
async def error_middleware(request: web.Request, handler):
    surface = surface_of(request)
    try:
        return await handler(request)
    except ApiError as e:
        started = request.get(STARTED)
        if started is not None:  # a stream that began while it waited for its model
            await started.error(e.envelope(surface))
            return started.response
        return e.response(surface)
    except web.HTTPException as e:
        if e.status < 400:
            raise
        message = e.text if e.text and not e.text.startswith(f"{e.status}:") else e.reason
        if e.status == 404:
            message = f"Unknown request URL: {request.method} {request.path}"
        headers = {k: v for k, v in e.headers.items() if k.lower() == "allow"}
        return ApiError(e.status, message, code=_HTTP_CODES.get(e.status), headers=headers).response(surface)
    except Exception as e:
        if isinstance(e, ConnectionError) and client_gone(request):
            raise  # the client left: request_log_middleware logs the 499, quietly
        log.exception("unhandled error in %s %s", request.method, request.path)  # a connection of ours too
        return ApiError(500, "internal server error (see the server log)").response(surface)
