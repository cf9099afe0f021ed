"""Request bodies: size limit, JSON decoding into wire structs, errors that name the field."""

from __future__ import annotations

from typing import TypeVar

import msgspec
from aiohttp import web

from .errors import ApiError, bad_request, from_validation

T = TypeVar("T")

_decoders: dict[type, msgspec.json.Decoder] = {}


# A client still sending a body we refuse gets a connection reset instead of our 413 if we
# stop reading; so we read and drop this much of it before answering.
DRAIN_LIMIT = 64 << 20


async def _drain(request: web.Request) -> None:
    drained = 0
    while drained < DRAIN_LIMIT:
        chunk = await request.content.readany()
        if not chunk:
            return
        drained += len(chunk)


async def too_large(request: web.Request, limit: int) -> ApiError:
    await _drain(request)
    return ApiError(413, f"Request body is larger than {limit} bytes (config [listen] max_body_bytes)",
                    code="request_too_large")


async def decode_body(request: web.Request, type_: type[T], limit: int) -> T:
    if request.content_length is not None and request.content_length > limit:
        raise await too_large(request, limit)
    try:
        body = await request.read()  # the app's client_max_size stops chunked bodies at `limit`
    except web.HTTPRequestEntityTooLarge:
        raise await too_large(request, limit) from None
    if not body.strip():
        raise bad_request("Request body is empty; expected a JSON object", None, code="invalid_json")
    decoder = _decoders.get(type_)
    if decoder is None:
        decoder = _decoders[type_] = msgspec.json.Decoder(type_)
    try:
        return decoder.decode(body)
    except msgspec.ValidationError as e:
        raise from_validation(e) from None
    except (msgspec.DecodeError, UnicodeDecodeError) as e:
        raise bad_request(f"Request body is not valid JSON: {e}", None, code="invalid_json") from None
    except RecursionError:
        raise bad_request("Request body is nested too deeply", None, code="invalid_json") from None
