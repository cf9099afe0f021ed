"""What the HTTP tier knows about the models it serves, and its way to the middleware.

Handlers ask `model_for(req.model)` for their model: the pool (api/pool.py) loads it if
need be and leases it for the request; a name no model answers to is refused at once (404).
Generations under way are kept here too, for a graceful shutdown.
"""

from __future__ import annotations

import asyncio
import logging
from pathlib import Path

from ..config import Config
from ..hub.jobs import Downloads
from ..messages import ListLoaded, LoadedModels, ModelInfoEvent, ModelSpec
from ..middleware import Middleware
from ..response_store import StoreError, open_store
from .channel import EventChannel
from .errors import ApiError
from .keep_alive import keep_alive_seconds
from .metrics import Metrics
from .pool import ModelPool
from .sse import keep_alive_while
from .throughput import Throughput

log = logging.getLogger(__name__)


class Serving:
    def __init__(self, config: Config, middleware: Middleware):
        self.config = config
        self.middleware = middleware
        self.pool = ModelPool(config, middleware)
        self.listen_host = config.listen.ip  # where the server listens (--ip wins over the config)
        self.throughput: dict[str, Throughput] = {}  # per model
        self.metrics = Metrics(config.listen.replica)
        # Graceful shutdown (api/app.py): the generations under way, so they can be waited
        # for and then ended. `draining` (set first) takes this replica out of a load
        # balancer's rotation through /health; `closing` then refuses new requests.
        self.draining = False
        self.closing = False
        self.active_runs: set = set()
        self._no_runs = asyncio.Event()
        self._no_runs.set()
        self.hurry = asyncio.Event()  # set by a second signal: end the grace period now
        self.downloads = Downloads(config.model_dir)  # the page's pulls from the hub
        self.responses, self.store_off = self._open_store(config)

    @staticmethod
    def _open_store(config: Config):
        """(SQLite beside the server or Redis shared by replicas, or None; why it is off).
        A store that cannot be opened stops the server unless `[responses] required = false`."""
        try:
            return open_store(config), "[responses] store = false"
        except StoreError as e:
            if config.responses.required:
                raise
            log.error("%s. Serving without stored responses ([responses] required = false)", str(e).rstrip("."))
            return None, str(e)

    # ------------------------------------------------------------------ the models

    @property
    def model(self) -> ModelInfoEvent | None:
        """The model a request without `model` gets, if it is loaded (a one-model server's model)."""
        try:
            entry = self.pool.find(None)
        except ApiError:
            return None
        return entry.info

    @property
    def model_id(self) -> str | None:
        return self.model.name if self.model else None

    @property
    def last_error(self) -> str | None:
        errors = [e.last_error for e in self.pool.entries.values() if e.last_error]
        return errors[-1] if errors else None

    @property
    def loading(self) -> ModelSpec | None:
        """A model being loaded, if any."""
        entry = next((e for e in self.pool.entries.values() if e.load_task is not None), None)
        return entry.served.spec if entry is not None else None

    async def model_for(self, requested: str | None, *, stream: bool = False,
                        keep_alive: float | str | None = None) -> ModelInfoEvent:
        """The model a request names, loaded (loading it if need be) and leased until the
        request ends (api/pool.py); `keep_alive` (the request's) becomes its idle time from
        then on. A stream that must wait for a load starts at once and is kept alive with
        pings meanwhile (sse.py's early stream)."""
        idle = keep_alive_seconds(keep_alive)
        entry = self.pool.lease(requested)
        if idle is not None:
            self.pool.set_keep_alive(entry, idle)
        if not stream or entry.info is not None and entry.unload_task is None:
            return await self.pool.ready(entry)
        return await keep_alive_while(asyncio.ensure_future(self.pool.ready(entry)), self.config.listen.ping_interval)

    async def all_info(self) -> tuple[ModelInfoEvent, ...]:
        """Every loaded model's current view."""
        channel = EventChannel()
        self.middleware.send(ListLoaded(channel.reply()))
        event = await channel.first()
        return event.models if isinstance(event, LoadedModels) else ()

    # ------------------------------------------------------------------ generations under way

    def run_started(self, run) -> None:
        self.active_runs.add(run)
        self._no_runs.clear()

    def run_ended(self, run) -> None:
        self.active_runs.discard(run)
        if not self.active_runs:
            self._no_runs.set()

    async def drain(self, grace: float, *, settle: float = 10.0) -> int:
        """Wait up to `grace` seconds for the generations under way, then cancel the rest:
        they end as if they had stopped (streams still send their finish and [DONE]).
        Returns how many had to be cancelled."""
        waits = [asyncio.ensure_future(self._no_runs.wait()), asyncio.ensure_future(self.hurry.wait())]
        await asyncio.wait(waits, timeout=grace, return_when=asyncio.FIRST_COMPLETED)
        for w in waits:
            w.cancel()
        if not self.active_runs:
            return 0
        left = list(self.active_runs)
        for run in left:
            run.cancel.set()
        try:  # the backend answers a cancel within one step
            await asyncio.wait_for(self._no_runs.wait(), settle)
        except TimeoutError:
            log.warning("%d generations did not end after being cancelled", len(self.active_runs))
        return len(left)

    # ------------------------------------------------------------------ lifecycle

    async def load(self, spec: ModelSpec) -> ModelInfoEvent:
        """Load (or load anew) the model `spec` names; its old copy keeps serving until the new
        one is ready. Shielded: a client that leaves does not stop a load half way."""
        entry = self.pool.entry_for(spec)
        return await asyncio.shield(self.pool.ensure_loaded(entry, spec))

    async def unload(self, model: str | None = None) -> None:
        """Unload `model` (None: every model) once its running requests have ended."""
        entries = [self.pool.find(model)] if model else self.pool.loaded()
        await asyncio.shield(asyncio.gather(*(self.pool.unload(e) for e in entries if e.info is not None)))

    async def wait_idle(self) -> None:
        """Until no load is in progress (tests and benchmarks wait for the startup loads)."""
        while tasks := [e.load_task for e in self.pool.entries.values() if e.load_task is not None]:
            await asyncio.wait(tasks)

    def start_configured_load(self) -> asyncio.Task | None:
        """Startup: load the models with `load = "startup"` ([model] among them) in the
        background while the server listens."""
        entries = [e for e in self.pool.entries.values() if e.served.load == "startup"]
        if not entries:
            log.warning("no model is loaded at start: each loads when a request first names it")
            return None
        for entry in entries:
            if not Path(entry.served.spec.path).is_file():
                entry.last_error = f"model file {entry.served.spec.path} not found"
                log.warning("model file %s not found: requests for %s answer 503 until it is there",
                            entry.served.spec.path, entry.name)
        # Visible as loading at once, to requests that arrive before the loads first run.
        loads = [self.pool.start_load(e) for e in entries if e.last_error is None]
        return asyncio.ensure_future(asyncio.wait(loads)) if loads else None
