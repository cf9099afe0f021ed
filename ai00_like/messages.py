"""The messages between the tiers, in one table (docs/architecture.md, "The three tiers").

api/ ──(requests below)──► middleware.py ──(GenerateJob)──► backend/
  ▲                                                          │
  └────────────── events, through each request's `reply` ◄───┘

`reply` is a thread-safe callable that delivers one event to whoever waits for it
(in the HTTP tier: `loop.call_soon_threadsafe(queue.put_nowait, event)`), so tokens
stream straight back without polling.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any, Literal

import msgspec
import numpy as np

from .rwkv.info import ModelInfo
from .rwkv.state import State
from .rwkv.tokenizer import HFTokenizer, WorldTokenizer
from .sampler import RequestSampler, SamplingOptions, TokenCounts

Reply = Callable[[Any], None]


class Cancel:
    """Set by the HTTP tier when the client goes away; the backend frees the slot within a step."""

    __slots__ = ("_event",)

    def __init__(self) -> None:
        self._event = threading.Event()

    def set(self) -> None:
        self._event.set()

    @property
    def cancelled(self) -> bool:
        return self._event.is_set()


# ------------------------------------------------------------------ requests to the middleware


class LoraSpec(msgspec.Struct, frozen=True):
    path: str
    alpha: float = 1.0


class StateSpec(msgspec.Struct, frozen=True):
    """An initial state from a state-tuning file, addressable by id or name."""

    path: str
    id: str
    name: str = ""
    default: bool = False


Thinking = Literal["none", "think", "effort"]
Effort = Literal["none", "minimal", "low", "medium", "high", "xhigh"]


class SharedCacheSpec(msgspec.Struct, frozen=True):
    """The prefix cache's shared tier: the Redis of `[store] url`, its key prefix and TTL."""

    url: str
    prefix: str
    ttl: int


class DiskCacheSpec(msgspec.Struct, frozen=True):
    """The prefix cache's tiers below memory (`[cache]`): the disk tier's folder and the
    folder's cap in bytes (0: no disk tier), the shortest prefix either tier keeps, and the
    shared tier (None: none)."""

    path: str
    max_bytes: int
    min_tokens: int = 0
    shared: SharedCacheSpec | None = None


class ModelSpec(msgspec.Struct, frozen=True):
    """Everything a model load needs (the `[model]`, `[[lora]]`, `[[state]]`, `[tokenizer]` config)."""

    path: str
    tokenizer: str | None = None  # None: the RWKV World vocabulary we ship
    device: str = "auto"
    precision: str = "auto"
    quant: int = 0
    quant_type: str = "int8"
    quant_head: bool = False  # the head as Int8 blocks too
    exact: bool = True  # fp32 activations in every CPU product (False: Int8 products round them, cpu/vnni.py)
    draft_tokens: int = 8  # speculative decoding's longest prompt-lookup draft (0: off)
    max_batch: int = 8
    token_chunk_size: int = 256
    loras: tuple[LoraSpec, ...] = ()
    states: tuple[StateSpec, ...] = ()
    cache_bytes: int = 1 << 30  # prefix state cache budget
    checkpoint_interval: int = 256  # tokens between cache checkpoints of a long prompt
    name: str = ""  # the model id clients see; default: the file's stem
    models_dir: str = ""  # where per-request `.state` files may come from; default: the model's folder
    max_prompt_tokens: int = 0  # longer prompts are refused ("too_long"); 0: automatic (loaded.prompt_limit), -1: none
    thinking: Thinking = "none"  # a reasoning model: "think" (G1), "effort" (G1 taking effort suffixes)
    reasoning_effort: Effort = "medium"  # its default effort ("none": thinking off unless asked)
    max_tokens_limit: int = 65536  # the largest max_tokens a request may ask for
    disk_cache: DiskCacheSpec | None = None  # the prefix cache's disk tier; None: memory only


class Load(msgspec.Struct, frozen=True):
    spec: ModelSpec
    reply: Reply
    progress: Any = None  # optional progress(done, total) callable, from the loading thread


class Unload(msgspec.Struct, frozen=True):
    reply: Reply
    model: str = ""  # the served name; "": every loaded model


class Save(msgspec.Struct, frozen=True):
    """Write the loaded model (LoRAs merged) as safetensors, official layout, to a new file."""

    path: str
    reply: Reply
    dtype: Literal["fp16", "fp32", "bf16"] = "fp16"
    model: str = ""


class GetInfo(msgspec.Struct, frozen=True):
    """A loaded model's ModelInfoEvent (with no `model`: the only one loaded)."""

    reply: Reply
    model: str = ""


