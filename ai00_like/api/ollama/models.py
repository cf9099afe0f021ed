"""GET /api/version, GET /api/tags, POST /api/show, GET /api/ps: the models as Ollama lists them.

Every model the server can serve is listed (as /v1/models does), the loaded ones in /api/ps.
An RNN has no context window: its `context_length` is the longest prompt this server
accepts for it ([listen] max_prompt_tokens, or the automatic limit), and where that is
unlimited a large number (NO_LIMIT), since clients size their requests by it.
"""

from __future__ import annotations

import hashlib
import time
from pathlib import Path

from aiohttp import web

from ...loaded import prompt_limit
from ..body import decode_body
from ..pool import PoolEntry
from ..serving import Serving
from .names import rfc3339, served_name
from .types import Details, ListedModel, ModelList, ModelRequest, RunningList, RunningModel, ShowResponse, Version

NO_LIMIT = 1 << 20  # tokens: "no limit" as a number (an RNN's prompt may be any length)
PINNED_UNTIL = 10_000_000_000  # Unix time (the year 2286) for a model that is never unloaded
FORMATS = {".pth": "pytorch", ".prefab": "prefab"}


# The version of Ollama whose API these routes follow. Apps check it before they use a
# feature (VS Code's Copilot refuses an Ollama older than 0.6.4), so it is Ollama's number,
# not this package's (which /v1/models and /api/models/info give).
OLLAMA_API_VERSION = "0.14.0"


async def version(request: web.Request, serving: Serving) -> Version:
    return Version(OLLAMA_API_VERSION)


def _file(entry: PoolEntry) -> Path:
    return Path(entry.served.spec.path)


def _size(entry: PoolEntry) -> int:
    try:
        return _file(entry).stat().st_size
    except OSError:
        return 0


def details(entry: PoolEntry) -> Details:
    spec, size = entry.served.spec, _size(entry)
    level = spec.quant_type.upper() if spec.quant and spec.quant_type != "none" else spec.precision.upper()
    return Details(format=FORMATS.get(_file(entry).suffix, "safetensors"),
                   parameter_size=_parameters(entry, size), quantization_level=level)


def _parameters(entry: PoolEntry, size: int) -> str:
    """The count of weights: exact once loaded, else from the file's size (16-bit weights)."""
    info = entry.info.info if entry.info is not None else None
    count = (2 * info.vocab * info.n_embd + info.n_layer * 12 * info.n_embd**2) if info else size // 2
    return f"{count / 1e9:.1f}B" if count >= 1e8 else f"{count / 1e6:.1f}M"


def digest(entry: PoolEntry) -> str:
    """Names this file as it is now (path, size, time): not a hash of its content, which would
    mean reading gigabytes for a listing."""
    try:
        stat = _file(entry).stat()
        key = f"{_file(entry).resolve()}|{stat.st_size}|{stat.st_mtime_ns}"
    except OSError:
        key = str(_file(entry))
    return hashlib.sha256(key.encode()).hexdigest()


def context_length(entry: PoolEntry) -> int:
    spec = entry.served.spec
    limit = prompt_limit(entry.info.spec, entry.info.info) if entry.info is not None else \
        (spec.max_prompt_tokens if spec.max_prompt_tokens > 0 else None)
    return limit or NO_LIMIT


async def tags(request: web.Request, serving: Serving) -> ModelList:
    serving.pool.refresh()
    entries = [e for e in serving.pool.entries.values() if e.info is not None or _file(e).is_file()]
    return ModelList([ListedModel(name=e.name, model=e.name, modified_at=rfc3339(e.created or e.file_created()),
                                  size=_size(e), digest=digest(e), details=details(e)) for e in entries])


async def running(request: web.Request, serving: Serving) -> RunningList:
    models = []
    for e in serving.pool.loaded():
        expires = PINNED_UNTIL if e.pinned else (e.idle_since() or time.time()) + e.keep_alive
        models.append(RunningModel(name=e.name, model=e.name, size=e.memory, digest=digest(e), details=details(e),
                                   expires_at=rfc3339(expires), size_vram=e.memory if e.memory_kind == "video" else 0,
                                   context_length=context_length(e)))
    return RunningList(models)


def capabilities(entry: PoolEntry) -> list[str]:
    thinks = entry.served.spec.thinking != "none"
    return ["completion", "tools", *(["thinking"] if thinks else []), "embedding"]


async def show(request: web.Request, serving: Serving) -> ShowResponse:
    req = await decode_body(request, ModelRequest, serving.config.listen.max_body_bytes)
    entry = serving.pool.find(served_name(serving, req.named))
    info = entry.info.info if entry.info is not None else None
    model_info = {"general.architecture": "rwkv", "rwkv.context_length": context_length(entry)}
    if info is not None:  # known once loaded; /api/show does not load a model
        model_info |= {"rwkv.block_count": info.n_layer, "rwkv.embedding_length": info.n_embd,
                       "rwkv.head_count": info.n_head, "rwkv.vocab_size": info.vocab, "rwkv.version": info.version}
    spec = entry.served.spec
    return ShowResponse(modelfile=f"# served by ai00-like\nFROM {_file(entry).name}\n",
                        parameters=f"num_predict {spec.max_tokens_limit}", template="{{ .Prompt }}",
                        details=details(entry), model_info=model_info, capabilities=capabilities(entry),
                        modified_at=rfc3339(entry.created or entry.file_created()))
