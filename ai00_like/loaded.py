"""A loaded model with everything that serves it: tokenizer, initial states, backend thread.

`build` assembles one from a ModelSpec (in the middleware's loading thread, while the old
model keeps serving); the middleware then asks it to turn request text into checked token
ids (in the vocabulary, no more than the prompt limit: `[listen] max_prompt_tokens`, or by
default one derived from the state's size and the prefix cache's budget) and a request's
`state` field into an initial state and a prefix-cache partition.
"""

from __future__ import annotations

import hashlib
import logging
from pathlib import Path

import msgspec
import numpy as np

from .identity import weights_identity
from .messages import ModelInfoEvent, ModelSpec, NamedState
from .rwkv import load_model, load_state
from .rwkv.memory import footprint
from .rwkv.quant import head_quantised, quantisation_of
from .rwkv.state import State
from .rwkv.tokenizer import check_vocabulary, default_tokenizer_path, find_tokenizer, load_tokenizer
from .backend.backend import Backend
from .backend.cache_tier import CacheTier
from .backend.disk_cache import DiskCache
from .backend.shared_cache import SharedCache

log = logging.getLogger(__name__)


class PromptTooLong(ValueError):
    kind = "too_long"  # → 400 context_length_exceeded, as OpenAI answers


# The automatic limit's bounds: the floor keeps long-context prompts working whatever the
# cache's budget; the ceiling keeps one request's prefill from holding a slot for many minutes.
AUTO_PROMPT_FLOOR = 65_536
AUTO_PROMPT_CEILING = 262_144


def auto_prompt_limit(state_bytes: int, cache_bytes: int, checkpoint_interval: int) -> int:
    """The longest prompt whose checkpoints (one state every `checkpoint_interval` tokens) the
    prefix cache can all keep, within [AUTO_PROMPT_FLOOR, AUTO_PROMPT_CEILING]: longer ones
    would evict every other entry and still lose their own."""
    kept = cache_bytes // max(state_bytes, 1) * checkpoint_interval
    return min(max(kept, AUTO_PROMPT_FLOOR), AUTO_PROMPT_CEILING)


def prompt_limit(spec: ModelSpec, info) -> int | None:
    """[listen] max_prompt_tokens for this model: a positive number as given, -1 (any negative)
    none, 0 the automatic limit from its state's size and the prefix cache's budget."""
    if spec.max_prompt_tokens:
        return spec.max_prompt_tokens if spec.max_prompt_tokens > 0 else None
    state_bytes = 4 * info.n_layer * info.state_floats_per_layer  # float32, as the cache keeps it
    return auto_prompt_limit(state_bytes, spec.cache_bytes, spec.checkpoint_interval)


class LoadedModel:
    def __init__(self, spec: ModelSpec, model, tokenizer, states: dict[str, State], backend: Backend, *,
                 identity: str = ""):
        self.spec, self.model, self.tokenizer, self.states, self.backend = spec, model, tokenizer, states, backend
        self.identity = identity  # identity.weights_identity, once per load: the same on every replica
        self.name = spec.name or Path(spec.path).stem
        self.state_files: dict = {}  # (path, mtime) → State, for per-request `.state` files
        self.prompt_limit = prompt_limit(spec, model.info)  # None: no limit
        self.memory_bytes = footprint(model) + spec.cache_bytes  # the cache may grow to its budget
        adapter = getattr(model, "adapter", None)  # a GPU model's AdapterInfo
        self.memory_kind = "video" if adapter is not None and adapter.own_memory else "system"

    def describe(self) -> ModelInfoEvent:
        cache = self.backend.cache
        return ModelInfoEvent(
            name=self.name, path=self.spec.path, info=self.model.info, spec=self.spec, states=self.spec.states,
            slots=self.model.max_batch, running=self.backend.running, waiting=self.backend.queued,
            cache_entries=len(cache), cache_bytes=cache.bytes, counters=self.backend.counters(), tokenizer=self.tokenizer,
            disk_cache_bytes=sum(getattr(tier, "bytes", 0) for tier in cache.tiers),
            identity=self.identity, memory_bytes=self.memory_bytes, memory_kind=self.memory_kind,
            kernels_compiling=not getattr(self.model, "kernels_ready", True),
        )

    def encode(self, text: str) -> tuple[int, ...]:
        """Token ids of `text` (end-of-text for an empty one), checked against the model's vocabulary."""
        tokens = tuple(self.tokenizer.encode(text)) or (0,)
        limit = self.prompt_limit
        if limit is not None and len(tokens) > limit:
            raise PromptTooLong(self._too_long(len(tokens), limit))
        if max(tokens) >= self.model.info.vocab:
            raise ValueError(f"token id {max(tokens)} is outside the model's vocabulary of "
                             f"{self.model.info.vocab}: the tokenizer does not belong to this model (give the "
                             "model's vocabulary: [tokenizer] path in config.toml, --tokenizer for generate)")
        return tokens

    def _too_long(self, length: int, limit: int) -> str:
        # The one who reads this may run the server: tell them which key to change.
        if self.spec.max_prompt_tokens:
            why, raise_it = "[listen] max_prompt_tokens in config.toml", "raise [listen] max_prompt_tokens"
        else:
            why = ("the automatic limit for this model and its prefix cache: [listen] max_prompt_tokens = 0 in "
                   "config.toml")
            raise_it = "set [listen] max_prompt_tokens to a larger number of tokens"
        return (f"The input is {length} tokens long; this server accepts at most {limit} ({why}). To accept longer "
                f"prompts, {raise_it}, or set it to -1 for no limit.")

    def initial_state(self, wanted) -> tuple[str, State | None]:
        """(partition, State or None) for a request's `state`: a configured state's id or name,
        a `.state` file in the models folder, a State given inline, or a saved one. The partition keeps
        prefix-cache entries of different initial states apart."""
        if wanted is None:
            default = next((s for s in self.spec.states if s.default), None)
            return ("", None) if default is None else (default.id, self.states[default.id])
        if isinstance(wanted, NamedState):
            wanted.state.check(self.model.info)
            return wanted.partition, wanted.state
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

    def _state_file(self, name: str) -> State:
        """A `.state` file inside the models folder, never a path outside it."""
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


