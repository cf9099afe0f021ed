"""Wire structs of the OpenAI-compatible routes, requests and responses, in one place.

Requests are lenient: unknown fields are ignored (real clients send dozens we do not
use), and fields that only some clients send are optional. Types are still checked, so a
wrong type or range is a 400 that names the field (msgspec reports the JSON path).
Ai00's own request fields (`names`, `template`, `state`, `sampler`, `bias`, …) sit beside
OpenAI's.

Responses are exact: field names, required fields and nullability as in OpenAI's schemas
(vendored for the tests in `tests/data/openai/openapi-subset.yaml`); fields that are optional there use UNSET so they
are left out rather than sent as null.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec
from msgspec import UNSET, UnsetType

from ...messages import Effort
from ...sampler import SamplerParams

# ---------------------------------------------------------------------------------- requests

NonNegative = Annotated[int, msgspec.Meta(ge=0)]
ChoiceCount = Annotated[int, msgspec.Meta(ge=1, le=128)]
TopLogprobs = Annotated[int, msgspec.Meta(ge=0, le=20)]



# Seconds, or a duration such as "5m" or "1h30m"; -1 (any negative) keeps the model loaded, 0 unloads it
# once idle (api/keep_alive.py reads it).
KeepAlive = float | str | None

class ContentPart(msgspec.Struct):
    type: str
    text: str | None = None


class FunctionCallIn(msgspec.Struct):
    name: str
    arguments: str | dict[str, Any] = ""


class ToolCallIn(msgspec.Struct):
    """A call an earlier assistant turn made, as clients send it back."""

    function: FunctionCallIn
    id: str | None = None
    type: str = "function"


class ChatMessage(msgspec.Struct):
    role: str
    content: str | list[ContentPart] | None = None
    name: str | None = None
    tool_calls: list[ToolCallIn] | None = None
    tool_call_id: str | None = None


class ChatTemplate(msgspec.Struct):
    """Ai00's `template`: how messages render into the RWKV prompt (all three required)."""

    record: str
    prefix: str
    sep: str


class StateRef(msgspec.Struct):
    """Ai00's object form of `state`: a reference (`id`, `name`, or a `.state` file `path` in
    the models folder) or the state itself (`data` and `shape`, as /states returns them;
    `data` as floats or base64 of little-endian float32)."""

    id: str | None = None
    name: str | None = None
    path: str | None = None
    data: list[float] | str | None = None
    shape: list[int] | None = None


class StreamOptions(msgspec.Struct):
    include_usage: bool = False


class JsonSchemaFormat(msgspec.Struct):
    name: str | None = None
    description: str | None = None
    schema: dict[str, Any] | None = None
    strict: bool | None = None


class ResponseFormat(msgspec.Struct):
    type: str
    json_schema: JsonSchemaFormat | None = None


class FunctionDef(msgspec.Struct):
    name: str
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ToolDef(msgspec.Struct):
    function: FunctionDef
    type: str = "function"


class NamedFunction(msgspec.Struct):
    name: str


class NamedToolChoice(msgspec.Struct):
    function: NamedFunction
    type: str = "function"


class SamplingFields(msgspec.Struct, kw_only=True):
    """Fields chat and completions share."""

    model: str | None = None
    keep_alive: KeepAlive = None  # ours, as Ollama's: how long the model stays loaded once idle
    max_tokens: int | None = None
    stop: str | list[str] | None | UnsetType = UNSET  # explicit null: no stop strings (Ai00)
    n: ChoiceCount | None = None
    stream: bool | None = None
    stream_options: StreamOptions | None = None
    seed: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    presence_penalty: float | None = None
    frequency_penalty: float | None = None
    penalty_decay: float | None = None
    repetition_penalty: float | None = None  # vLLM's: llama.cpp's multiplicative penalty
    repetition_window: int | None = None  # ours (Ollama's repeat_last_n): its last tokens; default 64, -1 all
    logit_bias: dict[str, float] | None = None
    bias: dict[str, float] | None = None  # Ai00's name of logit_bias
    sampler: SamplerParams | None = None  # Ai00's tagged sampler
    sampler_override: SamplerParams | None = None
    state: str | StateRef | None = None  # Ai00: initial state, by id or name
    user: str | None = None
    response_format: ResponseFormat | None = None
    bnf_schema: str | None = None  # Ai00: a KBNF grammar the output must follow
    speculative: bool | None = None  # ours: false turns speculative decoding (prompt-lookup drafts) off


