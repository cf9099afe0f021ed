"""A saved state as a file, and a file as a saved state: GET /v1/saved_states/{id}/content
and POST /v1/saved_states/import.

The file is what state-tuning tools and Ai00 read (rwkv/state_file.py): `.st` by default,
`.pth` with `?format=pth`, both written without torch. An import is read by the same reader
as `[[state]]` files and checked against the model's shape; a file that is not a state, or
one of another shape, is a 400 naming what is wrong. Its body is the file itself
(application/octet-stream) or a multipart form whose field `file` holds it; it may be larger
than `[listen] max_body_bytes`, up to twice the model's state in fp32 plus a margin.
"""

from __future__ import annotations

import asyncio
import re
import tempfile
from pathlib import Path

from aiohttp import web

from ...rwkv.errors import ModelFileError
from ...rwkv.info import ModelInfo
from ...rwkv.state import State
from ...rwkv.state_file import FORMATS, read_state, write_state
from ..body import too_large
from ..errors import ApiError, bad_request
from ..serving import Serving
from .routes import checked_name, keep
from .use import ask, find, saved_states

MARGIN = 1 << 20  # the file's own header and names, beyond the state's floats
_UNSAFE = re.compile(r"[^A-Za-z0-9._-]+")


def _as_file(state: State, version: str, fmt: str) -> bytes:
    with tempfile.TemporaryDirectory(prefix="ai00-state-") as folder:
        path = Path(folder) / f"state.{fmt}"
        write_state(state, version, path, fmt)
        return path.read_bytes()


async def state_content(request: web.Request, serving: Serving) -> web.Response:
    fmt = request.query.get("format", "st")
    if fmt not in FORMATS:
        raise bad_request(f"'format' must be one of {', '.join(FORMATS)}, got '{fmt}'", "format")
    state_id = request.match_info["state_id"]
    store = saved_states(serving)
    record = await find(serving, request, state_id)
    if record.version == "4":
        raise bad_request("A v4 model's state has no time_state: it cannot be written as a state file", None)
    state = await ask(store.state, record)
    if state is None:
        raise bad_request(f"The saved state '{state_id}' has lost its data; delete it and save it again", None,
                          code="state_not_found")
    body = await asyncio.get_running_loop().run_in_executor(None, _as_file, state, record.version, fmt)
    filename = (_UNSAFE.sub("_", record.name).strip("._") if record.name else "") or record.id
    return web.Response(body=body, content_type="application/octet-stream",
                        headers={"Content-Disposition": f'attachment; filename="{filename}.{fmt}"'})


def import_limit(serving: Serving, info: ModelInfo) -> int:
    state_bytes = 4 * info.n_layer * info.state_floats_per_layer
    return max(serving.config.listen.max_body_bytes, 2 * state_bytes + MARGIN)


async def _read_limited(read, limit: int, request: web.Request) -> bytes:
    """What `read()` gives until it gives nothing, refused past `limit` bytes."""
    data = bytearray()
    while chunk := await read():
        data += chunk
        if len(data) > limit:
            raise await too_large(request, limit)
    return bytes(data)


async def _upload(request: web.Request, limit: int) -> tuple[bytes, str]:
    """(the file's bytes, its name if the form gave one)."""
    if request.content_length is not None and request.content_length > limit:
        raise await too_large(request, limit)
    if request.content_type.startswith("multipart/"):
        try:
            return await _form_file(request, limit)
        except ApiError:
            raise
        except Exception as e:  # noqa: BLE001 - a form without a boundary, a damaged part: the client's
            raise bad_request(f"The multipart form cannot be read ({type(e).__name__}: {e}); send the state "
                              "file in the form field 'file', or as the body itself", "file") from None
    return await _read_limited(request.content.readany, limit, request), ""


async def _form_file(request: web.Request, limit: int) -> tuple[bytes, str]:
    reader = await request.multipart()
    while (part := await reader.next()) is not None:
        if getattr(part, "name", None) == "file":
            return await _read_limited(part.read_chunk, limit, request), part.filename or ""
    raise bad_request("The form has no field 'file': send the state file in it", "file",
                      code="missing_required_field")


def _from_file(data: bytes, filename: str, info: ModelInfo) -> State:
    """The upload read by the state files' reader (ModelFileError when it is not one)."""
    if info.version == "4":
        raise ModelFileError(None, "v4 models do not support state files (they have no time_state)")
    suffix = ".pth" if filename.lower().endswith(".pth") else ".st"  # which layout a file without a mark is in
    with tempfile.TemporaryDirectory(prefix="ai00-state-") as folder:
        path = Path(folder) / f"upload{suffix}"
        path.write_bytes(data)
        try:
            return read_state(path, info)
        except ModelFileError:
            raise
        except Exception as e:  # noqa: BLE001 - an uploaded file can be damaged in any way
            raise ModelFileError(None, f"not a readable state file ({type(e).__name__})") from None


async def import_state(request: web.Request, serving: Serving):
    saved_states(serving)  # a server without a store says so before it reads the file
    name = checked_name(request.query.get("name"))
    model = await serving.model_for(request.query.get("model") or None)
    data, filename = await _upload(request, import_limit(serving, model.info))
    if not data:
        raise bad_request("The body is empty: send the state file (.st or .pth) as the body, or as the form "
                          "field 'file'", "file", code="missing_required_field")
    try:
        state = await asyncio.get_running_loop().run_in_executor(None, _from_file, data, filename, model.info)
    except ModelFileError as e:
        raise bad_request(f"Not a state file for model '{model.name}': {e.problem}", "file") from None
    return await keep(serving, request, model, state, tokens=0, name=name)
