"""The middleware thread: owns the model lifecycle and routes the HTTP tier's messages.

Load builds the new model, tokenizer and backend in a worker thread while the old
model keeps serving, then swaps them in; a failed load reports its error and changes
nothing. Generate is tokenised here, given its samplers and initial state, and handed
to the backend. With no model loaded every request fails at once with a clear error.
"""

from __future__ import annotations

import hashlib
import logging
import os
import queue
import threading
from collections import deque
from pathlib import Path

import msgspec
import numpy as np

from .messages import (
    Choose, ChooseJob, Embed, EmbedJob, Failed, Generate, GenerateJob, GetInfo, Load, Loaded, ModelInfoEvent,
    ModelSpec, ReadState, Save, Saved, ScoreJob, ScorePrompt, StateJob, Unload, Unloaded,
)
from .run import Backend

log = logging.getLogger(__name__)


class LoadedModel:
    """A model with everything that serves it."""

    def __init__(self, spec: ModelSpec, model, tokenizer, states: dict, backend: Backend):
        self.spec, self.model, self.tokenizer, self.states, self.backend = spec, model, tokenizer, states, backend
        self.name = spec.name or Path(spec.path).stem
        self.state_files: dict = {}  # (path, mtime) → State, for per-request `.state` files

    def describe(self) -> ModelInfoEvent:
        cache = self.backend.cache
        return ModelInfoEvent(
            name=self.name, path=self.spec.path, info=self.model.info, spec=self.spec, states=self.spec.states,
            slots=self.model.max_batch, running=self.backend.running, waiting=self.backend.queued,
            cache_entries=len(cache), cache_bytes=cache.bytes, counters=self.backend.counters(), tokenizer=self.tokenizer,
        )

    def initial_state(self, wanted):
        """(partition, State or None) for a request's `state`: a configured state's id or name,
        a `.state` file in the models folder, or a State given inline. The partition keeps
        prefix-cache entries of different initial states apart."""
        from .rwkv.state import State

        if wanted is None:
            default = next((s for s in self.spec.states if s.default), None)
            return ("", None) if default is None else (default.id, self.states[default.id])
        if isinstance(wanted, State):
            wanted.check(self.model.info)
            digest = hashlib.sha256()
            for part in (wanted.att_shift, wanted.wkv, wanted.ffn_shift):
                digest.update(np.ascontiguousarray(part, dtype=np.float32).tobytes())
            return "inline:" + digest.hexdigest(), wanted
        for spec in self.spec.states:
            if wanted in (spec.id, spec.name):
                return spec.id, self.states[spec.id]
        if isinstance(wanted, str) and wanted.endswith(".state"):
            return "file:" + wanted, self._state_file(wanted)
        raise LookupError(f"unknown state '{wanted}'")

    def _state_file(self, name: str):
        """A `.state` file inside the models folder, never a path outside it."""
        from .rwkv import load_state

        root = Path(self.spec.models_dir or Path(self.spec.path).parent).resolve()
        path = (root / name).resolve()
        if Path(name).is_absolute() or root not in path.parents:
            raise LookupError(f"state file '{name}' is not inside the models folder")
        if not path.is_file():
            raise LookupError(f"state file '{name}' not found in the models folder")
        key = (str(path), path.stat().st_mtime_ns)
        if key not in self.state_files:
            try:
                self.state_files[key] = load_state(path, self.model.info)
            except Exception as exc:  # ModelFileError: one line naming the file
                raise LookupError(str(exc)) from None
        return self.state_files[key]


def build(spec: ModelSpec, progress=None) -> LoadedModel:
    """Load model, tokenizer and initial states, and start a backend for them."""
    from .rwkv import load_model, load_state
    from .rwkv.quant import quantisation_of
    from .rwkv.tokenizer import default_tokenizer_path, load_tokenizer

    model = load_model(spec.path, spec.device, max_batch=spec.max_batch,
                       loras=[(lora.path, lora.alpha) for lora in spec.loras], progress=progress,
                       precision=spec.precision, quant=spec.quant, quant_type=spec.quant_type)
    layers, kind = quantisation_of(model.tensors)  # a saved quantised model stays quantised
    spec = msgspec.structs.replace(spec, quant=layers, quant_type=kind) if layers else spec
    tokenizer = load_tokenizer(spec.tokenizer or default_tokenizer_path())
    states = {s.id: load_state(s.path, model.info) for s in spec.states}
    backend = Backend(model, tokenizer, token_chunk_size=spec.token_chunk_size, cache_bytes=spec.cache_bytes,
                      checkpoint_interval=spec.checkpoint_interval)
    return LoadedModel(spec, model, tokenizer, states, backend)


class _Swap(msgspec.Struct, frozen=True):
    loaded: object
    load: Load


class PromptTooLong(ValueError):
    kind = "too_long"  # → 400 context_length_exceeded, as OpenAI answers


class _LoadFailed(msgspec.Struct, frozen=True):
    error: str
    load: Load


