"""GET models and GET models/{id}: the one loaded model, under its id."""

from __future__ import annotations

from aiohttp import web

from ..errors import model_not_found
from ..serving import Serving
from .types import ModelCard, ModelList

OWNER = "ai00-like"


def _card(serving: Serving, model_id: str) -> ModelCard:
    return ModelCard(id=model_id, created=serving.model_created, owned_by=OWNER)


async def list_models(request: web.Request, serving: Serving) -> ModelList:
    # Nothing loaded: an empty list, which clients show as "no models" (not an error).
    return ModelList(data=[_card(serving, serving.model_id)] if serving.model else [])


async def retrieve_model(request: web.Request, serving: Serving) -> ModelCard:
    wanted = request.match_info["model"]
    if serving.model is None:
        raise serving.unavailable()
    if wanted not in serving.names_of_model():
        raise model_not_found(wanted, serving.model_id)
    return _card(serving, serving.model_id)
