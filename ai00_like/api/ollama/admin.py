"""POST /api/pull and DELETE /api/delete (admin routes, as /admin/...), and the Ollama routes
this server does not have, which say so.

A pull is our hub pull (hub/jobs.py: a catalogue alias or REPO/FILE), its progress sent as
Ollama's status objects; a delete removes a model file from the models folder, unloading
it first. Models named in config.toml are not deleted: their sections would name a file
that is gone.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

from aiohttp import web

from ...hub.catalogue import UnknownModel
from ...hub.download import PullError
from ...hub.jobs import Job
from ..body import decode_body
from ..errors import ApiError, bad_request
from ..serving import Serving
from .ndjson import NdjsonStream
from .names import served_name
from .types import ModelRequest, PullRequest, Status

POLL = 0.5  # seconds between progress lines


async def _start(serving: Serving, name: str) -> Job:
    if not name:
        raise bad_request("model is required", "model")
    try:
        return await asyncio.to_thread(serving.downloads.start, name)
    except UnknownModel as e:
        raise bad_request(str(e), "model") from None
    except PullError as e:  # before it starts: no such file, no hub to ask, no room
        raise ApiError(404 if e.missing else 400, str(e), param="model") from None


def _progress(serving: Serving, job: Job) -> Status:
    return Status(status=f"pulling {job.file}", digest=job.file, total=job.total or 0,
                  completed=serving.downloads.done_bytes(job))


async def pull(request: web.Request, serving: Serving):
    req = await decode_body(request, PullRequest, serving.config.listen.max_body_bytes)
    job = await _start(serving, req.named)
    if not req.stream:
        while job.status == "running":
            await asyncio.sleep(POLL)
        if job.status == "failed":
            raise ApiError(502, f"pulling {req.named} failed: {job.error}", param="model")
        serving.pool.refresh()
        return Status(status="success")
    out = NdjsonStream(request)
    await out.start()
    await out.send(Status(status="pulling manifest"))
    while job.status == "running":
        await out.send(_progress(serving, job))
        await asyncio.sleep(POLL)
    if job.status == "failed":
        await out.error(ApiError(502, f"pulling {req.named} failed: {job.error}").envelope())
        return out.response
    await out.send(_progress(serving, job))
    serving.pool.refresh()
    await out.send(Status(status="success"))
    await out.done()
    return out.response


async def delete(request: web.Request, serving: Serving) -> web.Response:
    req = await decode_body(request, ModelRequest, serving.config.listen.max_body_bytes)
    entry = serving.pool.find(served_name(serving, req.named))
    if entry.served.origin != "folder":
        raise bad_request(f"\"{entry.name}\" is named in the server's configuration; remove it there, not "
                          "through /api/delete", "model")
    root, path = serving.config.model_dir.resolve(), Path(entry.served.spec.path).resolve()
    if not path.is_relative_to(root):
        raise ApiError(403, f"\"{entry.name}\" is not in the models folder: only its files are deleted", param="model")
    if entry.info is not None or entry.load_task is not None:
        await serving.unload(entry.name)  # its running requests end first
    await asyncio.to_thread(Path(path).unlink, missing_ok=True)
    serving.pool.refresh()
    return web.Response(status=200)


async def not_supported(request: web.Request, serving: Serving):
    raise ApiError(400, f"{request.method} {request.path} is not supported by this server: it serves RWKV model "
                   "files from its models folder (pull them with /api/pull), and has no Ollama model store to "
                   "create, copy, push or upload blobs to", code="not_supported")
