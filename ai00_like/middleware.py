"""The middleware thread: owns the loaded models' lifecycle and routes the HTTP tier's messages.

Each loaded model has its own backend thread (its slots, batcher and prefix state cache);
every request names its model by served name and goes to that model's backend. Load builds
a model, tokenizer and backend in a worker thread while the model's old copy, if any,
keeps serving, then swaps them in; a failed load reports its error and changes nothing.
Which models to load and unload, and when, is the HTTP tier's policy (api/pool.py); this
thread does what it is told. Generate is tokenised here, given its samplers and initial
state, and handed to the backend. A request for a model that is not loaded fails at once.
"""

from __future__ import annotations

import contextlib
import errno
import logging
import os
import queue
import threading
from collections import deque
from pathlib import Path

import msgspec

from .loaded import LoadedModel, build
from .messages import (
    Choose, ChooseJob, Embed, EmbedJob, Failed, Generate, GenerateJob, GetInfo, ListLoaded, Load, Loaded, LoadedModels,
    ReadState,
    Save, Saved, ScoreJob, ScorePrompt, StateJob, Unload, Unloaded,
)
from .rwkv.formats.safetensors import write_safetensors
from .rwkv.memory import release_freed_memory
from .sampler import RequestSampler

log = logging.getLogger(__name__)

class _Swap(msgspec.Struct, frozen=True):
    loaded: object
    load: Load


class _LoadFailed(msgspec.Struct, frozen=True):
    error: str
    load: Load


# Why writing a file can fail that the one who named its folder can fix.
_FOLDER_ERRNOS = frozenset((errno.ENOENT, errno.ENOTDIR, errno.EISDIR, errno.EEXIST, errno.EACCES, errno.EPERM,
                            errno.EROFS, errno.ENAMETOOLONG))


def _save_failure(exc: Exception) -> Failed:
    """A failed save as the client may read it: OSError's text names the server's path, its strerror does not."""
    if isinstance(exc, OSError) and exc.strerror:
        return Failed(exc.strerror, "bad_request" if exc.errno in _FOLDER_ERRNOS else "internal")
    return Failed(f"internal error: {type(exc).__name__}", "internal")


