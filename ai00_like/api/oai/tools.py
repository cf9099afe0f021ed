"""OpenAI tool calling for RWKV: how tools and calls are written into the prompt, and read back.

The prompt format (documented in docs/api.md, "Structured output"). The tools are offered in a
system turn before the conversation::

    System: You can call these functions. To call one, answer with
    <tool_call>{"name": "<function name>", "arguments": <arguments as JSON>}</tool_call>
    {"name": "get_weather", "description": "…", "parameters": {…}}

An assistant turn that called tools renders its calls in that same form, one per line
(after its text, if it had any); a `tool` message renders as an `Observation:` turn (Ai00's
name for tool output) holding the result text. The model's reply is constrained by a
grammar (structured.py) to exactly this form with arguments valid for the function's
schema, so `ToolCallReader` can take the calls apart as the text arrives.
"""

from __future__ import annotations

import hashlib
import json
import re
import uuid
from dataclasses import dataclass, field

from .types import ChatMessage

OPEN, CLOSE = "<tool_call>", "</tool_call>"
_HEADER = re.compile(r'\s*<tool_call>\{"name": "([A-Za-z0-9_-]*)", "arguments": ')
_DECODER = json.JSONDecoder()

TOOLS_INSTRUCTION = (
    "You can call these functions. To call one, answer with\n"
    + OPEN + '{"name": "<function name>", "arguments": <arguments as JSON>}' + CLOSE
)


def compact(value) -> str:
    """JSON the way the grammar makes the model write it."""
    return json.dumps(value, ensure_ascii=False, separators=(", ", ": "))


def call_text(name: str, arguments: str) -> str:
    return f'{OPEN}{{"name": "{name}", "arguments": {arguments}}}{CLOSE}'


def tools_message(tools) -> ChatMessage:
    lines = [TOOLS_INSTRUCTION]
    for tool in tools:
        fn = tool.function
        entry = {"name": fn.name}
        if fn.description:
            entry["description"] = fn.description
        entry["parameters"] = fn.parameters or {"type": "object", "properties": {}}
        lines.append(compact(entry))
    return ChatMessage(role="system", content="\n".join(lines))


def tools_digest(tools) -> str:
    """Which tools turn a prompt announced ("" for none): a saved state keeps it, so that a
    chat from it offering the same tools does not announce them a second time."""
    return hashlib.sha256(tools_message(tools).content.encode()).hexdigest() if tools else ""


def _arguments_text(arguments) -> str:
    if isinstance(arguments, dict):
        return compact(arguments)
    try:
        return compact(json.loads(arguments)) if arguments.strip() else "{}"
    except ValueError:
        return arguments  # not JSON: shown to the model as the client sent it


def with_tools(messages: list[ChatMessage], tools) -> list[ChatMessage]:
    """The conversation as render_chat reads it: the tools offered first, earlier calls as text."""
    out = [tools_message(tools)] if tools else []
    for message in messages:
        if message.role.lower() == "assistant" and message.tool_calls:
            calls = [call_text(c.function.name, _arguments_text(c.function.arguments)) for c in message.tool_calls]
            text = message.content if isinstance(message.content, str) else ""
            out.append(ChatMessage(role="assistant", content="\n".join(([text] if text else []) + calls)))
        else:
            out.append(message)
    return out


def new_call_id() -> str:
    return "call_" + uuid.uuid4().hex[:24]


@dataclass
class Call:
    id: str
    name: str
    arguments: str = ""
    complete: bool = False


@dataclass
class ToolCallReader:
    """Reads a reply as it streams: plain content, or tool calls in the prompt's format.

    `push(text)` returns what became certain: ("content", text) pieces, ("call", Call) when a
    call's name is known, ("arguments", index, text) as its arguments arrive. Text that could
    still turn out to be the start of a call, or the end of one, is held back.
    """

    calls: list[Call] = field(default_factory=list)
    buffer: str = ""
    mode: str = "undecided"  # → "content" or "calls"
    args_start: int = -1  # in `buffer`, while a call's arguments are being read
    sent: int = 0  # how much of the current call's arguments was handed out

    def push(self, text: str) -> list[tuple]:
        if self.mode == "content":
            return [("content", text)] if text else []
        self.buffer += text
        if self.mode == "undecided":
            head = self.buffer.lstrip()
            if head.startswith(OPEN):
                self.mode = "calls"
            elif OPEN.startswith(head):
                return []  # blank, or a prefix of "<tool_call>": wait
            else:
                self.mode = "content"
                text, self.buffer = self.buffer, ""
                return [("content", text)]
        return self._read_calls()

    def _read_calls(self) -> list[tuple]:
        events = []
        while True:
            if self.args_start < 0:
                match = _HEADER.match(self.buffer)
                if match is None:
                    return events
                self.calls.append(Call(new_call_id(), match.group(1)))
                events.append(("call", self.calls[-1]))
                self.args_start, self.sent = match.end(), 0
            call, index = self.calls[-1], len(self.calls) - 1
            try:
                _, end = _DECODER.raw_decode(self.buffer, self.args_start)
            except ValueError:
                end = -1
            if end >= 0 and self.buffer.startswith("}" + CLOSE, end):
                piece = self.buffer[self.args_start + self.sent : end]
                call.arguments += piece
                call.complete = True
                if piece:
                    events.append(("arguments", index, piece))
                self.buffer = self.buffer[end + 1 + len(CLOSE) :]
                self.args_start = -1
                continue
            # Arguments so far, less a tail that may be the closing "}</tool_call>".
            safe = max(len(self.buffer) - len("}" + CLOSE), self.args_start)
            piece = self.buffer[self.args_start + self.sent : safe]
            if piece:
                call.arguments += piece
                self.sent += len(piece)
                events.append(("arguments", index, piece))
            return events

    def finish(self) -> list[tuple]:
        """End of the reply: text that was held back as a possible call start is content."""
        if self.mode == "undecided" and self.buffer.strip():
            self.mode = "content"
            text, self.buffer = self.buffer, ""
            return [("content", text)]
        return []
