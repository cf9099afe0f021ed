"""A reply as clients see it: its thinking, its content and its tool calls, read as it streams.

The reply is the text the model generated, preceded by its opening when the prompt wrote
one for it (`<think`, a fake think, a forced call's `<tool_call>{"name": "f", "arguments": `):
thinking is split off first (reasoning.py), and what follows is content, or tool calls
when tools were offered (tools.py). Chat and the Responses API both read replies here, so
they agree on what a reply holds and on how many of its tokens were thinking.
"""

from __future__ import annotations

from .reasoning import NO_THINK, THINK, ThinkReader
from .tools import Call, ToolCallReader


class ReplyReader:
    """`push(text, tokens)` returns what became certain: ("reasoning", text), ("content", text),
    ("call", Call) when a call's name is known, ("arguments", index, text) as they arrive.
    `opened` holds what the reply's opening itself made certain (a forced call's name)."""

    def __init__(self, tools: bool = False, opening: str = ""):
        thinks = opening in (THINK, NO_THINK)
        self.think = ThinkReader(opening if thinks else "")
        self.tool_reader = ToolCallReader() if tools else None
        self.reasoning_tokens = 0
        self.reasoning: list[str] = []
        self.content: list[str] = []
        self.opened = [] if thinks or not opening else self.push(opening)

    @property
    def calls(self) -> list[Call]:
        return self.tool_reader.calls if self.tool_reader is not None else []

    @property
    def reasoning_text(self) -> str | None:
        return "".join(self.reasoning) or None

    @property
    def content_text(self) -> str:
        return "".join(self.content)

    def push(self, text: str, tokens: int = 0) -> list[tuple]:
        if self.think.thinking:
            self.reasoning_tokens += tokens
        return self._route(self.think.push(text))

    def finish(self) -> list[tuple]:
        """End of the reply: what was held back."""
        events = self._route(self.think.finish())
        if self.tool_reader is not None:
            events += self._record(self.tool_reader.finish())
        return events

    def _route(self, pieces: list[tuple[str, str]]) -> list[tuple]:
        events = []
        for kind, text in pieces:
            if kind == "reasoning":
                self.reasoning.append(text)
                events.append((kind, text))
            elif self.tool_reader is not None:
                events += self._record(self.tool_reader.push(text))
            else:
                events += self._record([("content", text)])
        return events

    def _record(self, events: list[tuple]) -> list[tuple]:
        self.content.extend(e[1] for e in events if e[0] == "content")
        return events
