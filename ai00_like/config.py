"""config.toml: Ai00's sections with Ai00's meanings, plus what our engine adds.

The shipped `config.toml` documents every key. Sections and keys are checked strictly:
a misspelt key or a wrong value stops the server with one line naming the key, because
a silently ignored setting is worse than a refusal. Keys that Ai00 has but our engine
does not (quantisation, TLS, JWT, the ONNX embedder, …) are accepted so an Ai00 config
still starts, and each is reported once as ignored.

Relative paths are resolved against the directory of the config file, so the server
finds its model wherever it is started from (Ai00 resolves against the working
directory, which is the same thing for its usual `cd ai00 && ./ai00_server`).
"""

from __future__ import annotations

import ipaddress
import logging
import tomllib
import uuid
from pathlib import Path
from urllib.parse import urlsplit
from typing import Annotated, Literal

import msgspec

from .messages import DiskCacheSpec, Effort, LoraSpec, ModelSpec, SharedCacheSpec, StateSpec, Thinking
from .rwkv import check_device
from .rwkv.quant import quant_options

log = logging.getLogger(__name__)

DEFAULT_CONFIG = "config.toml"
DEFAULT_IP = "127.0.0.1"  # Ai00 listens on 0.0.0.0; we only go beyond loopback when asked
DEFAULT_PORT = 65530

Positive = Annotated[int, msgspec.Meta(ge=1)]
NonNegative = Annotated[int, msgspec.Meta(ge=0)]


class ConfigError(ValueError):
    """A config file that cannot be used; the message names the file, the key and the problem."""


