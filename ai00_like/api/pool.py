"""Which models are loaded: loading on first use, unloading when idle, within one budget.

Every model the server can serve (served.py) has a PoolEntry here. A request leases its
model (`acquire`) for as long as its handler runs: a model with a lease, running or still
waiting for its load, is never evicted. The first request for a model that is not loaded
starts its load and every later one waits for that same load (one flight). Before a load,
room is made within `[server] max_loaded_models` and `memory_budget` by unloading the least
recently used idle models that are not pinned (`keep_alive = -1`); when nothing can make
room the request gets a 503 naming the models that hold the memory. A model whose last
lease ended unloads after its keep_alive, counted from then: listings, health checks and
metrics never lease a model, so they do not keep it alive.

Everything here runs on the event loop, so the counts need no lock; the middleware is told
only what to load and unload, and says what a loaded model really takes.
"""

from __future__ import annotations

import asyncio
import logging
import time
from contextvars import ContextVar
from dataclasses import dataclass

from msgspec.structs import replace
from pathlib import Path
from typing import Protocol

from ..config import Config, memory_budget_bytes
from ..messages import Failed, Load, Loaded, ModelInfoEvent, ModelSpec, Unload
from ..rwkv.gpu.device import best_adapter
from ..rwkv.gpu.video_memory import free_video_bytes, memory_of_device
from ..rwkv.memory import available_bytes, estimated_footprint
from ..served import PINNED, FolderModels, ServedModel
from .channel import EventChannel
from .errors import ApiError, model_not_found
from .progress import layer_bar

log = logging.getLogger(__name__)

AUTO_SHARE = 0.8  # "auto": this share of the memory free at start
# The leases the running handler holds (api/app.py's endpoint opens a list per request).
LEASES: ContextVar[list | None] = ContextVar("leases", default=None)


@dataclass
class PoolEntry:
    served: ServedModel
    keep_alive: float
    info: ModelInfoEvent | None = None  # while loaded
    load_task: asyncio.Task | None = None  # the load in flight, which every waiter shares
    unload_task: asyncio.Task | None = None
    users: int = 0  # leases: requests running or waiting for the load
    waiting: int = 0  # of them, those waiting for an unload to end (to load it again)
    last_used: float = 0.0  # time.monotonic() when the last lease ended
    memory: int = 0  # measured once loaded; before that, estimated
    memory_kind: str = "system"  # whose memory it takes: "system", or "video" on a discrete GPU
    created: int = 0  # the file's mtime, as OpenAI's `created`
    loads: int = 0
    last_error: str | None = None
    timer: asyncio.TimerHandle | None = None

    @property
    def name(self) -> str:
        return self.served.name

    @property
    def status(self) -> str:
        if self.load_task is not None:
            return "loading"
        return "loaded" if self.info is not None else "unloaded"

    @property
    def pinned(self) -> bool:
        return self.keep_alive < 0

    def file_created(self) -> int:
        self.created = _mtime(self.served.spec.path)
        return self.created

    def idle_seconds(self) -> float:
        return time.monotonic() - self.last_used if self.users == 0 and self.last_used else 0.0

    def idle_since(self) -> int | None:
        """Unix time the last request on it ended (None while one runs, or before the first)."""
        if self.users or not self.last_used:
            return None
        return round(time.time() - self.idle_seconds())


@dataclass(frozen=True)
class Limits:
    """[server] max_loaded_models and memory_budget. A budget in bytes holds every model
    together, wherever it is; "auto" gives the system's memory and a discrete GPU's each a
    share of what is free at start (None where it is not known: no byte cap)."""

    max_models: int
    shared: bool
    budget: int | None
    video_budget: int | None

    @classmethod
    def of(cls, config: Config) -> Limits:
        explicit = memory_budget_bytes(config.server.memory_budget)
        if explicit is not None:
            return cls(config.server.max_loaded_models, True, explicit, None)
        system = available_bytes()
        adapter = best_adapter(allow_software=False)
        video = free_video_bytes(adapter.vendor_id) if adapter is not None and adapter.own_memory else None
        share = lambda free: None if free is None else int(free * AUTO_SHARE)  # noqa: E731
        return cls(config.server.max_loaded_models, False, share(system), share(video))

    def cap(self, kind: str) -> int | None:
        """The bytes models of this memory may take together."""
        return self.budget if self.shared or kind == "system" else self.video_budget

    def used(self, kind: str, loaded: list[PoolEntry]) -> int:
        return sum(e.memory for e in loaded if self.shared or e.memory_kind == kind)

    def fit(self, entry: PoolEntry, others: list[PoolEntry]) -> bool:
        """Whether `entry` fits beside the loaded `others`."""
        if self.max_models and len(others) + 1 > self.max_models:
            return False
        cap = self.cap(entry.memory_kind)
        return cap is None or self.used(entry.memory_kind, others) + entry.memory <= cap


