"""A Responses request's input as the chat messages our prompt renders, and as the stored
input items `GET /responses/{id}/input_items` lists.

Accepted items: messages (a string, or `input_text` / `output_text` parts) of the user,
system, developer and assistant roles; `function_call` (a call the model made earlier) and
`function_call_output` (its result, rendered as an `Observation:` turn); `reasoning` items
sent back by clients are skipped, as earlier thinking never goes back into the prompt.
Anything else (images, files, built-in tools' items) is a 400 that names the item.
"""

from __future__ import annotations

import uuid
from typing import Any

from ..errors import bad_request
from ..oai.types import ChatMessage, FunctionCallIn, ToolCallIn

_TEXT_PARTS = ("input_text", "output_text", "text")


def new_id(prefix: str) -> str:
    return f"{prefix}_{uuid.uuid4().hex}"


def _item_id(item: dict, where: str, prefix: str) -> str:
    """The item's own id, or a new one where it has none; it is echoed back and stored, so
    anything but a non-empty string is refused rather than passed on as given."""
    given = item.get("id")
    if given is None:
        return new_id(prefix)
    if not isinstance(given, str) or not given:
        got = "an empty one" if given == "" else type(given).__name__  # not the value: it may be huge
        raise bad_request(f"'{where}.id' must be a non-empty string, got {got}", f"{where}.id")
    return given


def _text(content: Any, where: str) -> str:
    if isinstance(content, str):
        return content
    if not isinstance(content, list):
        raise bad_request(f"'{where}.content' must be a string or a list of content parts", f"{where}.content")
    texts = []
    for j, part in enumerate(content):
        kind = part.get("type") if isinstance(part, dict) else None
        if kind not in _TEXT_PARTS or not isinstance(part.get("text"), str):
            raise bad_request(f"{where}.content[{j}]: content part type '{kind}' is not supported: this model reads "
                              "text only (input_text)", f"{where}.content[{j}]")
        texts.append(part["text"])
    return "\n".join(texts)


def read_input(value: str | list[dict] | None) -> tuple[list[ChatMessage], list[dict]]:
    """(chat messages, input items as stored) of a request's `input`."""
    if value is None:
        raise bad_request("'input' is required", "input")
    if isinstance(value, str):
        value = [{"type": "message", "role": "user", "content": value}]
    messages: list[ChatMessage] = []
    items: list[dict] = []
    for i, item in enumerate(value):
        where = f"input[{i}]"
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            if role not in ("user", "system", "developer", "assistant"):
                raise bad_request(f"{where}.role: '{role}' is not one of user, system, developer, assistant",
                                  f"{where}.role")
            text = _text(item.get("content"), where)
            messages.append(ChatMessage(role=role, content=text))
            part = "output_text" if role == "assistant" else "input_text"
            items.append({"id": _item_id(item, where, "msg"), "type": "message", "role": role,
                          "status": "completed", "content": [{"type": part, "text": text}]})
        elif kind == "function_call":
            name, arguments, call_id = item.get("name"), item.get("arguments", ""), item.get("call_id")
            if not isinstance(name, str) or not isinstance(arguments, str) or not isinstance(call_id, str):
                raise bad_request(f"{where}: a function_call needs 'call_id', 'name' and 'arguments' as strings", where)
            call = ToolCallIn(function=FunctionCallIn(name=name, arguments=arguments), id=call_id)
            if messages and messages[-1].role == "assistant" and messages[-1].tool_calls:
                messages[-1].tool_calls.append(call)  # parallel calls of one turn
            else:
                messages.append(ChatMessage(role="assistant", content=None, tool_calls=[call]))
            items.append({"id": _item_id(item, where, "fc"), "type": "function_call", "call_id": call_id,
                          "name": name, "arguments": arguments, "status": "completed"})
        elif kind == "function_call_output":
            output, call_id = item.get("output"), item.get("call_id")
            if not isinstance(call_id, str):
                raise bad_request(f"{where}: a function_call_output needs 'call_id'", f"{where}.call_id")
            text = output if isinstance(output, str) else _text(output, where)
            messages.append(ChatMessage(role="tool", content=text, tool_call_id=call_id))
            items.append({"id": _item_id(item, where, "fco"), "type": "function_call_output", "call_id": call_id,
                          "output": text, "status": "completed"})
        elif kind == "reasoning":
            continue
        else:
            raise bad_request(f"{where}: input item type '{kind}' is not supported; use message, function_call or "
                              "function_call_output", f"{where}.type")
    if not messages:
        raise bad_request("'input' holds no message", "input")
    return messages, items
