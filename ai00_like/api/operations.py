"""The operations routes: GET /metrics for Prometheus and GET /health for load balancers."""

from __future__ import annotations

from typing import Literal

import msgspec
from aiohttp import web
from prometheus_client.exposition import CONTENT_TYPE_LATEST

from .serving import Serving


async def metrics_route(request: web.Request, serving: Serving) -> web.Response:
    load = serving.loads
    body = await serving.metrics.exposition(await serving.live_info(), load)
    # prometheus_client's content type carries its own charset parameter.
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE_LATEST})


class Health(msgspec.Struct, kw_only=True, omit_defaults=True):
    """GET /health: `ok` with the model's id, or (with status 503) `loading` / `no_model` /
    `draining` (shutting down)."""

    status: Literal["ok", "loading", "no_model", "draining"]
    model: str | None = None


async def health_route(request: web.Request, serving: Serving) -> Health | web.Response:
    """200 once a model is ready; 503 while one loads, none is loaded or the server is
    shutting down (load balancers, k8s)."""
    if serving.draining:  # shutting down: no new work, whatever else is true
        health = Health(status="draining", model=serving.model_id)
    elif serving.model is not None:
        return Health(status="ok", model=serving.model.name)
    else:
        health = Health(status="loading" if serving.loading is not None else "no_model")
    return web.Response(body=msgspec.json.encode(health), status=503, content_type="application/json",
                        headers={"Retry-After": "2"})