class Sender(Protocol):
    """The middleware, as the pool uses it."""

    def send(self, message) -> None: ...


class ServedModels:
    """Every model the server can serve, by name: the configured ones, the models folder's
    files, and the ones an admin load added."""

    def __init__(self, config: Config):
        self.folder = FolderModels(config.model_dir, enabled=config.server.serve_folder,
                                   max_prompt_tokens=config.listen.max_prompt_tokens,
                                   disk_cache=config.disk_cache())
        self.entries: dict[str, PoolEntry] = {}
        for served in configured_models(config):
            self.entries[served.name] = PoolEntry(served, served.keep_alive)
        self.refresh()
        # What a request without `model` gets: [model], else the first of [[models]], else
        # the folder's first file.
        self.default = next(iter(self.entries), None)

    # ------------------------------------------------------------------ what can be served

    def refresh(self) -> None:
        """Add the models folder's new files; drop entries of files gone that are not loaded."""
        named = {Path(e.served.spec.path).resolve() for e in self.entries.values() if e.served.origin != "folder"}
        taken = {name for e in self.entries.values() if e.served.origin != "folder" for name in e.served.names()}
        found = {s.name: s for s in self.folder.scan(named, taken)}
        for name, entry in list(self.entries.items()):
            if entry.served.origin == "folder" and name not in found and entry.status == "unloaded":
                del self.entries[name]
        for name, served in found.items():
            self.entries.setdefault(name, PoolEntry(served, served.keep_alive))

    def find(self, requested: str | None) -> PoolEntry:
        """The entry a request's `model` names (absent: the default), or 404 naming those served."""
        if not requested:
            default = self.entries.get(self.default) if self.default else None
            loaded = self.loaded()
            # The default, unless it is not loaded and exactly one other model is.
            if default is not None and (default.info is not None or len(loaded) != 1):
                return default
            if loaded:
                return loaded[0]
            raise ApiError(503, "No model is configured, and none is in the models folder.",
                           code="model_not_loaded", headers={"Retry-After": "5"})
        entry = self._named(requested)
        if entry is None:
            self.refresh()  # a file may have arrived since
            entry = self._named(requested)
        if entry is None:
            raise model_not_found(requested, ", ".join(sorted(self.entries)) or "no model")
        return entry

    def _named(self, requested: str) -> PoolEntry | None:
        if requested in self.entries:
            return self.entries[requested]
        return next((e for e in self.entries.values() if requested in e.served.names()), None)

    def _of_file(self, path: str) -> PoolEntry | None:
        """The entry that serves this file, or one named after it."""
        target = Path(path).resolve()
        same = [e for e in self.entries.values() if Path(e.served.spec.path).resolve() == target]
        return same[0] if same else self.entries.get(target.stem)

    def entry_for(self, spec: ModelSpec) -> PoolEntry:
        """The entry of the model an admin load names (by served name, else its file's stem),
        taking `spec` as its settings; a new name adds a model, pinned, as the admin asked for it."""
        entry = self.entries.get(spec.name) if spec.name else self._of_file(spec.path)
        name = entry.name if entry is not None else spec.name or Path(spec.path).stem
        spec = replace(spec, name=name)
        if entry is None:
            entry = self.entries[name] = PoolEntry(ServedModel(name=name, spec=spec, origin="admin"), PINNED)
        else:
            entry.served = replace(entry.served, spec=spec)
        entry.memory = 0 if entry.info is None else entry.memory  # settings may have changed its size
        entry.keep_alive = entry.served.keep_alive  # pinned again if it was, before another took its place
        return entry

    def loaded(self) -> list[PoolEntry]:
        return [e for e in self.entries.values() if e.info is not None]


