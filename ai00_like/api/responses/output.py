"""A reply as the Responses API's output items, and the typed events that stream them.

`OutputBuilder` takes a ReplyReader's events (thinking, content, tool calls) in the order
they come and keeps the items they make: a `reasoning` item, then a `message` with one
`output_text`, or one `function_call` per call. Each step returns the events OpenAI's
stream has for it, numbered by `sequence_number`:

    response.created, response.in_progress
    response.output_item.added → response.content_part.added → response.reasoning_text.delta …
        → response.reasoning_text.done → response.content_part.done → response.output_item.done
    (the same for a message, with response.output_text.delta / .done)
    response.output_item.added → response.function_call_arguments.delta …
        → response.function_call_arguments.done → response.output_item.done
    response.completed, or response.incomplete (or, when the reply failed after the
    stream began, error)

A non-streamed response is built by the same steps with the events dropped, so both give
the same items.
"""

from __future__ import annotations

from .items import new_id
from .types import (
    ArgumentsDelta,
    ArgumentsDone,
    ErrorEvent,
    Event,
    FunctionCallItem,
    ItemEvent,
    OutputMessage,
    OutputText,
    PartEvent,
    ReasoningItem,
    ReasoningText,
    Response,
    ResponseEvent,
    TextDelta,
    TextDone,
)


class OutputBuilder:
    def __init__(self) -> None:
        self.items: list = []
        self.sequence = 0
        self.open: str | None = None  # the kind of the item being written: reasoning, message, call
        self.text = ""  # the open reasoning's or message's text so far

    def _next(self) -> int:
        self.sequence += 1
        return self.sequence - 1

    def _event(self, cls, kind: str, **fields) -> Event:
        return cls(type=f"response.{kind}", sequence_number=self._next(), **fields)

    def response_event(self, kind: str, response: Response) -> Event:
        """response.created / in_progress / completed / incomplete."""
        return self._event(ResponseEvent, kind, response=response)

    def error_event(self, code: str | None, message: str, param: str | None = None) -> Event:
        """error: ends a stream that cannot end with response.completed."""
        return ErrorEvent(type="error", sequence_number=self._next(), code=code, message=message, param=param)

    # ------------------------------------------------------------------ reply events

    def push(self, events: list[tuple]) -> list[Event]:
        out: list[Event] = []
        for event in events:
            kind = event[0]
            if kind in ("reasoning", "content"):
                wanted = "reasoning" if kind == "reasoning" else "message"
                if self.open != wanted:
                    out += self.close()
                    out += self._open_text(wanted)
                self.text += event[1]
                name = "reasoning_text" if wanted == "reasoning" else "output_text"
                logprobs = [] if wanted == "message" else None
                out.append(self._event(TextDelta, f"{name}.delta", item_id=self.items[-1].id,
                                       output_index=len(self.items) - 1, content_index=0, delta=event[1],
                                       **({"logprobs": logprobs} if logprobs is not None else {})))
            elif kind == "call":
                out += self.close()
                call = event[1]
                self.items.append(FunctionCallItem(id=new_id("fc"), call_id=call.id, name=call.name, arguments="",
                                                   status="in_progress"))
                self.open = "call"
                out.append(self._event(ItemEvent, "output_item.added", output_index=len(self.items) - 1,
                                       item=self.items[-1]))
            else:  # ("arguments", index, text): always the open call's
                item = self.items[-1]
                item.arguments += event[2]
                out.append(self._event(ArgumentsDelta, "function_call_arguments.delta", item_id=item.id,
                                       output_index=len(self.items) - 1, delta=event[2]))
        return out

    def _open_text(self, kind: str) -> list[Event]:
        if kind == "reasoning":
            item, part = ReasoningItem(id=new_id("rs"), content=[], status="in_progress"), ReasoningText(text="")
        else:
            item, part = OutputMessage(id=new_id("msg"), content=[], status="in_progress"), OutputText(text="")
        self.items.append(item)
        self.open, self.text = kind, ""
        index = len(self.items) - 1
        return [self._event(ItemEvent, "output_item.added", output_index=index, item=item),
                self._event(PartEvent, "content_part.added", item_id=item.id, output_index=index, content_index=0,
                            part=part)]

    def close(self, status: str = "completed") -> list[Event]:
        """End the open item (its .done events); `status` "incomplete" when the reply was cut."""
        if self.open is None:
            return []
        item, index, out = self.items[-1], len(self.items) - 1, []
        if self.open == "call":
            item.status = status
            out.append(self._event(ArgumentsDone, "function_call_arguments.done", item_id=item.id,
                                   output_index=index, name=item.name, arguments=item.arguments))
        else:
            reasoning = self.open == "reasoning"
            part = ReasoningText(text=self.text) if reasoning else OutputText(text=self.text)
            item.content, item.status = [part], status
            name, extra = ("reasoning_text", {}) if reasoning else ("output_text", {"logprobs": []})
            out += [self._event(TextDone, f"{name}.done", item_id=item.id, output_index=index, content_index=0,
                                text=self.text, **extra),
                    self._event(PartEvent, "content_part.done", item_id=item.id, output_index=index,
                                content_index=0, part=part)]
        out.append(self._event(ItemEvent, "output_item.done", output_index=index, item=item))
        self.open = None
        return out

    def finish(self, cut: bool) -> list[Event]:
        """The reply is over: close what is open; a reply without any item gets an empty message."""
        out = self.close("incomplete" if cut else "completed")
        if not self.items:
            out += self._open_text("message") + self.close("incomplete" if cut else "completed")
        return out