class ChatCompletionRequest(SamplingFields, kw_only=True):
    messages: list[ChatMessage] | ChatMessage | None = None  # Ai00 also takes one message
    max_completion_tokens: int | None = None
    logprobs: bool | None = None
    top_logprobs: TopLogprobs | None = None
    names: dict[str, str] | None = None
    template: ChatTemplate | None = None
    tools: list[ToolDef] | None = None
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None
    parallel_tool_calls: bool | None = None
    reasoning_effort: Effort | None = None
    chat_template_kwargs: dict[str, Any] | None = None  # vLLM's; we read enable_thinking


class CompletionRequest(SamplingFields, kw_only=True):
    prompt: str | list[Any] | None = None
    echo: bool | None = None
    logprobs: Annotated[int, msgspec.Meta(ge=0, le=20)] | None = None
    suffix: str | None = None
    best_of: int | None = None


class ChooseRequest(msgspec.Struct, kw_only=True):
    """Ai00's /chooses: rank `choices` as continuations of `input` (a list is concatenated)."""

    input: str | list[str]
    choices: list[str]
    calibrate: bool = False
    state: str | StateRef | None = None
    model: str | None = None
    keep_alive: KeepAlive = None  # ours, as Ollama's: how long the model stays loaded once idle


class StatesRequest(msgspec.Struct, kw_only=True):
    """Ai00's /states: the RNN state after `input` (a list is concatenated)."""

    input: str | list[str]
    state: str | StateRef | None = None
    model: str | None = None
    keep_alive: KeepAlive = None  # ours, as Ollama's: how long the model stays loaded once idle
    encoding_format: Literal["float", "base64"] = "float"  # ours, as for embeddings


class EmbeddingRequest(msgspec.Struct, kw_only=True):
    input: str | list[Any]
    model: str | None = None
    keep_alive: KeepAlive = None  # ours, as Ollama's: how long the model stays loaded once idle
    encoding_format: Literal["float", "base64"] = "float"
    dimensions: Annotated[int, msgspec.Meta(ge=1)] | None = None
    user: str | None = None


# --------------------------------------------------------------------------------- responses


class PromptTokensDetails(msgspec.Struct):
    cached_tokens: int = 0


class CompletionTokensDetails(msgspec.Struct):
    reasoning_tokens: int = 0


class Usage(msgspec.Struct):
    prompt_tokens: int
    completion_tokens: int
    total_tokens: int
    prompt_tokens_details: PromptTokensDetails | UnsetType = UNSET
    completion_tokens_details: CompletionTokensDetails | UnsetType = UNSET  # with a reasoning model


class TopLogprob(msgspec.Struct):
    token: str
    logprob: float
    bytes: list[int] | None


class TokenLogprob(msgspec.Struct):
    token: str
    logprob: float
    bytes: list[int] | None
    top_logprobs: list[TopLogprob]


class ChoiceLogprobs(msgspec.Struct):
    content: list[TokenLogprob] | None
    refusal: list[TokenLogprob] | None = None


class FunctionCall(msgspec.Struct):
    name: str
    arguments: str


class ToolCall(msgspec.Struct, kw_only=True):
    id: str
    type: Literal["function"] = "function"
    function: FunctionCall


class FunctionCallDelta(msgspec.Struct):
    name: str | UnsetType = UNSET
    arguments: str | UnsetType = UNSET


class ToolCallDelta(msgspec.Struct, kw_only=True):
    index: int
    id: str | UnsetType = UNSET
    type: Literal["function"] | UnsetType = UNSET
    function: FunctionCallDelta


class AssistantMessage(msgspec.Struct, kw_only=True):
    role: Literal["assistant"] = "assistant"
    content: str | None
    refusal: str | None = None
    tool_calls: list[ToolCall] | UnsetType = UNSET
    reasoning_content: str | UnsetType = UNSET  # the thinking (DeepSeek's and vLLM's field)