class ModelPool(ServedModels):
    def __init__(self, config: Config, middleware: Sender):
        super().__init__(config)
        self.middleware = middleware
        self.limits = Limits.of(config)
        self._room = asyncio.Lock()  # one load (and the evictions before it) at a time

    # ------------------------------------------------------------------ leases

    def lease(self, requested: str | None) -> PoolEntry:
        """The entry a request names, leased until the request's handler ends (taken at once,
        before anything is awaited, so that nothing can evict it meanwhile)."""
        entry = self.find(requested)
        leases = LEASES.get()
        if leases is not None:  # outside a request (library use, tests) there is nothing to hold
            entry.users += 1
            leases.append(entry)
            if entry.timer is not None:
                entry.timer.cancel()
                entry.timer = None
        return entry

    async def ready(self, entry: PoolEntry) -> ModelInfoEvent:
        """`entry` loaded: at once if it is, else after its load (one for every waiter)."""
        while entry.info is None or entry.unload_task is not None:
            if entry.unload_task is not None:  # being unloaded: then loaded again for this request
                entry.waiting += 1
                try:
                    await asyncio.shield(entry.unload_task)
                finally:
                    entry.waiting -= 1
                continue
            await self.ensure_loaded(entry)
        return entry.info

    def release(self, leases: list[PoolEntry]) -> None:
        """The handler that held `leases` has ended."""
        for entry in leases:
            entry.users -= 1
            entry.last_used = time.monotonic()
            if entry.users == 0:
                self._idle(entry)

    def _idle(self, entry: PoolEntry) -> None:
        if entry.info is None or entry.pinned:
            return
        if entry.timer is not None:
            entry.timer.cancel()
        loop = asyncio.get_running_loop()
        entry.timer = loop.call_later(max(entry.keep_alive, 0.0), self._expire, entry)

    def _expire(self, entry: PoolEntry) -> None:
        entry.timer = None
        if entry.users == 0 and entry.info is not None and entry.unload_task is None and not entry.pinned:
            log.info("model %s idle for %.0f s: unloading", entry.name, entry.keep_alive)
            self.unload(entry)

    def set_keep_alive(self, entry: PoolEntry, seconds: float, *, admin: bool = False) -> None:
        """This model's idle time from now on (-1 pins it). A request's keep_alive does not
        apply to a model the configuration pins: on a shared server any caller could
        otherwise unload the operator's model after each of its requests; the admin routes can."""
        if entry.served.keep_alive < 0 and not admin:
            return
        entry.keep_alive = seconds
        if entry.users == 0:
            self._idle(entry)

    def make_default(self, entry: PoolEntry) -> None:
        """An Ai00-style load (by file) replaces the model that requests without `model` get:
        the one it replaces is unloaded once idle; one an admin load added goes from the list,
        a configured one or a folder's file stays served on demand."""
        old = self.entries.get(self.default) if self.default else None
        self.default = entry.name
        if old is None or old is entry:
            return
        if old.served.origin == "admin":
            task = self.unload(old)
            task.add_done_callback(lambda _, name=old.name: self._forget(name))
        elif old.info is not None:
            old.keep_alive = max(old.served.keep_alive, 0.0)  # pinned as the default: no longer
            if old.users == 0:
                self.unload(old)

    def _forget(self, name: str) -> None:
        entry = self.entries.get(name)
        if entry is not None and entry.served.origin == "admin" and entry.info is None and name != self.default:
            del self.entries[name]

    # ------------------------------------------------------------------ loading

    def start_load(self, entry: PoolEntry, spec: ModelSpec | None = None) -> asyncio.Task:
        """Load `entry` (with `spec`: load it anew, its old copy serving meanwhile), unless a
        load of it is under way already: every waiter shares that one."""
        if entry.load_task is None:
            entry.load_task = asyncio.ensure_future(self._load(entry, spec or entry.served.spec))
            entry.load_task.add_done_callback(lambda task, e=entry: _loaded(e, task))
        return entry.load_task

    async def ensure_loaded(self, entry: PoolEntry, spec: ModelSpec | None = None) -> ModelInfoEvent:
        return await asyncio.shield(self.start_load(entry, spec))

    async def _load(self, entry: PoolEntry, spec: ModelSpec) -> ModelInfoEvent:
        if not Path(spec.path).is_file():  # it may come: a download, a copy under way
            entry.last_error = f"model file {Path(spec.path).name} not found"
            raise ApiError(503, f"The model {entry.name} cannot be loaded: its file {Path(spec.path).name} is not in "
                           "the models folder.", code="model_not_loaded", headers={"Retry-After": "5"})
        async with self._room:
            if entry.info is None:
                await self._make_room(entry, spec)
            channel = EventChannel()
            started = time.monotonic()
            log.info("loading model %s from %s", entry.name, spec.path)
            bar = layer_bar(Path(spec.path).name)
            self.middleware.send(Load(spec, channel.reply(), bar.update if bar else None))
            try:
                event = await channel.first()
            finally:
                if bar:
                    bar.close()
        if not isinstance(event, Loaded):
            message = event.message if isinstance(event, Failed) else f"unexpected reply {event!r}"
            entry.last_error = message
            log.error("loading %s failed: %s", spec.path, message)
            client_side = isinstance(event, Failed) and event.kind == "load_failed"
            raise ApiError(400 if client_side else 500, f"Loading the model {entry.name} failed: {message}",
                           code="load_failed")
        info = event.info
        entry.info, entry.memory, entry.last_error, entry.loads = info, info.memory_bytes, None, entry.loads + 1
        entry.memory_kind = info.memory_kind
        entry.last_used = time.monotonic()
        entry.created = _mtime(spec.path)
        log.info("model %s loaded in %.1f s: RWKV v%s, %d layers, %d dims, vocab %d, %d slots, %.0f MiB",
                 entry.name, time.monotonic() - started, info.info.version, info.info.n_layer, info.info.n_embd,
                 info.info.vocab, info.slots, info.memory_bytes / 2**20)
        if entry.users == 0:
            self._idle(entry)
        return info

    async def _make_room(self, entry: PoolEntry, spec: ModelSpec) -> None:
        """Unload least recently used idle models until `entry` fits, or raise the 503."""
        if not entry.memory:
            entry.memory, entry.memory_kind = await asyncio.to_thread(_estimate, spec)
        while not self._fits(entry):
            victim = min(self._evictable(entry), key=lambda e: e.last_used, default=None)
            if victim is None:
                raise no_room(entry, self.loaded(), self.limits.max_models, self.limits.cap(entry.memory_kind))
            log.info("unloading %s (idle %.0f s) to make room for %s", victim.name, victim.idle_seconds(), entry.name)
            await self._unload(victim)

    def _fits(self, entry: PoolEntry) -> bool:
        return self.limits.fit(entry, [e for e in self.loaded() if e is not entry])

    def _evictable(self, entry: PoolEntry) -> list[PoolEntry]:
        return [e for e in self.loaded() if e is not entry and e.users == 0 and not e.pinned
                and e.unload_task is None and e.load_task is None]

    # ------------------------------------------------------------------ unloading

    def unload(self, entry: PoolEntry) -> asyncio.Task:
        """Unload once its running requests have ended; requests that arrive meanwhile wait
        and load it again. Returns the unload, which every caller shares."""
        if entry.unload_task is None:
            entry.unload_task = asyncio.ensure_future(self._unload(entry))
        return entry.unload_task

    async def _unload(self, entry: PoolEntry) -> None:
        if entry.load_task is not None:  # a load under way ends first, whether it worked or not
            await asyncio.wait([entry.load_task])
        try:
            # A request still running on it finishes first; those waiting for this unload
            # (to load it again) do not count, nor the asker's own lease.
            while entry.users - entry.waiting > self._own_leases(entry):
                await asyncio.sleep(0.05)
            channel = EventChannel()
            self.middleware.send(Unload(channel.reply(), model=entry.name))
            await channel.first()
            entry.info = None
            log.info("model %s unloaded", entry.name)
        finally:
            entry.unload_task = None
            if entry.timer is not None:
                entry.timer.cancel()
                entry.timer = None

    @staticmethod
    def _own_leases(entry: PoolEntry) -> int:
        """The leases the task asking for the unload holds on `entry` itself."""
        return sum(e is entry for e in LEASES.get() or ())