class ListLoaded(msgspec.Struct, frozen=True):
    """Every loaded model's ModelInfoEvent, as LoadedModels."""

    reply: Reply


class NamedState(msgspec.Struct, frozen=True):
    """An initial state with a prefix-cache partition of its own: a saved state, whose id
    names it (its content never changes), so every request from it shares the partition."""

    partition: str
    state: State


class Generate(msgspec.Struct, frozen=True):
    """A completion: text in, text pieces out (through `reply`)."""

    prompt: str
    reply: Reply
    cancel: Cancel
    options: SamplingOptions
    max_tokens: int = 256
    stop: tuple[str, ...] = ()
    n: int = 1
    model_text: str = ""  # earlier assistant turns, which seed the repetition penalties
    model_counts: TokenCounts | None = None  # instead of model_text: a stored conversation's (Responses)
    # The initial state: a configured state's id or name, a `.state` file in the models
    # folder, a State given inline, or a saved one (NamedState); None: the default state.
    state: str | State | NamedState | None = None
    stop_on_eos: bool = True
    prefix: tuple[int, ...] = ()  # token ids read before the prompt's text (a stored conversation)
    keep_state: bool = False  # Finished carries the state and the tokens it holds (choice 0)
    model: str = ""  # the served name the request is for (middleware routes by it)
    speculative: bool = True  # False: no drafts for this request (the model's draft_tokens otherwise)


class Embed(msgspec.Struct, frozen=True):
    """Embeddings of texts: the mean over tokens of the last layer's normalised output, L2-normalised."""

    texts: tuple[str, ...]
    reply: Reply
    model: str = ""  # as Generate.model


class Choose(msgspec.Struct, frozen=True):
    """Ai00's multiple-choice ranking: the perplexity of each choice as a continuation of `prompt`.

    With `calibrate`, each score has the choice's perplexity on its own (after end-of-text,
    from the initial state) subtracted: a PMI-like score that does not favour choices that
    are likely anywhere.
    """

    prompt: str
    choices: tuple[str, ...]
    reply: Reply
    calibrate: bool = False
    state: str | State | NamedState | None = None  # as Generate.state
    model: str = ""  # as Generate.model


class ScorePrompt(msgspec.Struct, frozen=True):
    """The log-probability the model gives each token of `prompt` after the ones before it
    (completions' `echo` with `logprobs`; lm-eval's log-likelihoods)."""

    prompt: str
    reply: Reply
    top: int = 0  # also the `top` most likely alternatives at each position
    state: str | State | NamedState | None = None  # as Generate.state
    model: str = ""  # as Generate.model


class ReadState(msgspec.Struct, frozen=True):
    """Ai00's `/states`: the RNN state after reading `prompt` (from the initial state)."""

    prompt: str
    reply: Reply
    state: str | State | NamedState | None = None  # as Generate.state
    model: str = ""  # as Generate.model


# ------------------------------------------------------------------ events back to the waiting handler


class BackendCounters(msgspec.Struct, frozen=True):
    """Totals since the model was loaded, read by the status stream and /metrics."""

    steps: int = 0  # batched forwards
    step_rows: int = 0  # sum over steps of the slots in the step (mean batch size = step_rows / steps)
    step_tokens: int = 0  # tokens through the model in steps (prefill chunks and decode tokens)
    prompt_tokens: int = 0  # prompt tokens computed (cache hits excluded)
    generated_tokens: int = 0  # tokens sampled
    finished: int = 0  # choices that ended, for any reason
    cache_queries: int = 0
    cache_hits: int = 0
    cache_hit_tokens: int = 0  # prompt tokens a cache hit spared
    # The part of cache_hits and cache_hit_tokens whose states came from a tier below memory
    # (the rest came from memory), and what each tier wrote, skipped (its queue was full, or
    # the entry too big) and dropped (damaged, or another model's): backend.tier_counters.
    cache_disk_hits: int = 0
    cache_disk_hit_tokens: int = 0
    cache_shared_hits: int = 0
    cache_shared_hit_tokens: int = 0
    cache_disk_writes: int = 0
    cache_disk_skipped: int = 0
    cache_disk_dropped: int = 0
    cache_shared_writes: int = 0
    cache_shared_skipped: int = 0
    cache_shared_dropped: int = 0
    numpy_steps: int = 0  # steps of a CPU model run on numpy while its compiled kernels were compiling
    draft_tokens: int = 0  # speculative decoding: draft tokens checked
    draft_accepted: int = 0  # and of them, the model's own


