"""Wire structs of Ollama's API (its docs/api.md), requests and responses.

Requests are lenient as Ollama's own server is: unknown fields are ignored. `options` is
read field by field (options.py) so that a wrong type names `options.<name>`. Responses
are exact: the fields Ollama documents, optional ones left out (UNSET) rather than null.
Durations are nanoseconds, times RFC 3339, as Ollama sends them.
"""

from __future__ import annotations

from typing import Any

import msgspec
from msgspec import UNSET, UnsetType

from ..oai.types import KeepAlive

# ---------------------------------------------------------------------------------- requests


class ToolFunctionIn(msgspec.Struct):
    name: str
    arguments: dict[str, Any] | str = msgspec.field(default_factory=dict)  # Ollama: an object


class ToolCallIn(msgspec.Struct):
    function: ToolFunctionIn


class Message(msgspec.Struct):
    role: str
    content: str | None = None
    thinking: str | None = None  # earlier thinking: not shown to the model again
    images: list[Any] | None = None
    tool_calls: list[ToolCallIn] | None = None
    tool_name: str | None = None


class FunctionSpec(msgspec.Struct):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None


class Tool(msgspec.Struct):
    function: FunctionSpec
    type: str = "function"


class GenerationFields(msgspec.Struct, kw_only=True):
    """What /api/chat and /api/generate share."""

    model: str = ""
    stream: bool = True
    format: str | dict[str, Any] | None = None
    options: dict[str, Any] | None = None
    keep_alive: KeepAlive = None
    think: bool | str | None = None


class ChatRequest(GenerationFields, kw_only=True):
    messages: list[Message] | None = None
    tools: list[Tool] | None = None


class GenerateRequest(GenerationFields, kw_only=True):
    prompt: str | None = None
    suffix: str | None = None
    system: str | None = None
    template: str | None = None
    context: list[int] | None = None
    raw: bool = False
    images: list[Any] | None = None


class EmbedRequest(msgspec.Struct, kw_only=True):
    model: str = ""
    input: str | list[str] = ""
    truncate: bool = True
    dimensions: int | None = None
    options: dict[str, Any] | None = None
    keep_alive: KeepAlive = None


class EmbeddingsRequest(msgspec.Struct, kw_only=True):
    model: str = ""
    prompt: str = ""
    options: dict[str, Any] | None = None
    keep_alive: KeepAlive = None


class ModelRequest(msgspec.Struct, kw_only=True):
    """/api/show and /api/delete; `name` is the older spelling of `model`."""

    model: str = ""
    name: str = ""
    verbose: bool = False

    @property
    def named(self) -> str:
        return self.model or self.name


class PullRequest(ModelRequest, kw_only=True):
    stream: bool = True
    insecure: bool = False


# --------------------------------------------------------------------------------- responses


class ToolFunctionOut(msgspec.Struct):
    name: str
    arguments: dict[str, Any]


class ToolCallOut(msgspec.Struct):
    function: ToolFunctionOut


class MessageOut(msgspec.Struct, kw_only=True):
    role: str = "assistant"
    content: str = ""
    thinking: str | UnsetType = UNSET
    tool_calls: list[ToolCallOut] | UnsetType = UNSET


class Timings(msgspec.Struct, kw_only=True):
    """The final object's statistics, in nanoseconds and tokens."""

    total_duration: int | UnsetType = UNSET
    load_duration: int | UnsetType = UNSET
    prompt_eval_count: int | UnsetType = UNSET
    prompt_eval_duration: int | UnsetType = UNSET
    eval_count: int | UnsetType = UNSET
    eval_duration: int | UnsetType = UNSET


class ChatResponse(Timings, kw_only=True):
    model: str
    created_at: str
    message: MessageOut
    done: bool
    done_reason: str | UnsetType = UNSET


class GenerateResponse(Timings, kw_only=True):
    model: str
    created_at: str
    response: str
    thinking: str | UnsetType = UNSET
    done: bool
    done_reason: str | UnsetType = UNSET


class EmbedResponse(msgspec.Struct, kw_only=True):
    model: str
    embeddings: list[list[float]]
    total_duration: int
    load_duration: int
    prompt_eval_count: int


class EmbeddingsResponse(msgspec.Struct):
    embedding: list[float]


class Details(msgspec.Struct, kw_only=True):
    parent_model: str = ""
    format: str
    family: str = "rwkv"
    families: list[str] = msgspec.field(default_factory=lambda: ["rwkv"])
    parameter_size: str
    quantization_level: str


class ListedModel(msgspec.Struct, kw_only=True):
    name: str
    model: str
    modified_at: str
    size: int
    digest: str
    details: Details


class ModelList(msgspec.Struct):
    models: list[ListedModel]


class RunningModel(msgspec.Struct, kw_only=True):
    name: str
    model: str
    size: int
    digest: str
    details: Details
    expires_at: str
    size_vram: int
    context_length: int


class RunningList(msgspec.Struct):
    models: list[RunningModel]


class ShowResponse(msgspec.Struct, kw_only=True):
    modelfile: str
    parameters: str
    template: str
    details: Details
    model_info: dict[str, Any]
    capabilities: list[str]
    modified_at: str


class Version(msgspec.Struct):
    version: str


class Status(msgspec.Struct, kw_only=True):
    """One object of a pull's progress (or its end, `success`)."""

    status: str
    digest: str | UnsetType = UNSET
    total: int | UnsetType = UNSET
    completed: int | UnsetType = UNSET


class Error(msgspec.Struct):
    """Ollama's error object, also the last line of a stream that failed."""

    error: str
