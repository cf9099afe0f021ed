"""Wire structs of Ai00's own routes, with Ai00's field names (ai00-reference §1.9)."""

from __future__ import annotations

from typing import Literal

import msgspec

from ...messages import Effort, Thinking


class Ai00ModelInfo(msgspec.Struct, kw_only=True):
    """Ai00's `ModelInfo`: version as "V4"…"V7", sizes under its names."""

    version: str
    num_layer: int
    num_emb: int
    num_hidden: int
    num_vocab: int
    num_head: int
    head_size: int  # ours: Ai00 leaves it to be derived


class LoraItem(msgspec.Struct, kw_only=True):
    path: str
    alpha: float = 1.0


class StateItem(msgspec.Struct, kw_only=True):
    path: str
    name: str = ""
    id: str = ""
    default: bool = False


class ReloadRequest(msgspec.Struct, kw_only=True):
    """Body of POST /admin/models/load (Ai00's ReloadRequest); paths are under [model] path.

    Fields Ai00 has but our engine does not use (`adapter`, `bnf`, …) are accepted and
    ignored. `precision`, `quant` and `quant_type` (Ai00's spellings or ours) left out take
    the config's [model] values.
    """

    model_path: str = ""  # empty: load `model`, a model the server serves, with its own settings
    model: str = ""  # ours
    keep_alive: float | str | None = None  # ours: its idle time from now on (-1 pins it)
    lora: list[LoraItem] = msgspec.field(default_factory=list)
    state: list[StateItem] = msgspec.field(default_factory=list)
    quant: int | None = None
    quant_type: str | None = None
    quant_head: bool | None = None  # ours: the head as Int8 blocks too; None: the config's
    precision: str | None = None
    token_chunk_size: int | None = None  # None: the config's
    max_batch: int | None = None
    tokenizer_path: str = ""  # empty: the config's tokenizer
    served_name: str = ""  # ours
    device: str | None = None  # ours
    thinking: Thinking | None = None  # ours: None, the config's
    reasoning_effort: Effort | None = None  # ours: None, the config's


class UnloadRequest(msgspec.Struct, kw_only=True):
    """Body of POST /admin/models/unload (ours; Ai00's has none): the model to unload."""

    model: str = ""  # empty: every loaded model


class ReloadInfo(msgspec.Struct, kw_only=True):
    """What is loaded, in ReloadRequest's shape (so it can be sent back to /admin/models/load)."""

    model_path: str
    lora: list[LoraItem]
    state: list[StateItem]
    quant: int = 0
    quant_type: str = "none"
    quant_head: bool = False
    precision: str = "auto"
    token_chunk_size: int
    max_batch: int
    tokenizer_path: str
    served_name: str
    device: str


class StateRefInfo(msgspec.Struct):
    id: str
    name: str
    default: bool


class SlotUse(msgspec.Struct, kw_only=True):
    """A loaded model's slots and cache now, and its live throughput (over the last few seconds)."""

    slots: int = 0
    running: int = 0
    waiting: int = 0
    cache_entries: int = 0
    cache_bytes: int = 0
    prompt_tokens_per_second: float = 0.0
    generated_tokens_per_second: float = 0.0


class ServedModelStatus(SlotUse, kw_only=True):
    """One model the server can serve, in GET /api/models/info's `models` (ours)."""

    id: str
    file: str  # relative to the models folder where it is inside it
    status: Literal["loaded", "loading", "unloaded"]
    memory_bytes: int  # measured once loaded; an estimate before (0: not known yet)
    keep_alive: float  # idle seconds before it is unloaded; -1: pinned
    idle_since: int | None  # Unix time its last request ended; None while one runs or before any
    users: int  # requests running on it or waiting for its load
    loads: int = 0
    last_error: str | None = None


class BudgetStatus(msgspec.Struct, kw_only=True):
    """What loaded models may take ([server] max_loaded_models, memory_budget) and take now."""

    memory_bytes: int | None  # None: no byte cap known; a budget in bytes holds every model, GPU ones too
    used_bytes: int
    # With "auto", models on a discrete GPU have their own share, of its free memory (None: not known).
    video_memory_bytes: int | None = None
    video_used_bytes: int = 0
    max_loaded_models: int  # 0: no cap
    loaded_models: int


class ServerStatus(SlotUse, kw_only=True):
    """GET /api/models/info and each event of /api/models/state. The top-level fields
    describe the model a request without `model` gets (Ai00's one model); `models` every one."""

    loaded: bool
    loading: str | None = None  # the file being loaded, if any
    last_error: str | None = None
    id: str | None = None  # the model id clients use
    reload: ReloadInfo | None = None
    model: Ai00ModelInfo | None = None
    states: list[StateRefInfo] = msgspec.field(default_factory=list)
    # Ours: totals since the model was loaded.
    prompt_tokens: int = 0
    generated_tokens: int = 0
    cache_queries: int = 0
    cache_hits: int = 0
    cache_hit_tokens: int = 0
    models: list[ServedModelStatus] = msgspec.field(default_factory=list)  # ours
    budget: BudgetStatus | None = None  # ours


class ModelFile(msgspec.Struct, kw_only=True):
    """One entry of GET /api/models/list."""

    path: str
    name: str
    size: int
    sha: str
    info: Ai00ModelInfo | None
    error: str | None = None  # ours: why `info` is null, for files that look like models


class SaveRequest(msgspec.Struct, kw_only=True):
    path: str | None = None
    model_path: str | None = None
    model: str | None = None  # ours: which loaded model; absent: the default one
    dtype: Literal["fp16", "fp32", "bf16"] = "fp16"  # ours: storage type of the written weights


class SaveResponse(msgspec.Struct, kw_only=True):
    """Ours: what was written (Ai00 answers an empty 200)."""

    path: str  # relative to the models folder
    bytes: int



class CatalogueModel(msgspec.Struct, kw_only=True):
    """One released model of GET /api/models/catalogue (ours)."""

    alias: str
    repo: str
    file: str
    params: str
    size: int  # the file's bytes, roughly
    thinking: str  # the [model] thinking mode it wants
    fits: str | None  # the precision it fits this machine's free memory in: bf16, int8, nf4; None: too large
    downloaded: bool  # already in the models folder


class PullRequest(msgspec.Struct, kw_only=True):
    name: str  # an alias of the catalogue, or REPO/FILE on the hub


class Download(msgspec.Struct, kw_only=True):
    """A download the server runs (POST and GET /admin/models/pull, ours)."""

    id: str
    name: str
    repo: str
    file: str
    status: str  # running, done or failed
    bytes: int
    total: int | None
    path: str | None = None  # where it landed, once done
    error: str | None = None  # why it failed
    fits: str | None = None  # as in the catalogue, for a catalogue model
    thinking: str | None = None
