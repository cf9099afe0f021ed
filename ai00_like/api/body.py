"""Request bodies: size limit, JSON decoding into wire structs, errors that name the field."""

from __future__ import annotations

from typing import TypeVar

import msgspec
from aiohttp import web

from .errors import ApiError, bad_request, from_validation

T = TypeVar("T")

_decoders: dict[type, msgspec.json.Decoder] = {}


def too_large(limit: int) -> ApiError:
    return ApiError(413, f"Request body is larger than {limit} bytes (config [listen] max_body_bytes)",
                    code="request_too_large")


async def decode_body(request: web.Request, type_: type[T], limit: int) -> T:
    if request.content_length is not None and request.content_length > limit:
        raise too_large(limit)
    try:
        body = await request.read()  # the app's client_max_size stops chunked bodies at `limit`
    except web.HTTPRequestEntityTooLarge:
        raise too_large(limit) from None
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
