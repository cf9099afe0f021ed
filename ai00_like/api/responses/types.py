"""Wire structs of the Responses API (`POST /responses` and its stored objects and events),
as OpenAI's schemas (tests/data/openai/openapi-subset.yaml) spell them.

Requests are lenient as chat's are: input items arrive as plain dicts and are read by
items.py, which can then name the item it cannot use; unknown fields are ignored.
"""

from __future__ import annotations

from typing import Any, Literal

import msgspec
from msgspec import UNSET, UnsetType

from ...messages import Effort
from ..oai.types import KeepAlive

# ---------------------------------------------------------------------------------- requests


class FormatSpec(msgspec.Struct):
    type: str = "text"
    name: str | None = None
    schema: dict[str, Any] | None = None
    strict: bool | None = None
    description: str | None = None


class TextParam(msgspec.Struct):
    format: FormatSpec | None = None


class ReasoningParam(msgspec.Struct):
    effort: Effort | None = None
    summary: str | None = None


class FunctionTool(msgspec.Struct, kw_only=True):
    type: str = "function"
    name: str = ""
    description: str | None = None
    parameters: dict[str, Any] | None = None
    strict: bool | None = None


class ToolChoiceFunction(msgspec.Struct):
    type: str
    name: str | None = None


class CreateResponse(msgspec.Struct, kw_only=True):
    model: str | None = None
    keep_alive: KeepAlive = None  # ours, as chat's
    input: str | list[dict[str, Any]] | None = None
    instructions: str | None = None
    previous_response_id: str | None = None
    state: str | None = None  # ours: a saved state's id (/v1/saved_states) to start the conversation from
    tools: list[FunctionTool] | None = None
    tool_choice: Literal["none", "auto", "required"] | ToolChoiceFunction | None = None
    parallel_tool_calls: bool | None = None
    text: TextParam | None = None
    reasoning: ReasoningParam | None = None
    max_output_tokens: int | None = None
    temperature: float | None = None
    top_p: float | None = None
    store: bool | None = None
    metadata: dict[str, str] | None = None
    stream: bool | None = None
    seed: int | None = None  # ours, as chat's
    user: str | None = None


# ---------------------------------------------------------------------------------- objects


class OutputText(msgspec.Struct, kw_only=True, tag_field="type", tag="output_text"):
    text: str
    annotations: list = msgspec.field(default_factory=list)
    logprobs: list = msgspec.field(default_factory=list)


class ReasoningText(msgspec.Struct, kw_only=True, tag_field="type", tag="reasoning_text"):
    text: str


class OutputMessage(msgspec.Struct, kw_only=True, tag_field="type", tag="message"):
    id: str
    role: Literal["assistant"] = "assistant"
    status: str
    content: list[OutputText]


class FunctionCallItem(msgspec.Struct, kw_only=True, tag_field="type", tag="function_call"):
    id: str
    call_id: str
    name: str
    arguments: str
    status: str


class ReasoningItem(msgspec.Struct, kw_only=True, tag_field="type", tag="reasoning"):
    id: str
    summary: list = msgspec.field(default_factory=list)
    content: list[ReasoningText]
    status: str


OutputItem = OutputMessage | FunctionCallItem | ReasoningItem


class InputTokensDetails(msgspec.Struct):
    cached_tokens: int = 0  # prompt tokens whose state came from the prefix cache or the stored state
    cache_write_tokens: int = 0


class OutputTokensDetails(msgspec.Struct):
    reasoning_tokens: int = 0


class ResponseUsage(msgspec.Struct):
    input_tokens: int
    input_tokens_details: InputTokensDetails
    output_tokens: int
    output_tokens_details: OutputTokensDetails
    total_tokens: int


class IncompleteDetails(msgspec.Struct):
    reason: Literal["max_output_tokens", "content_filter"]


class ReasoningConfig(msgspec.Struct):
    effort: str | None = None
    summary: str | None = None


class TextConfig(msgspec.Struct):
    format: dict[str, Any]


class Response(msgspec.Struct, kw_only=True):
    id: str
    object: Literal["response"] = "response"
    created_at: int
    status: str
    completed_at: int | None = None
    error: None = None
    incomplete_details: IncompleteDetails | None = None
    instructions: str | None
    max_output_tokens: int | None
    model: str
    output: list[OutputItem]
    parallel_tool_calls: bool
    previous_response_id: str | None
    reasoning: ReasoningConfig | None
    store: bool
    temperature: float | None
    text: TextConfig
    tool_choice: Any
    tools: list[dict[str, Any]]
    top_p: float | None
    truncation: str = "disabled"
    usage: ResponseUsage | UnsetType = UNSET
    user: str | UnsetType = UNSET
    metadata: dict[str, str]


class DeletedResponse(msgspec.Struct, kw_only=True):
    id: str
    object: Literal["response"] = "response"
    deleted: bool = True


class ItemList(msgspec.Struct, kw_only=True):
    object: Literal["list"] = "list"
    data: list[dict[str, Any]]
    has_more: bool
    first_id: str | None
    last_id: str | None


# ---------------------------------------------------------------------------------- stream events


class Event(msgspec.Struct, kw_only=True, omit_defaults=False):
    """Every streamed event: its `type` and its place in the stream."""

    type: str
    sequence_number: int


class ResponseEvent(Event, kw_only=True):  # created, in_progress, completed, incomplete
    response: Response


class ItemEvent(Event, kw_only=True):  # output_item.added / .done
    output_index: int
    item: OutputItem


class ContentEvent(Event, kw_only=True):
    """An event about one content part of one output item."""

    item_id: str
    output_index: int
    content_index: int


class PartEvent(ContentEvent, kw_only=True):  # content_part.added / .done
    part: OutputText | ReasoningText


class TextDelta(ContentEvent, kw_only=True):  # output_text.delta (with logprobs), reasoning_text.delta
    delta: str
    logprobs: list | UnsetType = UNSET


class TextDone(ContentEvent, kw_only=True):  # output_text.done (with logprobs), reasoning_text.done
    text: str
    logprobs: list | UnsetType = UNSET


class ArgumentsDelta(Event, kw_only=True):
    item_id: str
    output_index: int
    delta: str


class ArgumentsDone(Event, kw_only=True):
    item_id: str
    output_index: int
    name: str
    arguments: str


class ErrorEvent(Event, kw_only=True):  # error: the stream's last event when the reply could not be finished
    code: str | None
    message: str
    param: str | None
