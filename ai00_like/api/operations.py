"""The operations routes: GET /metrics for Prometheus and GET /health for load balancers."""

from __future__ import annotations

from typing import Literal

import msgspec
from aiohttp import web
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from .serving import Serving


async def metrics_route(request: web.Request, serving: Serving) -> web.Response:
    loads = {entry.name: entry.loads for entry in serving.pool.entries.values()}
    body = await serving.metrics.exposition(await serving.all_info(), loads)
    # prometheus_client's content type carries its own charset parameter.
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


class Health(msgspec.Struct, kw_only=True, omit_defaults=True):
    """GET /health: `ok` with the default model's id, or (with status 503) `loading` (a model
    of `load = "startup"` is not ready yet) / `no_model` (nothing to serve) / `draining`."""

    status: Literal["ok", "loading", "no_model", "draining"]
    model: str | None = None


async def health_route(request: web.Request, serving: Serving) -> Health | web.Response:
    """200 once the server can serve: a model is loaded, or (with no model to load at start)
    there are models to load on demand; 503 while a startup model loads, with nothing to
    serve, or while shutting down (load balancers, k8s)."""
    entries = serving.pool.entries.values()
    startup = [e for e in entries if e.served.load == "startup"]
    if serving.draining:  # shutting down: no new work, whatever else is true
        health = Health(status="draining", model=serving.model_id)
    elif any(e.load_task is not None and e.info is None for e in startup):
        health = Health(status="loading")
    elif serving.pool.loaded() or (not startup and entries):
        return Health(status="ok", model=serving.model_id)
    else:
        health = Health(status="no_model")
    return web.Response(body=msgspec.json.encode(health), status=503, content_type="application/json",
                        headers={"Retry-After": "2"})