class ModelInfoEvent(msgspec.Struct, frozen=True):
    """Reply to GetInfo, and to a successful Load."""

    name: str
    path: str
    info: ModelInfo
    spec: ModelSpec
    states: tuple[StateSpec, ...]
    slots: int
    running: int
    waiting: int
    cache_entries: int
    cache_bytes: int
    counters: BackendCounters = BackendCounters()
    disk_cache_bytes: int = 0  # the disk tier's folder (every model's entries in it); 0 when it is off
    tokenizer: WorldTokenizer | HFTokenizer | None = None  # read-only use: token bytes for logprobs, counts
    identity: str = ""  # the weights by content, not path (identity.py); empty from test builders
    memory_bytes: int = 0  # what it holds: weights in their loaded form, slot states, prefix cache's budget
    memory_kind: Literal["system", "video"] = "system"  # video: its weights are on a discrete GPU
    kernels_compiling: bool = False  # a CPU model serving on numpy while its compiled kernels compile


class LoadedModels(msgspec.Struct, frozen=True):
    """Reply to ListLoaded: every loaded model."""

    models: tuple[ModelInfoEvent, ...]


class Loaded(msgspec.Struct, frozen=True):
    info: ModelInfoEvent


class Unloaded(msgspec.Struct, frozen=True):
    pass


class Saved(msgspec.Struct, frozen=True):
    path: str
    bytes: int


class Failed(msgspec.Struct, frozen=True):
    """A request could not be served. `kind` tells the HTTP tier which status to use."""

    message: str
    kind: Literal["no_model", "unloaded", "bad_request", "too_long", "load_failed", "internal"] = "internal"
    index: int = 0


class Started(msgspec.Struct, frozen=True):
    """Generation of choice `index` began: the prompt is in a slot (cache hit length included)."""

    index: int
    prompt_tokens: int
    cached_tokens: int


class TextPiece(msgspec.Struct, frozen=True):
    index: int
    text: str
    tokens: tuple[int, ...]
    logprobs: tuple[float, ...] = ()
    top_logprobs: tuple[tuple[tuple[int, float], ...], ...] = ()


class Embeddings(msgspec.Struct, frozen=True):
    vectors: tuple[np.ndarray, ...]  # one float32 vector [n_embd] per text
    prompt_tokens: int


class Chosen(msgspec.Struct, frozen=True):
    perplexities: tuple[float, ...]  # one per choice, lower is more likely; +inf for an empty choice
    prompt_tokens: int


class PromptScores(msgspec.Struct, frozen=True):
    tokens: tuple[int, ...]
    logprobs: tuple[float | None, ...]  # None for the first token: nothing came before it
    top_logprobs: tuple[tuple[tuple[int, float], ...], ...]


class StateRead(msgspec.Struct, frozen=True):
    state: State
    prompt_tokens: int


class Finished(msgspec.Struct, frozen=True):
    index: int
    reason: Literal["stop", "length", "cancelled"]
    prompt_tokens: int
    completion_tokens: int
    # With Generate.keep_state: the state after `fed` (prompt and generated tokens the model
    # read), and the last generated token, which it did not read (none after end-of-text).
    state: State | None = None
    fed: tuple[int, ...] = ()
    unfed: tuple[int, ...] = ()


# ------------------------------------------------------------------ middleware → backend


class GenerateJob(msgspec.Struct, frozen=True):
    """A tokenised Generate, with one sampler per choice, ready for a slot."""

    tokens: tuple[int, ...]
    samplers: tuple[RequestSampler, ...]  # one per choice (n)
    reply: Reply
    cancel: Cancel
    max_tokens: int
    stop: tuple[str, ...] = ()
    stop_on_eos: bool = True
    partition: str = ""  # which initial state: prefix-cache entries are never shared across them
    initial_state: State | None = None  # None: the model's own
    keep_state: bool = False
    draft_tokens: int = 0  # speculative decoding: the longest draft a step checks (0: none)


class EmbedJob(msgspec.Struct, frozen=True):
    token_lists: tuple[tuple[int, ...], ...]
    reply: Reply


class ChooseJob(msgspec.Struct, frozen=True):
    prompt: tuple[int, ...]
    choices: tuple[tuple[int, ...], ...]
    calibrate: bool
    reply: Reply
    partition: str = ""
    initial_state: State | None = None


class StateJob(msgspec.Struct, frozen=True):
    tokens: tuple[int, ...]
    reply: Reply
    partition: str = ""
    initial_state: State | None = None


class ScoreJob(msgspec.Struct, frozen=True):
    tokens: tuple[int, ...]
    top: int
    reply: Reply
    initial_state: State | None = None
