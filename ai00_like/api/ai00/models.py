"""GET /api/models/info, /api/models/list, /api/models/state (SSE) and /api/adapters.

Where Ai00 hangs until a model is loaded, these answer at once and say what is going on
(`loaded`, `loading`, `last_error`); the status stream is plain JSON, not Ai00's JSON
string inside JSON.
"""

from __future__ import annotations

import asyncio
import hashlib
import os
from pathlib import Path

import msgspec
from aiohttp import web

from ...messages import ModelInfoEvent
from ...rwkv.info import ModelInfo
from ..pool import PoolEntry
from ..serving import Serving
from ..throughput import Throughput
from ..sse import EventStream
from .types import (
    Ai00ModelInfo, BudgetStatus, LoraItem, ModelFile, ReloadInfo, ServedModelStatus, ServerStatus, StateItem,
    StateRefInfo,
)

STATUS_INTERVAL = 0.5  # seconds between checks of /api/models/state (Ai00 sends every 0.5 s)
SMALL_FILE = 10 << 20  # files up to this size are hashed whole, larger ones by samples (as Ai00)
MODEL_SUFFIXES = {".st", ".safetensors", ".pth", ".prefab"}


def ai00_info(info: ModelInfo) -> Ai00ModelInfo:
    return Ai00ModelInfo(version=f"V{info.version.split('.')[0]}", num_layer=info.n_layer, num_emb=info.n_embd,
                         num_hidden=info.ffn, num_vocab=info.vocab, num_head=info.n_head, head_size=info.head_size)


def relative_to(path: str, root: Path) -> str:
    try:
        return str(Path(path).resolve().relative_to(root.resolve()))
    except ValueError:
        return path


def _reload_info(spec, root: Path) -> ReloadInfo:
    return ReloadInfo(
        model_path=relative_to(spec.path, root),
        lora=[LoraItem(path=relative_to(lora.path, root), alpha=lora.alpha) for lora in spec.loras],
        state=[StateItem(path=relative_to(s.path, root), name=s.name, id=s.id, default=s.default)
               for s in spec.states],
        token_chunk_size=spec.token_chunk_size, max_batch=spec.max_batch,
        tokenizer_path=spec.tokenizer or "", served_name=spec.name, device=spec.device,
        precision=spec.precision, quant=spec.quant, quant_type=spec.quant_type if spec.quant else "none",
        quant_head=spec.quant_head,
    )


def _rates(serving: Serving, event: ModelInfoEvent) -> tuple[float, float]:
    throughput = serving.throughput.setdefault(event.name, Throughput())
    prompt, generated = throughput.rates(event.counters)
    return round(prompt, 1), round(generated, 1)


def _slot_use(serving: Serving, event: ModelInfoEvent | None) -> dict:
    """SlotUse's fields of a loaded model (none for one that is not loaded)."""
    if event is None:
        return {}
    prompt_rate, generated_rate = _rates(serving, event)
    return dict(slots=event.slots, running=event.running, waiting=event.waiting, cache_entries=event.cache_entries,
                cache_bytes=event.cache_bytes, prompt_tokens_per_second=prompt_rate,
                generated_tokens_per_second=generated_rate)


def _served(serving: Serving, entry: PoolEntry, event: ModelInfoEvent | None) -> ServedModelStatus:
    fields = _slot_use(serving, event)
    return ServedModelStatus(
        id=entry.name, file=relative_to(entry.served.spec.path, serving.config.model_dir), status=entry.status,
        memory_bytes=entry.memory, keep_alive=entry.keep_alive, idle_since=entry.idle_since(),
        users=entry.users, loads=entry.loads, last_error=entry.last_error, **fields)


