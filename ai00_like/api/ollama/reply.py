"""A reply read as Ollama shows it: thinking, content, and tool calls sent whole.

The reply is read by chat's ReplyReader (so thinking and calls are split as every other
API splits them); what differs is the shape. Ollama sends a call once it is complete, with
its arguments as an object, not piece by piece as OpenAI streams them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field

from ..oai.reply import ReplyReader
from ..oai.tools import Call
from .types import ToolCallOut, ToolFunctionOut


@dataclass
class Piece:
    """What one push made certain."""

    content: str = ""
    thinking: str = ""
    calls: list[ToolCallOut] = field(default_factory=list)

    def __bool__(self) -> bool:
        return bool(self.content or self.thinking or self.calls)


def tool_call(call: Call) -> ToolCallOut:
    """A call with its arguments as an object; a call cut short (max tokens) has what could be read: none."""
    try:
        arguments = json.loads(call.arguments) if call.arguments.strip() else {}
    except ValueError:
        arguments = {}
    return ToolCallOut(ToolFunctionOut(call.name, arguments if isinstance(arguments, dict) else {}))


class OllamaReply:
    def __init__(self, reader: ReplyReader):
        self.reader = reader
        self.sent_calls = 0
        self.opened = self._piece(reader.opened)  # a forced call's opening (not asked through Ollama's API)

    def push(self, text: str, tokens: int) -> Piece:
        return self._piece(self.reader.push(text, tokens))

    def finish(self) -> Piece:
        return self._piece(self.reader.finish(), final=True)

    def _piece(self, events: list[tuple], final: bool = False) -> Piece:
        piece = Piece()
        for event in events:
            if event[0] == "content":
                piece.content += event[1]
            elif event[0] == "reasoning":
                piece.thinking += event[1]
        calls = self.reader.calls
        ready = len(calls) if final else next((i for i, c in enumerate(calls) if not c.complete), len(calls))
        piece.calls = [tool_call(c) for c in calls[self.sent_calls:ready]]
        self.sent_calls = max(self.sent_calls, ready)
        return piece

    @property
    def content(self) -> str:
        return self.reader.content_text

    @property
    def thinking(self) -> str | None:
        return self.reader.reasoning_text

    @property
    def calls(self) -> list[ToolCallOut]:
        return [tool_call(c) for c in self.reader.calls]
