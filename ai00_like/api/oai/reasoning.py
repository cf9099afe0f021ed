"""Reasoning models (RWKV7-G0/G1): whether a reply thinks, how its prompt opens, and its
thinking told apart from its answer.

A G-series model thinks in `<think>…</think>` before it answers. The prompt decides:

    User: …\\n\\nAssistant: <think                  think (the model writes ">", its thoughts, "</think>")
    User: … think a bit\\n\\nAssistant: <think      think, with an effort (models from 20250922)
    User: …\\n\\nAssistant: <think>\\n</think         fake think: thinking switched off
    User: …\\n\\nAssistant:                         a model that does not think

`[model] thinking` says which kind of model is loaded ("none", "think", or "effort" for one
that takes the effort suffix) and `[model] reasoning_effort` its default. A request asks
through OpenAI's `reasoning_effort` (chat), `reasoning.effort` (Responses) or vLLM's
`chat_template_kwargs.enable_thinking`; a model that does not think ignores them.
"""

from __future__ import annotations

from dataclasses import dataclass

# OpenAI's efforts onto the G1 suffixes of the user turn.
EFFORT_SUFFIX = {"minimal": " think a bit", "low": " think a bit", "medium": " think", "high": " think a lot",
                 "xhigh": " think a lot"}
THINK, NO_THINK = "<think", "<think>\n</think"
OPEN, CLOSE = "<think>", "</think>"


@dataclass(frozen=True)
class ThinkPlan:
    """How a chat prompt is finished for thinking: the reply's opening (written after the
    assistant's name, read as the start of the reply) and the suffix of the last user turn."""

    opening: str = ""
    suffix: str = ""

    @property
    def thinks(self) -> bool:
        return self.opening == THINK


def think_plan(thinking: str, default_effort: str, effort: str | None, enable: bool | None) -> ThinkPlan:
    """The plan for a request's `effort` and `enable` (None: not given) on a model of kind `thinking`."""
    if thinking == "none":
        return ThinkPlan()
    effort = effort or default_effort
    if enable is True and effort == "none":
        effort = default_effort if default_effort != "none" else "medium"
    if enable is False or effort == "none":
        return ThinkPlan(NO_THINK)
    return ThinkPlan(THINK, EFFORT_SUFFIX[effort] if thinking == "effort" else "")


def _held(text: str, marker: str) -> int:
    """How many characters at the end of `text` could be the start of `marker`."""
    for n in range(min(len(marker) - 1, len(text)), 0, -1):
        if marker.startswith(text[-n:]):
            return n
    return 0


class ThinkReader:
    """Reads a reply as it streams: ("reasoning", text) while it thinks, ("answer", text) after.

    A reply that opens with `<think>` thinks until `</think>`; the newlines just inside the
    tags and the whitespace before the answer are dropped. One that does not is all answer.
    Text that may still be a tag is held back until it is known. `opened`: the think opening
    the prompt ended with (THINK or NO_THINK), whose ">" the reply goes on with.
    """

    def __init__(self, opened: str = "") -> None:
        # "start" → "reasoning" → "answer"; after an opening, "opened" (a think) or "closing" (a fake one)
        self.mode = {THINK: "opened", NO_THINK: "closing"}.get(opened, "start")
        self.buffer = ""
        self.reasoning_started = self.answer_started = False

    @property
    def thinking(self) -> bool:
        """Whether the text pushed next still belongs to the thinking (or may)."""
        return self.mode in ("start", "opened", "reasoning")

    def push(self, text: str) -> list[tuple[str, str]]:
        self.buffer += text
        events: list[tuple[str, str]] = []
        if self.mode in ("opened", "closing"):
            if not self.buffer:
                return events
            # The tag's ">" if the model wrote it; what else it writes is inside the tag's turn.
            self.buffer = self.buffer.removeprefix(">")
            self.mode = "reasoning" if self.mode == "opened" else "answer"
        if self.mode == "start":
            head = self.buffer.lstrip()
            if head.startswith(OPEN):
                self.mode, self.buffer = "reasoning", head[len(OPEN):]
            elif OPEN.startswith(head):
                return events  # blank, or a prefix of "<think>": wait
            else:
                self.mode = "answer"
        if self.mode == "reasoning":
            if not self.reasoning_started:
                if self.buffer in ("", "\n"):
                    return events  # the newline after "<think>" may come next
                self.buffer, self.reasoning_started = self.buffer.removeprefix("\n"), True
            end = self.buffer.find(CLOSE)
            if end < 0:
                keep = max(_held(self.buffer, "\n" + CLOSE), _held(self.buffer, CLOSE))
                piece, self.buffer = self.buffer[: len(self.buffer) - keep], self.buffer[len(self.buffer) - keep:]
                return events + ([("reasoning", piece)] if piece else [])
            piece = self.buffer[:end].removesuffix("\n")
            if piece:
                events.append(("reasoning", piece))
            self.mode, self.buffer = "answer", self.buffer[end + len(CLOSE):]
        return events + self._answer()

    def _answer(self) -> list[tuple[str, str]]:
        text, self.buffer = self.buffer, ""
        if not self.answer_started:
            text = text.lstrip()
            self.answer_started = bool(text)
        return [("answer", text)] if text else []

    def finish(self) -> list[tuple[str, str]]:
        """End of the reply: what was held back (a cut-off thought stays reasoning)."""
        if self.mode in ("opened", "reasoning"):
            text, self.buffer = self.buffer, ""
            return [("reasoning", text)] if text else []
        self.mode = "answer"
        return self._answer()
