"""GET /api/models/catalogue, POST and GET /admin/models/pull (ours): the page's Download
panel. The downloads run in the server (hub/jobs.py) into the models folder."""

from __future__ import annotations

import asyncio

from aiohttp import web

from ...hub.catalogue import UnknownModel, load_catalogue
from ...hub.download import PullError
from ...hub.jobs import Job
from ...rwkv.memory import available_bytes
from ..body import decode_body
from ..errors import ApiError, bad_request
from ..serving import Serving
from .types import CatalogueModel, Download, PullRequest


async def catalogue(request: web.Request, serving: Serving) -> list[CatalogueModel]:
    free = await asyncio.to_thread(available_bytes)
    folder = serving.config.model_dir
    return [CatalogueModel(alias=m.alias, repo=m.repo, file=m.file, params=m.params, size=m.size, thinking=m.thinking,
                           fits=m.recommended(free), downloaded=(folder / m.file).is_file())
            for m in load_catalogue()]


async def pull_start(request: web.Request, serving: Serving) -> Download:
    req = await decode_body(request, PullRequest, serving.config.listen.max_body_bytes)
    try:
        job = await asyncio.to_thread(serving.downloads.start, req.name)
    except UnknownModel as e:
        raise bad_request(str(e), "name") from None
    except PullError as e:  # before starting: no such file, no hub to ask, no room on the disk
        code = "model_not_found" if e.missing else e.code or "hub_unreachable"
        raise ApiError(404 if e.missing else 400, str(e), param="name", code=code) from None
    return _download(serving, job)


async def pull_list(request: web.Request, serving: Serving) -> list[Download]:
    return [_download(serving, job) for job in serving.downloads.jobs.values()]


def _download(serving: Serving, job: Job) -> Download:
    model, free = job.model, available_bytes()
    return Download(id=job.id, name=job.name, repo=job.repo, file=job.file, status=job.status,
                    bytes=serving.downloads.done_bytes(job), total=job.total, path=job.path, error=job.error,
                    fits=model.recommended(free) if model else None, thinking=model.thinking if model else None)