class Middleware:
    def __init__(self, builder=build):
        self.builder = builder
        self.models: dict[str, LoadedModel] = {}  # by served name
        self.inbox: queue.Queue = queue.Queue()
        self._loads: deque[Load] = deque()
        self._loading = False
        self._handlers = {
            Generate: self._generate, Embed: self._embed, Choose: self._with_initial_state,
            ReadState: self._with_initial_state, ScorePrompt: self._with_initial_state, GetInfo: self._info,
            ListLoaded: self._list,
            Load: self._queue_load, _Swap: self._swap, _LoadFailed: self._load_failed, Save: self._save,
            Unload: self._unload,
        }
        self._thread = threading.Thread(target=self._loop, name="middleware", daemon=True)
        self._thread.start()

    def send(self, message) -> None:
        """Thread-safe: queue a message (Load, Unload, GetInfo, Generate)."""
        self.inbox.put(message)

    def close(self) -> None:
        self.inbox.put(None)
        self._thread.join()

    @property
    def loading(self) -> bool:
        return self._loading

    def _loop(self) -> None:
        while True:
            message = self.inbox.get()
            if message is None:
                for loaded in self.models.values():
                    loaded.backend.stop("the server is shutting down")
                self.models.clear()
                return
            try:
                handle = self._handlers.get(type(message))
                if handle is None:
                    raise TypeError(f"unknown message {type(message).__name__}")
                handle(message)
            except Exception as exc:  # never let one message kill the thread
                log.exception("middleware failed on %s", type(message).__name__)
                reply = getattr(message, "reply", None) or getattr(getattr(message, "load", None), "reply", None)
                if reply is not None:
                    reply(Failed(f"internal error: {exc}", "internal"))

    @staticmethod
    def _refuse(request, exc: Exception) -> None:
        """A request the user got wrong: its error, with the kind the HTTP tier maps to a status."""
        request.reply(Failed(str(exc), getattr(exc, "kind", "bad_request")))

    def _loaded(self, request) -> LoadedModel | None:
        """The model `request.model` names; with no name, the only one loaded (library use)."""
        name = request.model
        if not name and len(self.models) == 1:
            return next(iter(self.models.values()))
        loaded = self.models.get(name)
        if loaded is None:
            request.reply(Failed(f"the model {name} is not loaded" if name else "no model is loaded", "no_model"))
        return loaded

    # ------------------------------------------------------------------ the models' lifecycle

    def _info(self, request: GetInfo) -> None:
        if (loaded := self._loaded(request)) is not None:
            request.reply(loaded.describe())

    def _list(self, request: ListLoaded) -> None:
        request.reply(LoadedModels(tuple(m.describe() for m in self.models.values())))

    def _queue_load(self, load: Load) -> None:
        self._loads.append(load)
        self._next_load()

    def _swap(self, swap: _Swap) -> None:
        new = swap.loaded
        old = self.models.get(new.name)
        self.models[new.name] = new
        if old is not None:
            old.backend.stop("the model was replaced by a new one")
        self._loading = False
        swap.load.reply(Loaded(new.describe()))
        self._next_load()

    def _load_failed(self, failed: _LoadFailed) -> None:
        self._loading = False
        failed.load.reply(Failed(failed.error, "load_failed"))
        self._next_load()

    def _unload(self, request: Unload) -> None:
        names = [request.model] if request.model else list(self.models)
        for name in names:
            if (loaded := self.models.pop(name, None)) is not None:
                loaded.backend.stop("the model was unloaded")
        loaded = None  # the last reference here: the memory can go back below
        release_freed_memory()
        request.reply(Unloaded())

    def _next_load(self) -> None:
        if self._loading or not self._loads:
            return
        load = self._loads.popleft()
        self._loading = True

        def work():
            try:
                loaded = self.builder(load.spec, load.progress) if load.progress else self.builder(load.spec)
            except Exception as exc:  # ModelFileError and friends: one line for the user
                log.warning("loading %s failed: %s", load.spec.path, exc)
                self.inbox.put(_LoadFailed(str(exc), load))
            else:
                self.inbox.put(_Swap(loaded, load))

        threading.Thread(target=work, name="model-loader", daemon=True).start()

    def _save(self, request: Save) -> None:
        """Write the model in a worker thread (seconds for a large model); never over a file.

        A failure's message is the reason alone, never the server's path (the HTTP tier names
        the path as its client gave it); the folder's faults are kind "bad_request"."""
        if (loaded := self._loaded(request)) is None:
            return
        target = Path(request.path)
        if target.exists():
            request.reply(Failed("it exists already; saving never overwrites a file", "bad_request"))
            return
        threading.Thread(target=_write_model, args=(loaded.model.tensors, target, request), name="model-saver",
                         daemon=True).start()

    # ------------------------------------------------------------------ requests for the backend

    def _resolve(self, request):
        """(model, cache partition, initial state) for a request, or None once it got its error."""
        if (loaded := self._loaded(request)) is None:
            return None
        try:
            return (loaded, *loaded.initial_state(request.state))
        except (LookupError, ValueError) as exc:
            self._refuse(request, exc)
            return None

    def _embed(self, request: Embed) -> None:
        if (loaded := self._loaded(request)) is None:
            return
        try:
            token_lists = tuple(loaded.encode(t) for t in request.texts)
        except ValueError as exc:
            self._refuse(request, exc)
            return
        loaded.backend.submit(EmbedJob(token_lists, request.reply))

    def _with_initial_state(self, request: Choose | ScorePrompt | ReadState) -> None:
        if (resolved := self._resolve(request)) is None:
            return
        loaded, partition, initial = resolved
        try:
            prompt = loaded.encode(request.prompt)
            choices = tuple(loaded.encode(c) if c else () for c in getattr(request, "choices", ()))
        except ValueError as exc:
            self._refuse(request, exc)
            return
        if isinstance(request, Choose):
            loaded.backend.submit(ChooseJob(prompt, choices, request.calibrate, request.reply, partition, initial))
        elif isinstance(request, ScorePrompt):
            loaded.backend.submit(ScoreJob(prompt, request.top, request.reply, initial))
        else:
            loaded.backend.submit(StateJob(prompt, request.reply, partition, initial))

    def _generate(self, request: Generate) -> None:
        if (resolved := self._resolve(request)) is None:
            return
        loaded, partition, initial = resolved
        try:
            tokens = request.prefix + loaded.encode(request.prompt)
            if any(not 0 <= t < loaded.model.info.vocab for t in request.prefix):
                raise ValueError("prefix token ids must be in this model's vocabulary")
            model_tokens = request.model_counts or (
                loaded.tokenizer.encode(request.model_text) if request.model_text else [])
            first = RequestSampler(request.options, loaded.model.info.vocab, model_tokens)
        except ValueError as exc:  # SamplerError among them
            self._refuse(request, exc)
            return
        samplers = (first,) + tuple(first.clone(i) for i in range(1, request.n))
        loaded.backend.submit(GenerateJob(
            tokens=tuple(tokens), samplers=samplers, reply=request.reply, cancel=request.cancel,
            max_tokens=request.max_tokens, stop=request.stop, stop_on_eos=request.stop_on_eos,
            partition=partition, initial_state=initial, keep_state=request.keep_state,
            draft_tokens=loaded.spec.draft_tokens if request.speculative else 0,
        ))


def _write_model(tensors, target: Path, request: Save) -> None:
    """The saver thread: write through a partial file, so a reader never sees half of one."""
    partial = target.with_name(target.name + ".part")
    try:
        write_safetensors(tensors, partial, dtype=request.dtype)
        os.replace(partial, target)
    except Exception as exc:
        with contextlib.suppress(OSError):  # the folder that refused the file may refuse this too
            partial.unlink(missing_ok=True)
        if isinstance(exc, OSError):  # the file system's answer: one line is all there is to tell
            log.warning("saving %s failed: %s", target, exc)
        else:
            log.exception("saving %s failed", target)
        request.reply(_save_failure(exc))
    else:
        request.reply(Saved(str(target), target.stat().st_size))