class ChatChoice(msgspec.Struct):
    index: int
    message: AssistantMessage
    logprobs: ChoiceLogprobs | None
    finish_reason: str


class ChatCompletion(msgspec.Struct, kw_only=True):
    id: str
    object: Literal["chat.completion"] = "chat.completion"
    created: int
    model: str
    system_fingerprint: str
    choices: list[ChatChoice]
    usage: Usage


class Delta(msgspec.Struct):
    role: Literal["assistant"] | UnsetType = UNSET
    content: str | UnsetType = UNSET
    reasoning_content: str | UnsetType = UNSET
    tool_calls: list[ToolCallDelta] | UnsetType = UNSET


class ChunkChoice(msgspec.Struct):
    index: int
    delta: Delta
    logprobs: ChoiceLogprobs | None = None
    finish_reason: str | None = None


class ChatCompletionChunk(msgspec.Struct, kw_only=True):
    id: str
    object: Literal["chat.completion.chunk"] = "chat.completion.chunk"
    created: int
    model: str
    system_fingerprint: str
    choices: list[ChunkChoice]
    # Present (null, or the totals on the last chunk) only when the client asked for usage.
    usage: Usage | None | UnsetType = UNSET


class LegacyLogprobs(msgspec.Struct):
    tokens: list[str]
    token_logprobs: list[float | None]
    top_logprobs: list[dict[str, float] | None]
    text_offset: list[int]


class CompletionChoice(msgspec.Struct):
    index: int
    text: str
    logprobs: LegacyLogprobs | None
    finish_reason: str | None


class Completion(msgspec.Struct, kw_only=True):
    """Both the response and each streamed chunk (OpenAI uses one shape for both)."""

    id: str
    object: Literal["text_completion"] = "text_completion"
    created: int
    model: str
    system_fingerprint: str
    choices: list[CompletionChoice]
    usage: Usage | UnsetType = UNSET  # not nullable in the spec: left out of all but the last chunk


class EmbeddingItem(msgspec.Struct, kw_only=True):
    object: Literal["embedding"] = "embedding"
    index: int
    embedding: list[float] | str  # str: base64 of little-endian float32, as OpenAI sends it


class EmbeddingUsage(msgspec.Struct):
    prompt_tokens: int
    total_tokens: int


class EmbeddingList(msgspec.Struct, kw_only=True):
    object: Literal["list"] = "list"
    data: list[EmbeddingItem]
    model: str
    usage: EmbeddingUsage


class ModelCard(msgspec.Struct, kw_only=True):
    id: str
    object: Literal["model"] = "model"
    created: int
    owned_by: str
    # Ours: the model's place in this server (api/pool.py).
    status: Literal["loaded", "loading", "unloaded"] = "loaded"
    memory_bytes: int | None = None  # weights in their loaded form, slot states and prefix cache; estimated until loaded
    thinking: bool = False  # a reasoning model
    context_length: int | None = None  # the longest prompt accepted, in tokens; None: no limit (an RNN has none)
    aliases: list[str] = msgspec.field(default_factory=list)  # other names requests may use
    keep_alive: float = -1.0  # idle seconds before it is unloaded; -1: never


class ModelList(msgspec.Struct, kw_only=True):
    object: Literal["list"] = "list"
    data: list[ModelCard]


class RankedChoice(msgspec.Struct, kw_only=True):
    object: Literal["choice"] = "choice"
    index: int  # position in the request's `choices`
    rank: int  # 0 = most likely
    choice: str
    perplexity: float | None  # mean negative log-likelihood per token; null for an empty choice


class ChoiceList(msgspec.Struct, kw_only=True):
    object: Literal["list"] = "list"
    model: str
    data: list[RankedChoice]
    usage: EmbeddingUsage


class StateData(msgspec.Struct, kw_only=True):
    object: Literal["states"] = "states"
    index: int
    data: list[float] | str
    shape: list[int]


class StateList(msgspec.Struct, kw_only=True):
    object: Literal["list"] = "list"
    model: str
    data: list[StateData]
    usage: EmbeddingUsage
