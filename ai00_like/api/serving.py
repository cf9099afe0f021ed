"""What the HTTP tier knows about the model being served, and its way to the middleware.

Every load and unload passes through here, so the model the handlers see is the one the
middleware holds; handlers can refuse a request at once (503 while nothing is loaded,
404 for another model's name) without a round trip to the serving threads.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
import time
from pathlib import Path

from ..config import Config
from ..hub.jobs import Downloads
from ..messages import Failed, GetInfo, Load, Loaded, ModelInfoEvent, ModelSpec, Unload
from ..middleware import Middleware
from ..response_store import StoreError, open_store
from .channel import EventChannel
from .errors import ApiError, model_not_found
from .metrics import Metrics
from .throughput import Throughput

log = logging.getLogger(__name__)


class Serving:
    def __init__(self, config: Config, middleware: Middleware):
        self.config = config
        self.middleware = middleware
        self.model: ModelInfoEvent | None = None
        self.model_created = 0  # the model file's mtime, as Ollama reports `created`
        self.loading: ModelSpec | None = None
        self.last_error: str | None = None
        self.listen_host = config.listen.ip  # where the server listens (--ip wins over the config)
        self._loaded = asyncio.Event()  # set whenever a load attempt has ended
        self.throughput = Throughput()
        self.metrics = Metrics(config.listen.replica)
        self.loads = 0
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

    # ------------------------------------------------------------------ the model

    @property
    def model_id(self) -> str | None:
        return self.model.name if self.model else None

    def names_of_model(self) -> set[str]:
        """Every name a request may use for the loaded model."""
        if self.model is None:
            return set()
        return {self.model.name, Path(self.model.path).name, Path(self.model.path).stem, *self.config.model.aliases}

    def require_model(self, requested: str | None) -> ModelInfoEvent:
        """The loaded model, if `requested` may name it (absent or empty: any model will do).

        We accept the model's id, its file name and the configured aliases, and answer
        404 model_not_found for any other name (instead of llama.cpp's "ignore the field"),
        so a client that picked a model from another server learns it at once.
        """
        model = self.model
        if model is None:
            raise self.unavailable()
        if requested and requested not in self.names_of_model():
            raise model_not_found(requested, model.name)
        return model

    async def live_info(self) -> ModelInfoEvent | None:
        """The middleware's current view (slot use, cache size), or None when nothing is loaded."""
        if self.model is None:
            return None
        channel = EventChannel()
        self.middleware.send(GetInfo(channel.reply()))
        event = await channel.first()
        return event if isinstance(event, ModelInfoEvent) else None

    def unavailable(self) -> ApiError:
        if self.loading is not None:
            return ApiError(503, f"The model {Path(self.loading.path).name} is still loading; retry shortly.",
                            code="model_loading", headers={"Retry-After": "2"})
        detail = f" (last load failed: {self.last_error})" if self.last_error else ""
        return ApiError(503, f"No model is loaded{detail}.", code="model_not_loaded", headers={"Retry-After": "5"})

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
        """Load (or replace) the model; the old one keeps serving until the new one is ready.

        Shielded: a client that disconnects while its load runs must not leave this tier
        believing in a model other than the one the middleware ends up holding.
        """
        task = asyncio.ensure_future(self._load(spec))
        task.add_done_callback(_retrieve)  # nobody may be left to await a failure
        return await asyncio.shield(task)

    async def _load(self, spec: ModelSpec) -> ModelInfoEvent:
        self.loading = spec
        self._loaded.clear()
        channel = EventChannel()
        started = time.monotonic()
        log.info("loading model %s", spec.path)
        bar = _progress_bar(Path(spec.path).name)
        self.middleware.send(Load(spec, channel.reply(), bar.update if bar else None))
        try:
            event = await channel.first()
        finally:
            if bar:
                bar.close()
            if self.loading is spec:  # a later load may have started meanwhile
                self.loading = None
                self._loaded.set()
        if isinstance(event, Loaded):
            self.model, self.last_error = event.info, None
            self.loads += 1  # /metrics: the backend's totals restart with each load
            try:
                self.model_created = int(os.stat(spec.path).st_mtime)
            except OSError:
                self.model_created = int(time.time())
            info = event.info.info
            log.info("model %s loaded in %.1f s: RWKV v%s, %d layers, %d dims, vocab %d, %d slots",
                     event.info.name, time.monotonic() - started, info.version, info.n_layer, info.n_embd,
                     info.vocab, event.info.slots)
            return event.info
        message = event.message if isinstance(event, Failed) else f"unexpected reply {event!r}"
        self.last_error = message
        log.error("loading %s failed: %s", spec.path, message)
        # load_failed: the file or settings the client chose cannot be loaded; else our bug.
        client_side = isinstance(event, Failed) and event.kind == "load_failed"
        raise ApiError(400 if client_side else 500, f"Loading the model failed: {message}", code="load_failed")

    async def unload(self) -> None:
        await asyncio.shield(asyncio.ensure_future(self._unload()))

    async def _unload(self) -> None:
        channel = EventChannel()
        self.middleware.send(Unload(channel.reply()))
        await channel.first()
        self.model = None
        log.info("model unloaded")

    async def wait_idle(self) -> None:
        """Until no load is in progress (tests and benchmarks wait for the startup load)."""
        while self.loading is not None:
            await self._loaded.wait()

    def start_configured_load(self) -> asyncio.Task | None:
        """Startup: load the configured model in the background while the server listens."""
        spec = self.config.model_spec()
        if spec is None:
            log.warning("no model configured ([model] name is empty): inference routes answer 503 until one "
                        "is loaded")
            return None
        if not Path(spec.path).is_file():
            self.last_error = f"model file {spec.path} not found"
            log.warning("model file %s not found: inference routes answer 503 until a model is loaded", spec.path)
            return None
        self.loading = spec  # visible to requests that arrive before the task first runs

        async def load_quietly():
            try:
                await self.load(spec)
            except ApiError:
                pass  # already logged; the server keeps serving with no model

        return asyncio.get_running_loop().create_task(load_quietly())


def _retrieve(task: asyncio.Task) -> None:
    if not task.cancelled():
        task.exception()


class _LayerBar:
    """A tqdm bar over the layers being prepared, shown only on an interactive terminal."""

    def __init__(self, name: str):
        from tqdm import tqdm

        self.bar = tqdm(desc=f"loading {name}", unit="layer", leave=False, file=sys.stderr)

    def update(self, done: int, total: int) -> None:  # called from the loading thread
        self.bar.total = total
        self.bar.n = done
        self.bar.refresh()

    def close(self) -> None:
        self.bar.close()


def _progress_bar(name: str) -> _LayerBar | None:
    return _LayerBar(name) if sys.stderr.isatty() else None
