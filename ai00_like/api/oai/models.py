"""GET models and GET models/{id}: every model this server can serve, loaded or not.

Clients fill their model pickers from this list (Open WebUI, LibreChat, the agent SDKs), so
it names every model a request may ask for, with OpenAI's fields and ours: whether it is
loaded, what it takes, whether it thinks, and its prompt limit.
"""

from __future__ import annotations

from pathlib import Path

from aiohttp import web

from ...loaded import prompt_limit
from ..pool import PoolEntry
from ..serving import Serving
from .types import ModelCard, ModelList

OWNER = "ai00-like"


def card(entry: PoolEntry, ids: set[str]) -> ModelCard:
    """`entry` as a list item; `ids` are every model's id (a name that is another model's id is
    not an alias of this one, though both are read from one file)."""
    served, info = entry.served, entry.info
    if info is not None:
        context = prompt_limit(info.spec, info.info)
    else:
        context = served.spec.max_prompt_tokens if served.spec.max_prompt_tokens > 0 else None
    return ModelCard(id=served.name, created=entry.created or entry.file_created(), owned_by=OWNER,
                     status=entry.status, memory_bytes=entry.memory or None, thinking=served.spec.thinking != "none",
                     context_length=context, aliases=sorted(served.names() - ids),
                     keep_alive=entry.keep_alive)


async def list_models(request: web.Request, serving: Serving) -> ModelList:
    serving.pool.refresh()
    # A configured model whose file is not there cannot be picked; it is listed once it is.
    entries = serving.pool.entries
    return ModelList(data=[card(entry, set(entries)) for entry in entries.values()
                           if entry.info is not None or Path(entry.served.spec.path).is_file()])


async def retrieve_model(request: web.Request, serving: Serving) -> ModelCard:
    return card(serving.pool.find(request.match_info["model"]), set(serving.pool.entries))
