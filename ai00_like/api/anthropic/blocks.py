"""A reply as Anthropic's content blocks, and the stream events that build them.

`BlockBuilder` takes a ReplyReader's events (thinking, content, tool calls) in the order
they come and keeps the blocks they make: a `thinking` block, then a `text` block, or one
`tool_use` block per call. Each step returns the events Anthropic's stream has for it:

    content_block_start → content_block_delta (thinking_delta …, signature_delta) → content_block_stop
    content_block_start → content_block_delta (text_delta …) → content_block_stop
    content_block_start (tool_use, input {}) → content_block_delta (input_json_delta …) → content_block_stop

A non-streamed message is built by the same steps with the events dropped, so both give
the same blocks.
"""

from __future__ import annotations

import json

from .types import (
    BlockDeltaEvent,
    BlockStart,
    BlockStop,
    ContentBlock,
    Event,
    InputJsonDelta,
    SignatureDelta,
    TextBlock,
    TextDelta,
    ThinkingBlock,
    ThinkingDelta,
    ToolUseBlock,
)

# Anthropic signs its thinking so that it can be sent back untampered; we have no key to
# sign with and read thinking sent back as nothing, so every block carries this. The SDK
# takes any string.
SIGNATURE = "ai00-like-unsigned"


def tool_use_id(call_id: str) -> str:
    """Anthropic's id for one of our calls ("call_…" → "toolu_…")."""
    return "toolu_" + call_id.removeprefix("call_")


def call_input(arguments: str) -> dict:
    """A call's arguments as the `input` object; {} when they were cut short by max_tokens."""
    try:
        value = json.loads(arguments) if arguments.strip() else {}
    except ValueError:
        return {}
    return value if isinstance(value, dict) else {}


class BlockBuilder:
    def __init__(self) -> None:
        self.blocks: list[ContentBlock] = []
        self.open: str | None = None  # the kind of the block being written: thinking, text, tool_use
        self.arguments = ""  # the open tool_use's arguments so far

    @property
    def index(self) -> int:
        return len(self.blocks) - 1

    def _delta(self, delta) -> Event:
        return BlockDeltaEvent(type="content_block_delta", index=self.index, delta=delta)

    def _start(self, kind: str, block: ContentBlock) -> list[Event]:
        out = self.close()
        self.blocks.append(block)
        self.open = kind
        # The start event carries the block empty: what it holds comes as deltas.
        empty = {"thinking": ThinkingBlock(thinking="", signature=""), "text": TextBlock(text="")}.get(kind, block)
        return out + [BlockStart(type="content_block_start", index=self.index, content_block=empty)]

    def push(self, events: list[tuple]) -> list[Event]:
        out: list[Event] = []
        for event in events:
            kind = event[0]
            if kind == "reasoning":
                if self.open != "thinking":
                    out += self._start("thinking", ThinkingBlock(thinking="", signature=SIGNATURE))
                self.blocks[-1].thinking += event[1]
                out.append(self._delta(ThinkingDelta(thinking=event[1])))
            elif kind == "content":
                if self.open != "text":
                    out += self._start("text", TextBlock(text=""))
                self.blocks[-1].text += event[1]
                out.append(self._delta(TextDelta(text=event[1])))
            elif kind == "call":
                call = event[1]
                out += self._start("tool_use", ToolUseBlock(id=tool_use_id(call.id), name=call.name, input={}))
                self.arguments = ""
            else:  # ("arguments", index, text): always the open call's
                self.arguments += event[2]
                out.append(self._delta(InputJsonDelta(partial_json=event[2])))
        return out

    def close(self) -> list[Event]:
        """End the open block: a thinking block's signature, a call's input, then its stop."""
        if self.open is None:
            return []
        out = []
        if self.open == "thinking":
            out.append(self._delta(SignatureDelta(signature=SIGNATURE)))
        elif self.open == "tool_use":
            self.blocks[-1].input = call_input(self.arguments)
        self.open = None
        return out + [BlockStop(type="content_block_stop", index=self.index)]