async def server_status(serving: Serving, focus: str | None = None) -> ServerStatus:
    """Every model's state, the budget, and at the top level (as Ai00 has it) the model
    `focus` (by default the one a request without `model` gets)."""
    live = {event.name: event for event in await serving.all_info()}
    pool = serving.pool
    models = [_served(serving, entry, live.get(entry.name)) for entry in pool.entries.values()]
    limits, loaded = pool.limits, pool.loaded()
    budget = BudgetStatus(memory_bytes=limits.budget, used_bytes=limits.used("system", loaded),
                          video_memory_bytes=limits.video_budget,
                          video_used_bytes=0 if limits.shared else limits.used("video", loaded),
                          max_loaded_models=limits.max_models, loaded_models=len(loaded))
    loading = Path(serving.loading.path).name if serving.loading is not None else None
    focus = focus or serving.model_id
    event = live.get(focus) if focus else None
    if event is None:
        return ServerStatus(loaded=False, loading=loading, last_error=serving.last_error, models=models,
                            budget=budget)
    counters = event.counters
    return ServerStatus(
        loaded=True, loading=loading, last_error=serving.last_error, id=event.name,
        reload=_reload_info(event.spec, serving.config.model_dir),
        model=ai00_info(event.info), states=[StateRefInfo(s.id, s.name, s.default) for s in event.states],
        **_slot_use(serving, event), prompt_tokens=counters.prompt_tokens,
        generated_tokens=counters.generated_tokens, cache_queries=counters.cache_queries,
        cache_hits=counters.cache_hits, cache_hit_tokens=counters.cache_hit_tokens, models=models, budget=budget,
    )


async def models_info(request: web.Request, serving: Serving) -> ServerStatus:
    return await server_status(serving)


async def models_state(request: web.Request, serving: Serving) -> web.StreamResponse:
    """The status as server-sent events: one at once, then one whenever it changes."""
    out = EventStream(request)
    await out.start()
    last, silent = None, 0.0
    while True:
        current = msgspec.json.encode(await server_status(serving))
        if current != last:
            await out.send_raw(current)
            last, silent = current, 0.0
        elif silent >= serving.config.listen.ping_interval:
            await out.ping()
            silent = 0.0
        await asyncio.sleep(STATUS_INTERVAL)
        silent += STATUS_INTERVAL


# ------------------------------------------------------------------------------ model files

_hash_cache: dict[tuple[str, int, int], str] = {}


def file_hash(path: Path) -> str:
    """SHA-256 of the file, or of ten 1 MB samples for files over 10 MB (Ai00's scheme)."""
    st = path.stat()
    key = (str(path), st.st_size, st.st_mtime_ns)
    if key in _hash_cache:
        return _hash_cache[key]
    digest = hashlib.sha256()
    with path.open("rb") as f:
        if st.st_size <= SMALL_FILE:
            for block in iter(lambda: f.read(1 << 20), b""):
                digest.update(block)
        else:
            step = (st.st_size - (1 << 20)) // 9
            for i in range(10):
                f.seek(i * step)
                digest.update(f.read(1 << 20))
    _hash_cache[key] = digest.hexdigest()
    return _hash_cache[key]


def describe_file(path: Path, shown_as: str) -> ModelFile:
    from ...rwkv.loader import read_model_info

    info, error = None, None
    if path.suffix.lower() in MODEL_SUFFIXES:
        try:
            info = ai00_info(read_model_info(path))
        except Exception as e:  # a broken or foreign file is listed, with the reason
            error = str(e)
    return ModelFile(path=shown_as, name=path.name, size=path.stat().st_size, sha=file_hash(path), info=info,
                     error=error)


def list_model_files(root: Path) -> list[ModelFile]:
    if not root.is_dir():
        return []
    files = sorted(p for p in root.iterdir() if p.is_file() and not p.name.startswith("."))
    return [describe_file(p, p.name) for p in files]


async def models_list(request: web.Request, serving: Serving) -> list[ModelFile]:
    # Hashing reads files: keep it off the event loop.
    return await asyncio.to_thread(list_model_files, serving.config.model_dir)


# ------------------------------------------------------------------------------ adapters


def compute_adapters() -> list[str]:
    """"<name> (<backend>)" per device; index 0 is the CPU, which always exists."""
    adapters = [f"CPU ({os.cpu_count()} threads, numpy)"]
    try:
        import wgpu  # optional: the GPU backend's library
    except ImportError:
        return adapters
    try:
        for adapter in wgpu.gpu.enumerate_adapters_sync():
            info = adapter.info
            adapters.append(f"{info.get('device', 'adapter')} ({info.get('backend_type', '?')})")
    except Exception:  # a broken driver must not break the listing
        pass
    return adapters


async def adapters(request: web.Request, serving: Serving) -> list[str]:
    return await asyncio.to_thread(compute_adapters)