def disk_cache_key(spec: ModelSpec, model, identity: str) -> str:
    """What a state on disk must have been computed with to be used again: the weights by
    content (identity.weights_identity, so a changed file is another model) and what changes
    the engine's floats (precision, quantisation, CPU or which GPU), so a hit continues
    exactly as a cold run of this model would."""
    adapter = getattr(model, "adapter", None)
    engine = (f"{type(model).__module__}.{type(model).__name__}|{getattr(adapter, 'name', '')}|{spec.precision}|"
              f"{spec.quant}|{spec.quant_type}|{spec.quant_head}"
              + ("|rounded" if getattr(model, "rounds_activations", False) else ""))
    return hashlib.sha256(f"{identity}|{engine}".encode()).hexdigest()


def open_cache_tiers(spec: ModelSpec, model, identity: str) -> list[CacheTier]:
    """The prefix cache's tiers below memory for this model, in the order they are asked:
    the disk, then the store shared by replicas. A disk folder that cannot be made leaves
    that tier out (the log says why); a shared store that cannot be reached now is used
    once it can (cache_tier.py)."""
    tiers, cache = [], spec.disk_cache
    if cache is None:
        return tiers
    key = disk_cache_key(spec, model, identity)
    if cache.max_bytes > 0:
        try:
            tiers.append(DiskCache(cache.path, key, cache.max_bytes, cache.min_tokens))
        except OSError as exc:
            log.warning("the prefix cache's disk tier is off for %s: %s", Path(spec.path).name, exc)
    if cache.shared is not None:
        shared = cache.shared
        tiers.append(SharedCache(shared.url, key, prefix=shared.prefix, ttl=shared.ttl, min_tokens=cache.min_tokens))
    return tiers


def build(spec: ModelSpec, progress=None) -> LoadedModel:
    """Load model, tokenizer and initial states, and start a backend for them.

    The tokenizer is the spec's, else the one the model brings (tokenizer.find_tokenizer),
    else the World vocabulary; one with ids beyond the model's vocabulary is a ValueError."""
    model = load_model(spec.path, spec.device, max_batch=spec.max_batch,
                       loras=[(lora.path, lora.alpha) for lora in spec.loras], progress=progress,
                       precision=spec.precision, quant=spec.quant, quant_type=spec.quant_type,
                       quant_head=spec.quant_head, warm_up="background", exact=spec.exact)
    layers, kind = quantisation_of(model.tensors)  # a saved quantised model stays quantised
    spec = msgspec.structs.replace(spec, quant=layers, quant_type=kind) if layers else spec
    spec = msgspec.structs.replace(spec, quant_head=head_quantised(model.tensors))
    spec = msgspec.structs.replace(spec, precision=model.precision)  # what "auto" became
    tokenizer_path = Path(spec.tokenizer or find_tokenizer(spec.path) or default_tokenizer_path())
    tokenizer = load_tokenizer(tokenizer_path)
    # Refused here, in one line, rather than on every request: ids the model lacks cannot work.
    check_vocabulary(tokenizer, model.info.vocab, spec.path, tokenizer_path)
    spec = msgspec.structs.replace(spec, tokenizer=str(tokenizer_path))  # /api/models/info names the one used
    states = {s.id: load_state(s.path, model.info) for s in spec.states}
    identity = weights_identity(spec)
    backend = Backend(model, tokenizer, token_chunk_size=spec.token_chunk_size, cache_bytes=spec.cache_bytes,
                      checkpoint_interval=spec.checkpoint_interval, tiers=open_cache_tiers(spec, model, identity))
    return LoadedModel(spec, model, tokenizer, states, backend, identity=identity)
