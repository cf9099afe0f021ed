"""Wire structs of Anthropic's Messages API, requests and responses, in one place.

Requests are lenient as the OpenAI ones are (api/oai/types.py): unknown fields are ignored
(`cache_control`, `context_management`, `service_tier`, `container`, `mcp_servers`, …),
and a content block is one struct whose `type` the reading (read.py) checks, so that a
block we cannot read is refused by its place (`messages[0].content[1].type`) rather than
by msgspec's union error. Responses are exact, as the `anthropic` SDK's types are
(the tests validate against them): required fields always, optional ones left out.
"""

from __future__ import annotations

from typing import Annotated, Any, Literal

import msgspec

from ..oai.types import KeepAlive

# ---------------------------------------------------------------------------------- requests


class InputBlock(msgspec.Struct, kw_only=True):
    """Any content block a client sends; which fields count depends on `type`."""

    type: str
    text: str | None = None  # text
    id: str | None = None  # tool_use
    name: str | None = None  # tool_use
    input: Any = None  # tool_use: the call's arguments, an object
    tool_use_id: str | None = None  # tool_result
    content: str | list[InputBlock] | None = None  # tool_result
    is_error: bool | None = None  # tool_result
    thinking: str | None = None  # thinking (sent back; not read: the prompt drops earlier thinking)


class InputMessage(msgspec.Struct, kw_only=True):
    role: str
    content: str | list[InputBlock]


class SystemBlock(msgspec.Struct, kw_only=True):
    type: str = "text"
    text: str = ""


class ToolParam(msgspec.Struct, kw_only=True):
    """A custom tool (no `type`, or "custom"); anything else is a server tool we do not run."""

    name: str | None = None
    type: str | None = None
    description: str | None = None
    input_schema: dict[str, Any] | None = None


class ToolChoiceParam(msgspec.Struct, kw_only=True):
    type: str
    name: str | None = None
    disable_parallel_tool_use: bool | None = None


class ThinkingParam(msgspec.Struct, kw_only=True):
    type: str  # enabled, disabled, adaptive
    budget_tokens: int | None = None


class OutputConfig(msgspec.Struct, kw_only=True):
    effort: str | None = None


class MessagesInput(msgspec.Struct, kw_only=True):
    """What a prompt is made of: count_tokens takes this, a Messages request more."""

    model: str | None = None
    messages: list[InputMessage]
    system: str | list[SystemBlock] | None = None
    tools: list[ToolParam] | None = None
    tool_choice: ToolChoiceParam | None = None
    thinking: ThinkingParam | None = None
    output_config: OutputConfig | None = None


class MessagesRequest(MessagesInput, kw_only=True):
    max_tokens: Annotated[int, msgspec.Meta(ge=1)]  # required, as Anthropic's
    stop_sequences: list[str] | None = None
    stream: bool | None = None
    temperature: float | None = None
    top_p: float | None = None
    top_k: int | None = None
    metadata: dict[str, Any] | None = None
    keep_alive: KeepAlive = None  # ours, as the other routes': how long the model stays loaded once idle


# --------------------------------------------------------------------------------- responses


class TextBlock(msgspec.Struct, kw_only=True, tag_field="type", tag="text"):
    text: str


class ThinkingBlock(msgspec.Struct, kw_only=True, tag_field="type", tag="thinking"):
    thinking: str
    signature: str


class ToolUseBlock(msgspec.Struct, kw_only=True, tag_field="type", tag="tool_use"):
    id: str
    name: str
    input: dict[str, Any]


ContentBlock = TextBlock | ThinkingBlock | ToolUseBlock
StopReason = Literal["end_turn", "max_tokens", "stop_sequence", "tool_use"]


class Usage(msgspec.Struct, kw_only=True):
    input_tokens: int  # the prompt's tokens read anew: the cached ones are counted apart, as Anthropic does
    output_tokens: int
    cache_creation_input_tokens: int = 0
    cache_read_input_tokens: int = 0  # read from the prefix state cache


class Message(msgspec.Struct, kw_only=True, omit_defaults=False):
    id: str
    model: str
    content: list[ContentBlock]
    stop_reason: StopReason | None
    stop_sequence: str | None
    usage: Usage
    type: Literal["message"] = "message"
    role: Literal["assistant"] = "assistant"


class TokenCount(msgspec.Struct, kw_only=True):
    input_tokens: int


# ---------------------------------------------------------------------------------- streaming


class TextDelta(msgspec.Struct, kw_only=True, tag_field="type", tag="text_delta"):
    text: str


class ThinkingDelta(msgspec.Struct, kw_only=True, tag_field="type", tag="thinking_delta"):
    thinking: str


class SignatureDelta(msgspec.Struct, kw_only=True, tag_field="type", tag="signature_delta"):
    signature: str


class InputJsonDelta(msgspec.Struct, kw_only=True, tag_field="type", tag="input_json_delta"):
    partial_json: str


BlockDelta = TextDelta | ThinkingDelta | SignatureDelta | InputJsonDelta


class Event(msgspec.Struct, kw_only=True):
    """A streamed event: `type` names it in its `event:` line too (sse.EventStream.send_typed)."""

    type: str


class MessageStart(Event, kw_only=True):
    message: Message


class BlockStart(Event, kw_only=True):
    index: int
    content_block: ContentBlock


class BlockDeltaEvent(Event, kw_only=True):
    index: int
    delta: BlockDelta


class BlockStop(Event, kw_only=True):
    index: int


class MessageDeltaBody(msgspec.Struct, kw_only=True, omit_defaults=False):
    stop_reason: StopReason | None
    stop_sequence: str | None


class DeltaUsage(msgspec.Struct, kw_only=True):
    output_tokens: int
    input_tokens: int
    cache_creation_input_tokens: int = 0
    cache_read_input_tokens: int = 0


class MessageDelta(Event, kw_only=True):
    delta: MessageDeltaBody
    usage: DeltaUsage