class ModelSection(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    path: str = "assets/models"
    name: str = ""
    served_name: str = ""
    aliases: list[str] = msgspec.field(default_factory=list)
    device: str = "auto"  # auto, cpu, gpu or a GPU adapter index ("0", "1", …)
    precision: str = "auto"  # how the weights are kept: auto (the file's), fp32, fp16, bf16 (Ai00's Fp16/Fp32 too)
    quant: NonNegative = 0  # layers whose projections are quantised, from the first
    quant_type: str = "int8"  # int8, nf4 or none (Ai00's Int8/NF4/None too)
    quant_head: bool = False  # the head (output matrix) as Int8 blocks too (ours)
    exact: bool = True  # fp32 activations in every CPU product; false: Int8 products round them (ours)
    draft_tokens: NonNegative = 8  # speculative decoding: the longest prompt-lookup draft (0: off; ours)
    max_batch: Positive = 8
    token_chunk_size: Positive = 256
    cache_bytes: NonNegative = 1 << 30
    checkpoint_interval: Positive = 256
    max_tokens_limit: Positive = 65536
    thinking: Thinking = "none"  # none, think (an RWKV7-G1 reasoning model) or effort (G1 from 20250922)
    reasoning_effort: Effort = "medium"  # a thinking model's default: none, minimal, low, medium, high, xhigh


class StateSection(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    path: str
    name: str = ""
    id: str = ""
    default: bool = False


class LoraSection(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    path: str
    alpha: float = 1.0


class TokenizerSection(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    path: str = ""


KeepAlive = Annotated[float, msgspec.Meta(ge=-1)]


class ModelsSection(ModelSection, forbid_unknown_fields=True, kw_only=True):
    """One of several models ([[models]]): everything [model] has, with its own tokenizer,
    LoRAs and states, and when it is loaded and unloaded."""

    path: str = ""  # the folder of `name`; empty: [model] path
    tokenizer: str = ""  # empty: a vocabulary beside the model, named after it, or the World one
    lora: list[LoraSection] = msgspec.field(default_factory=list)
    state: list[StateSection] = msgspec.field(default_factory=list)
    keep_alive: KeepAlive = 300.0  # idle seconds before it is unloaded; 0 at once, -1 never (pinned)
    load: Literal["startup", "on_demand"] = "on_demand"


class ServerSection(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    serve_folder: bool = True  # model files in [model] path that no section names are served too
    max_loaded_models: NonNegative = 0  # 0: as many as the memory budget holds
    # Bytes ("8 GiB" and the like too), or "auto": a share of the memory free at start.
    memory_budget: int | str = "auto"


class ListenSection(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    ip: str = DEFAULT_IP
    port: Annotated[int, msgspec.Meta(ge=0, le=65535)] = DEFAULT_PORT
    api_keys: list[str] = msgspec.field(default_factory=list)
    admin_key: str = ""
    max_body_bytes: Positive = 4 << 20
    ping_interval: Annotated[float, msgspec.Meta(gt=0)] = 1.0
    # Operations (api/auth.py, api/app.py): see config.toml for what each key does.
    # Empty: only the server's own page (and its loopback names) may call it from a browser.
    cors_origins: list[str] = msgspec.field(default_factory=list)
    allowed_hosts: list[str] = msgspec.field(default_factory=list)  # Host names beyond loopback's
    # 0: automatic (loaded.prompt_limit: what the prefix cache can checkpoint, 65,536 to 262,144
    # tokens); -1: no limit; otherwise the limit as given.
    max_prompt_tokens: Annotated[int, msgspec.Meta(ge=-1)] = 0
    tls_cert: str = ""
    tls_key: str = ""
    shutdown_grace: Annotated[float, msgspec.Meta(ge=0)] = 10.0
    drain_delay: Annotated[float, msgspec.Meta(ge=0)] = 0.0  # behind a load balancer: see config.toml
    replica: str = ""  # this replica's name: the `replica` label of /metrics


class ResponsesSection(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    store: bool = True  # keep responses for previous_response_id, GET /responses/{id}
    path: str = "responses"  # their folder: SQLite records and state files
    max_state_bytes: NonNegative = 1 << 30  # the states' cap; beyond it the least recently used are dropped
    max_record_bytes: NonNegative = 256 << 20  # the records' cap (texts and token ids), least recently used go
    ttl: Positive = 30 * 86400  # seconds a stored response lives after it was last read
    required: bool = True  # a store that cannot be opened stops the server (false: serve without it)


class StoreSection(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    # Empty: the embedded SQLite store of [responses]; redis:// or rediss://: Redis or Valkey,
    # shared by replicas, so any of them continues any stored conversation.
    url: str = ""
    prefix: str = "ai00:"  # every key starts with it, so one Redis can serve several clusters
    ttl: Positive = 30 * 86400  # seconds a stored response lives after it was last read


STORE_SCHEMES = ("redis", "rediss")


class CacheSection(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    """The prefix state cache's tiers below memory: a disk tier, for states that outlive a
    restart and an unload, and a shared tier in the Redis of [store] url, for states that
    other replicas find."""

    enabled: bool = True
    path: str = "cache"  # its folder, relative to the config file's
    disk_bytes: int | str = "4 GiB"  # the folder's cap (bytes, or such as "4 GiB"); 0 turns it off
    min_tokens: Annotated[int, msgspec.Meta(ge=0)] = 256  # shorter prefixes are kept in neither tier
    shared: bool = True  # with [store] url: prompts' states go to that Redis too, for every replica


class WebSection(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    path: str = "assets/www"  # a folder, or a .zip unpacked at start (Ai00 ships index.zip)
    open_browser: bool = True  # the double-click start (launcher.py) opens the page


class OllamaSection(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    # "host:port" of a second listener with the same routes, for apps that only know Ollama's
    # port (11434); empty: none. The Ollama routes answer on [listen]'s port either way.
    listen: str = ""

    def address(self) -> tuple[str, int] | None:
        """(host, port) of `listen`, or None when it is empty; ValueError when it is no address."""
        if not self.listen:
            return None
        host, sep, port = self.listen.rpartition(":")
        host = host.strip("[]")  # "[::1]:11434"
        if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
            raise ValueError(f"must be 'host:port' such as '127.0.0.1:11434'; got {self.listen!r}")
        return host, int(port)


class Config(msgspec.Struct, forbid_unknown_fields=True, kw_only=True):
    model: ModelSection = msgspec.field(default_factory=ModelSection)
    models: list[ModelsSection] = msgspec.field(default_factory=list)
    server: ServerSection = msgspec.field(default_factory=ServerSection)
    state: list[StateSection] = msgspec.field(default_factory=list)
    lora: list[LoraSection] = msgspec.field(default_factory=list)
    tokenizer: TokenizerSection = msgspec.field(default_factory=TokenizerSection)
    listen: ListenSection = msgspec.field(default_factory=ListenSection)
    web: WebSection | None = None  # absent: no web page (as in Ai00)
    responses: ResponsesSection = msgspec.field(default_factory=ResponsesSection)
    store: StoreSection = msgspec.field(default_factory=StoreSection)
    ollama: OllamaSection = msgspec.field(default_factory=OllamaSection)
    cache: CacheSection = msgspec.field(default_factory=CacheSection)
    # Where relative paths are resolved; not a key of the file.
    base_dir: str = "."
    source: str = "<defaults>"

    # ------------------------------------------------------------------ derived values

    def resolve(self, path: str) -> Path:
        p = Path(path).expanduser()
        return p if p.is_absolute() else Path(self.base_dir) / p

    @property
    def model_dir(self) -> Path:
        return self.resolve(self.model.path)

    @property
    def model_file(self) -> Path | None:
        """The configured model file, or None when `[model] name` is empty (start with no model)."""
        return self.model_dir / self.model.name if self.model.name else None

    def disk_cache(self) -> DiskCacheSpec | None:
        """[cache] (and [store]) as every model's tiers below memory, or None when both are off."""
        if not self.cache.enabled:
            return None
        size = byte_size(self.cache.disk_bytes)
        shared = None
        if self.cache.shared and self.store.url:
            shared = SharedCacheSpec(self.store.url, self.store.prefix, self.store.ttl)
        if not size and shared is None:
            return None
        return DiskCacheSpec(str(self.resolve(self.cache.path)), size, self.cache.min_tokens, shared)

    def model_spec(self) -> ModelSpec | None:
        """[model] as a ModelSpec, or None when `[model] name` is empty."""
        if self.model_file is None:
            return None
        return self.spec_of(self.model, tokenizer=self.tokenizer.path, loras=self.lora, states=self.state)

    def spec_of(self, section: ModelSection, *, tokenizer: str, loras: list[LoraSection],
                states: list[StateSection]) -> ModelSpec:
        """How to load the model `section` describes ([model] or one of [[models]])."""
        folder = self.resolve(section.path) if section.path else self.model_dir
        in_folder = lambda path: self._in_folder(folder, path)  # noqa: E731
        return ModelSpec(
            path=str(folder / section.name),
            tokenizer=str(self.resolve(tokenizer)) if tokenizer else None,
            device=section.device,
            precision=section.precision,
            quant=section.quant,
            quant_type=section.quant_type,
            quant_head=section.quant_head,
            exact=section.exact,
            draft_tokens=section.draft_tokens,
            max_batch=section.max_batch,
            token_chunk_size=section.token_chunk_size,
            loras=tuple(LoraSpec(str(in_folder(lora.path)), lora.alpha) for lora in loras),
            states=tuple(StateSpec(str(in_folder(s.path)), s.id, s.name or Path(s.path).name, s.default)
                         for s in states),
            cache_bytes=section.cache_bytes,
            checkpoint_interval=section.checkpoint_interval,
            name=section.served_name or Path(section.name).stem,
            models_dir=str(folder),
            max_prompt_tokens=self.listen.max_prompt_tokens,
            thinking=section.thinking,
            reasoning_effort=section.reasoning_effort,
            max_tokens_limit=section.max_tokens_limit,
            disk_cache=self.disk_cache(),
        )

    def _in_folder(self, folder: Path, path: str) -> Path:
        # Ai00 resolves [[state]]/[[lora]] paths under [model] path; its shipped examples also
        # spell them from the working directory ("assets/models/x.lora"). Accept both.
        under = folder / path
        return under if under.exists() or not self.resolve(path).exists() else self.resolve(path)


# Ai00 keys our engine has no use for: accepted, reported once, then dropped.
_AI00_IGNORED = {
    "model": ("embed_device", "stop"),
    "listen": ("domain", "acme", "tls", "slot", "force_pass", "expire_sec", "app_keys"),
    "": ("bnf", "adapter", "embed"),
}
# Ai00's spellings of the same keys.
_AI00_ALIASES = {"model": {"model_path": "path", "model_name": "name"}}


def _drop_ai00_only_keys(raw: dict, source: str) -> None:
    for section, keys in _AI00_IGNORED.items():
        table = raw if section == "" else raw.get(section)
        if not isinstance(table, dict):
            continue
        for key in keys:
            if key in table:
                del table[key]
                where = key if section == "" else f"{section}.{key}"
                log.warning("%s: %s is an Ai00 setting this server does not use; ignored", source, where)
    for section, aliases in _AI00_ALIASES.items():
        table = raw.get(section)
        if isinstance(table, dict):
            for old, new in aliases.items():
                if old in table and new not in table:
                    table[new] = table.pop(old)


def _key_path(message: str) -> tuple[str, str]:
    """msgspec says "Expected `int` >= 1 - at `$.model.max_batch`"; split it into key and problem."""
    problem, sep, where = message.rpartition(" - at `$")
    if not sep:
        problem, where = message, ""
    return where.rstrip("`").lstrip("."), problem[:1].lower() + problem[1:]


def parse_config(text: str, *, source: str = DEFAULT_CONFIG, base_dir: str | Path = ".") -> Config:
    try:
        raw = tomllib.loads(text)
    except tomllib.TOMLDecodeError as e:
        raise ConfigError(f"{source}: not valid TOML: {e}") from None
    _drop_ai00_only_keys(raw, source)
    for internal in ("base_dir", "source"):
        if internal in raw:
            raise ConfigError(f"{source}: {internal}: unknown key")
    try:
        config = msgspec.convert(raw, Config)
    except msgspec.ValidationError as e:
        key, problem = _key_path(str(e))
        if problem.startswith("object contains unknown field"):
            field = problem.split("`")[1] if "`" in problem else "?"
            key, problem = (f"{key}.{field}" if key else field), "unknown key"
        raise ConfigError(f"{source}: {key or 'top level'}: {problem}") from None
    config.base_dir, config.source = str(base_dir), source
    _check(config)
    return config


def _check(config: Config) -> None:
    source = config.source
    _check_states(source, "state", config.state)
    _check_model(source, "model", config.model)
    for n, section in enumerate(config.models):
        if not section.name:
            raise ConfigError(f"{source}: models[{n}].name: name the model's file")
        _check_model(source, f"models[{n}]", section)
        _check_states(source, f"models[{n}].state", section.state)
    _check_served_names(config)
    _check_budget(source, config.server.memory_budget)
    try:
        byte_size(config.cache.disk_bytes)
    except ValueError as e:
        raise ConfigError(f"{source}: cache.disk_bytes: {e}") from None
    if bool(config.listen.tls_cert) != bool(config.listen.tls_key):
        raise ConfigError(f"{source}: listen.tls_cert and listen.tls_key: set both (TLS) or neither")
    _check_store_url(source, config.store.url)
    _check_listen(source, config.listen)
    try:
        config.ollama.address()
    except ValueError as e:
        raise ConfigError(f"{source}: ollama.listen: {e}") from None


def _check_states(source: str, where: str, states: list[StateSection]) -> None:
    ids: set[str] = set()
    for n, state in enumerate(states):
        if not state.id:
            # Ai00 draws a random UUID on every start, so clients cannot keep using an id;
            # one derived from the path is the same on every start.
            state.id = str(uuid.uuid5(uuid.NAMESPACE_URL, f"ai00-like-state:{state.path}"))
        else:
            try:
                uuid.UUID(state.id)
            except ValueError:
                raise ConfigError(f"{source}: {where}[{n}].id: not a UUID: {state.id!r}") from None
        if state.id in ids:
            raise ConfigError(f"{source}: {where}[{n}].id: {state.id} is used by another [[state]]")
        ids.add(state.id)
    if sum(state.default for state in states) > 1:
        raise ConfigError(f"{source}: {where}: more than one [[state]] has default = true")


def _check_model(source: str, where: str, section: ModelSection) -> None:
    try:
        check_device(section.device)
        quant_options(section.precision, section.quant, section.quant_type)
    except ValueError as e:
        key = "device" if "device" in str(e) else "precision" if "precision" in str(e) else "quant_type"
        raise ConfigError(f"{source}: {where}.{key}: {e}") from None
    name = section.name
    if name and (Path(name).is_absolute() or ".." in Path(name).parts):
        raise ConfigError(f"{source}: {where}.name: must be a file inside the models folder, got {name!r}")


def _check_served_names(config: Config) -> None:
    """Every name a request may use must pick one model."""
    sections = ([("model", config.model)] if config.model.name else []) + \
        [(f"models[{n}]", section) for n, section in enumerate(config.models)]
    owners: dict[str, str] = {}
    for where, section in sections:
        served = section.served_name or Path(section.name).stem
        for key, name in [("served_name", served), *((f"aliases[{k}]", a) for k, a in enumerate(section.aliases))]:
            if name in owners and owners[name] != where:
                raise ConfigError(f"{config.source}: {where}.{key}: {name!r} already names {owners[name]}")
            owners[name] = where


def memory_budget_bytes(value: int | str) -> int | None:
    """[server] memory_budget in bytes, or None for "auto"; raises ValueError on anything else."""
    if isinstance(value, str) and value.strip().lower() == "auto":
        return None
    return byte_size(value, other=' or "auto"')


def byte_size(value: int | str, *, other: str = "") -> int:
    """Bytes as a number or such as "8 GiB", "512 MiB"; ValueError on anything else (its
    message names the `other` values the key takes too)."""
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"must be a number of bytes >= 0{other}")
        return value
    text = value.strip()
    number = text.rstrip("KMGTiBb ").strip()
    unit = text[len(number):].strip().lower().removesuffix("b").removesuffix("i")
    scale = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}.get(unit)
    try:
        amount = float(number)
    except ValueError:
        amount = -1.0
    if scale is None or amount < 0:
        raise ValueError(f"must be bytes (a number, or such as \"8 GiB\"){other}; got {value!r}")
    return int(amount * scale)


def _check_budget(source: str, value: int | str) -> None:
    try:
        memory_budget_bytes(value)
    except ValueError as e:
        raise ConfigError(f"{source}: server.memory_budget: {e}") from None


def _check_listen(source: str, listen: ListenSection) -> None:
    """Values that would open the server, or could never match a request, stop it at start."""
    for n, key in enumerate(listen.api_keys):
        _check_key(source, f"listen.api_keys[{n}]", key)
    if listen.admin_key:  # "" is no admin key
        _check_key(source, "listen.admin_key", listen.admin_key)
    for n, origin in enumerate(listen.cors_origins):
        if origin not in ("*", "null") and not _is_origin(origin):
            raise ConfigError(f"{source}: listen.cors_origins[{n}]: must be an origin such as 'http://localhost:3000' "
                              f"(no path), 'null' or '*'; got {origin!r}")
    for n, host in enumerate(listen.allowed_hosts):
        if not _is_host_pattern(host):
            raise ConfigError(f"{source}: listen.allowed_hosts[{n}]: must be a host name such as 'ai.example.com', "
                              f"'.example.com' (it and its subdomains) or '*', without scheme or port; got {host!r}")


def _check_key(source: str, where: str, key: str) -> None:
    # An empty key would match `Authorization: Bearer ` with nothing after it: every route open.
    if not key.strip():
        raise ConfigError(f"{source}: {where}: empty key; remove it (an empty key would let anyone in)")
    if key != key.strip():  # the server strips the header's token, so such a key never matches
        raise ConfigError(f"{source}: {where}: the key begins or ends with spaces")


def _is_origin(origin: str) -> bool:
    try:
        parts = urlsplit(origin)
        parts.port  # noqa: B018 - raises on a port that is not a number
    except ValueError:
        return False
    return bool(parts.scheme and parts.hostname) and parts.path in ("", "/") and not (
        parts.query or parts.fragment or parts.username or "@" in parts.netloc)


def _is_host_pattern(host: str) -> bool:
    if host == "*":
        return True
    name = host.removeprefix(".")
    if name.startswith("[") and name.endswith("]"):
        name = name[1:-1]
    if not name or any(c.isspace() or c in "/@?#*[]" for c in name):
        return False
    if ":" in name:  # only an IPv6 address may hold colons; a port is not part of a host name
        try:
            ipaddress.IPv6Address(name)
        except ValueError:
            return False
    return True


def _check_store_url(source: str, url: str) -> None:
    if not url:
        return
    # The URL may hold a password: the message names its scheme, never the whole URL.
    try:
        parts = urlsplit(url)
        parts.port  # noqa: B018 - raises on a port that is not a number
    except ValueError as e:
        raise ConfigError(f"{source}: store.url: not a valid URL: {e}") from None
    if parts.scheme not in STORE_SCHEMES or not parts.hostname:
        got = f"scheme {parts.scheme!r}" if parts.scheme not in STORE_SCHEMES else "no host"
        raise ConfigError(f"{source}: store.url: must be redis://host:port/db or rediss://host:port/db (Redis or "
                          f"Valkey), or empty for the embedded store; got {got}")


def load_config(path: str | Path | None) -> Config:
    """Read a config file. `None` means ./config.toml if it exists, else all defaults."""
    if path is None:
        path = Path(DEFAULT_CONFIG)
        if not path.exists():
            log.info("no %s here; using default settings (no model)", DEFAULT_CONFIG)
            return Config()
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"{path}: no such file") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ConfigError(f"{path}: cannot read: {e}") from None
    return parse_config(text, source=str(path), base_dir=path.resolve().parent)