class Middleware:
    def __init__(self, builder=build):
        self.builder = builder
        self.current: LoadedModel | None = None
        self.inbox: queue.Queue = queue.Queue()
        self._loads: deque[Load] = deque()
        self._loading = False
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
                if self.current is not None:
                    self.current.backend.stop("the server is shutting down")
                return
            try:
                self._handle(message)
            except Exception as exc:  # never let one message kill the thread
                log.exception("middleware failed on %s", type(message).__name__)
                reply = getattr(message, "reply", None) or getattr(getattr(message, "load", None), "reply", None)
                if reply is not None:
                    reply(Failed(f"internal error: {exc}", "internal"))

    def _handle(self, message) -> None:
        if isinstance(message, Generate):
            self._generate(message)
        elif isinstance(message, Embed):
            if self.current is None:
                message.reply(Failed("no model is loaded", "no_model"))
            else:
                try:
                    token_lists = tuple(self._encode(self.current, t) for t in message.texts)
                except ValueError as exc:
                    message.reply(Failed(str(exc), getattr(exc, "kind", "bad_request")))
                else:
                    self.current.backend.submit(EmbedJob(token_lists, message.reply))
        elif isinstance(message, (Choose, ReadState, ScorePrompt)):
            self._with_initial_state(message)
        elif isinstance(message, GetInfo):
            message.reply(self.current.describe() if self.current else Failed("no model is loaded", "no_model"))
        elif isinstance(message, Load):
            self._loads.append(message)
            self._next_load()
        elif isinstance(message, _Swap):
            old, self.current = self.current, message.loaded
            if old is not None:
                old.backend.stop("the model was replaced by a new one")
            self._loading = False
            message.load.reply(Loaded(self.current.describe()))
            self._next_load()
        elif isinstance(message, _LoadFailed):
            self._loading = False
            message.load.reply(Failed(message.error, "load_failed"))
            self._next_load()
        elif isinstance(message, Save):
            self._save(message)
        elif isinstance(message, Unload):
            if self.current is not None:
                self.current.backend.stop("the model was unloaded")
                self.current = None
            message.reply(Unloaded())
        else:
            raise TypeError(f"unknown message {type(message).__name__}")

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
        """Write the model in a worker thread (seconds for a large model); never over a file."""
        from .rwkv.formats.safetensors import write_safetensors

        if self.current is None:
            request.reply(Failed("no model is loaded", "no_model"))
            return
        tensors, target = self.current.model.tensors, Path(request.path)
        if target.exists():
            request.reply(Failed(f"{target.name} exists already; saving never overwrites a file", "bad_request"))
            return

        def work():
            partial = target.with_name(target.name + ".part")
            try:
                write_safetensors(tensors, partial, dtype=request.dtype)
                os.replace(partial, target)  # a reader never sees a half-written file
            except Exception as exc:
                partial.unlink(missing_ok=True)
                log.warning("saving %s failed: %s", target, exc)
                request.reply(Failed(f"saving {target.name} failed: {exc}", "internal"))
            else:
                request.reply(Saved(str(target), target.stat().st_size))

        threading.Thread(target=work, name="model-saver", daemon=True).start()

    def _encode(self, current, text: str) -> tuple[int, ...]:
        """Token ids of `text` (end-of-text for an empty one), checked against the model's vocabulary."""
        tokens = tuple(current.tokenizer.encode(text)) or (0,)
        limit = current.spec.max_prompt_tokens
        if limit and len(tokens) > limit:
            raise PromptTooLong(f"The input is {len(tokens)} tokens long; this server accepts at most {limit} "
                                "([listen] max_prompt_tokens).")
        if max(tokens) >= current.model.info.vocab:
            raise ValueError(f"token id {max(tokens)} is outside the model's vocabulary of "
                             f"{current.model.info.vocab}: the tokenizer does not belong to this model (give the "
                             "model's vocabulary: [tokenizer] path in config.toml, --tokenizer for generate)")
        return tokens

    def _resolve(self, request):
        """(model, cache partition, initial state) for a request, or None once it got its error."""
        if self.current is None:
            request.reply(Failed("no model is loaded", "no_model"))
            return None
        try:
            return (self.current, *self.current.initial_state(request.state))
        except (LookupError, ValueError) as exc:
            request.reply(Failed(str(exc), getattr(exc, "kind", "bad_request")))
            return None

    def _with_initial_state(self, request) -> None:
        if (resolved := self._resolve(request)) is None:
            return
        current, partition, initial = resolved
        try:
            prompt = self._encode(current, request.prompt)
            choices = tuple(self._encode(current, c) if c else () for c in getattr(request, "choices", ()))
        except ValueError as exc:
            request.reply(Failed(str(exc), getattr(exc, "kind", "bad_request")))
            return
        if isinstance(request, Choose):
            current.backend.submit(ChooseJob(prompt, choices, request.calibrate, request.reply, partition, initial))
        elif isinstance(request, ScorePrompt):
            current.backend.submit(ScoreJob(prompt, request.top, request.reply, initial))
        else:
            current.backend.submit(StateJob(prompt, request.reply, partition, initial))

    def _generate(self, request: Generate) -> None:
        from .sampler import RequestSampler

        if (resolved := self._resolve(request)) is None:
            return
        current, partition, initial = resolved
        try:
            tokens = self._encode(current, request.prompt)
            model_tokens = current.tokenizer.encode(request.model_text) if request.model_text else []
            first = RequestSampler(request.options, current.model.info.vocab, model_tokens)
        except ValueError as exc:  # SamplerError among them
            request.reply(Failed(str(exc), getattr(exc, "kind", "bad_request")))
            return
        samplers = (first,) + tuple(first.clone(i) for i in range(1, request.n))
        current.backend.submit(GenerateJob(
            tokens=tuple(tokens), samplers=samplers, reply=request.reply, cancel=request.cancel,
            max_tokens=request.max_tokens, stop=request.stop, stop_on_eos=request.stop_on_eos,
            partition=partition, initial_state=initial,
        ))