def configured_models(config: Config) -> list[ServedModel]:
    """[model] (loaded at start and kept, as a one-model server always did) and [[models]]."""
    served = []
    if (spec := config.model_spec()) is not None:
        served.append(ServedModel(name=spec.name, spec=spec, aliases=tuple(config.model.aliases), load="startup"))
    for section in config.models:
        spec = config.spec_of(section, tokenizer=section.tokenizer, loras=section.lora, states=section.state)
        served.append(ServedModel(name=spec.name, spec=spec, aliases=tuple(section.aliases),
                                  keep_alive=section.keep_alive, load=section.load))
    return served



def no_room(entry: PoolEntry, loaded: list[PoolEntry], max_models: int, budget: int | None) -> ApiError:
    """The 503 when no idle, unpinned model can make room for `entry`: what holds the memory."""
    holders = ", ".join(f"{e.name} ({e.memory / 2**20:.0f} MiB, {'pinned' if e.pinned else 'busy'})"
                        for e in loaded) or "none"
    limits = []
    if max_models:
        limits.append(f"[server] max_loaded_models = {max_models}")
    if budget is not None:
        limits.append(f"a memory budget of {budget / 2**20:.0f} MiB")
    return ApiError(503, f"There is no room to load {entry.name} (about {entry.memory / 2**20:.0f} MiB) within "
                    f"{' and '.join(limits)}: the loaded models are in use or pinned: {holders}. Retry when "
                    "they are idle.", code="model_capacity", headers={"Retry-After": "10"})


def _loaded(entry: PoolEntry, task: asyncio.Task) -> None:
    entry.load_task = None
    if not task.cancelled():
        task.exception()  # retrieved: a failure was told to every waiter


def _estimate(spec: ModelSpec) -> tuple[int, str]:
    """(bytes, whose memory) a model will take, before it is loaded."""
    try:
        weights = estimated_footprint(spec.path, spec.precision, spec.quant, spec.quant_type, spec.max_batch)
    except Exception:  # not readable: the load will say why
        weights = 0
    return weights + spec.cache_bytes, memory_of_device(spec.device)


def _mtime(path: str) -> int:
    try:
        return int(Path(path).stat().st_mtime)
    except OSError:
        return int(time.time())
