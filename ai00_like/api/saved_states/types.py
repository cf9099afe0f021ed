"""The wire types of /v1/saved_states (ours, in OpenAI's style)."""

from __future__ import annotations

from typing import Literal

import msgspec

from ..oai.types import ChatMessage, ChatTemplate, KeepAlive, NamedToolChoice, StateRef, ToolDef


class SaveStateRequest(msgspec.Struct, kw_only=True):
    """Text to read once (`input`, raw as /states reads it) or chat `messages` (rendered as
    chat renders them, after `tools` as chat announces them, without the assistant's
    prompt), from `state` (a saved state's id: a fork) or the model's own."""

    model: str | None = None
    input: str | list[str] | None = None
    messages: list[ChatMessage] | None = None
    name: str | None = msgspec.field(default=None)
    state: str | StateRef | None = None
    names: dict[str, str] | None = None  # as chat's: the speakers' names
    template: ChatTemplate | None = None  # as chat's
    tools: list[ToolDef] | None = None  # as chat's: announced before the messages, as chat announces them
    tool_choice: Literal["none", "auto", "required"] | NamedToolChoice | None = None  # "none": not announced
    keep_alive: KeepAlive = None


class SavedState(msgspec.Struct, kw_only=True):
    id: str
    name: str | None
    model: str
    tokens: int  # how many tokens the state has read
    bytes: int  # the state's size
    created_at: int
    last_used_at: int
    object: str = "saved_state"


class SavedStateList(msgspec.Struct, kw_only=True):
    data: list[SavedState]
    object: str = "list"


class DeletedSavedState(msgspec.Struct, kw_only=True):
    id: str
    object: str = "saved_state.deleted"
    deleted: bool = True
