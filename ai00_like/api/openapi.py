"""The OpenAPI 3.1 document of our own routes, made from the route table and the wire structs.

Every route is listed (Ai00 leaves out the ones that are not annotated), with the request
and response schemas msgspec derives from the same structs the handlers decode and
encode, so the document cannot drift from what the server does.
"""

from __future__ import annotations

import re
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

import msgspec

from .errors import ANTHROPIC, OLLAMA, OPENAI, AnthropicError, ErrorEnvelope, OllamaError

OPENAPI_PATH = "/api-docs/openapi.json"
_PATTERN = re.compile(r"\{(\w+):[^}]*\}")
REF = "#/components/schemas/{name}"


@dataclass(frozen=True)
class Route:
    method: str
    path: str
    handler: Callable[..., Awaitable[object]]
    summary: str
    body: Any = None  # the request struct, if the route takes a JSON body
    returns: Any = None  # the JSON response type
    streams: Any = None  # the type of each server-sent event (Ollama's: each line), if the route can stream
    surface: str = OPENAI  # the API it belongs to: its errors' envelope (errors.py)


# Each API's error body, and how its streams are sent.
ERROR_TYPES = {OPENAI: ErrorEnvelope, OLLAMA: OllamaError, ANTHROPIC: AnthropicError}
STREAM_TYPES = {OLLAMA: ("application/x-ndjson", "one JSON object a line; the last has `done: true`"),
                ANTHROPIC: ("text/event-stream", "each event is `event: <type>` and `data: <json>`")}
OPENAI_STREAM = ("text/event-stream", "each event is `data: <json>`; OpenAI streams end with `data: [DONE]`")


def openapi_document(routes: list[tuple[str, Route]], version: str = "0.1.0") -> dict:
    types = {t for _, r in routes for t in (r.body, r.returns, r.streams) if t is not None} | set(ERROR_TYPES.values())
    types = sorted(types, key=repr)  # stable output
    schemas, components = msgspec.json.schema_components(types, ref_template=REF)
    schema_of = dict(zip(types, schemas))
    paths: dict[str, dict] = {}
    for routed_path, route in routes:
        path = _PATTERN.sub(r"{\1}", routed_path)  # aiohttp's {name:regex} → OpenAPI's {name}
        operation: dict = {"summary": route.summary, "operationId": f"{route.method.lower()}{_camel(path)}"}
        if route.body is not None:
            operation["requestBody"] = {"required": True,
                                        "content": {"application/json": {"schema": schema_of[route.body]}}}
        content = {}
        if route.returns is not None:
            content["application/json"] = {"schema": schema_of[route.returns]}
        if route.streams is not None:
            kind, description = STREAM_TYPES.get(route.surface, OPENAI_STREAM)
            content[kind] = {"schema": schema_of[route.streams], "description": description}
        ok = {"description": "OK"}
        error = {"description": f"Error ({route.surface}'s envelope)",
                 "content": {"application/json": {"schema": schema_of[ERROR_TYPES[route.surface]]}}}
        if content:
            ok["content"] = content
        operation["responses"] = {"200": ok, "4XX": error, "5XX": error}
        parameters = [{"in": "path", "name": part[1:-1], "required": True, "schema": {"type": "string"}}
                      for part in path.split("/") if part.startswith("{")]
        if parameters:
            operation["parameters"] = parameters
        paths.setdefault(path, {})[route.method.lower()] = operation
    return {
        "openapi": "3.1.0",
        "info": {"title": "ai00-like", "version": version,
                 "description": "OpenAI-, Ollama- and Anthropic-compatible and Ai00 routes of a local RWKV server."},
        "paths": paths,
        "components": {"schemas": components},
    }


def _camel(path: str) -> str:
    words = [w.strip("{}") for w in path.replace("-", "/").replace(".", "/").split("/") if w]
    return "".join(w[:1].upper() + w[1:] for w in words)
