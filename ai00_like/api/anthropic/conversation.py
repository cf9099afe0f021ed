"""Anthropic's `system` and `messages` → the chat messages the RWKV prompt is rendered from.

A user turn's `tool_result` blocks become `tool` messages (rendered as Observation turns,
as OpenAI's are), each answering a `tool_use` of the assistant turn just before it; an
assistant turn's `tool_use` blocks become its tool calls. Thinking sent back is dropped,
as chat drops earlier thinking from the prompt. A role `system` inside `messages` (Claude
Code sends one) is a system message. Blocks that are not text (images, documents, search
results, server tools' blocks) are refused by their place: this model reads text only.
"""

from __future__ import annotations

from ..errors import bad_request
from ..oai.types import ChatMessage, FunctionCallIn, ToolCallIn
from .types import InputBlock, InputMessage, SystemBlock

ROLES = ("user", "assistant", "system")
DROPPED = ("thinking", "redacted_thinking")
ERROR_PREFIX = "Error: "  # a tool_result with is_error, as the model reads it


def system_message(system: str | list[SystemBlock] | None) -> list[ChatMessage]:
    if system is None:
        return []
    if isinstance(system, str):
        return [ChatMessage(role="system", content=system)] if system else []
    for i, block in enumerate(system):
        if block.type != "text":
            raise bad_request(f"system[{i}].type '{block.type}' is not supported: the system prompt is text blocks",
                              f"system[{i}].type")
    text = "\n".join(b.text for b in system if b.text)
    return [ChatMessage(role="system", content=text)] if text else []


def _unsupported(block: InputBlock, where: str) -> Exception:
    return bad_request(f"{where}.type '{block.type}' is not supported: this server reads text, tool_use, "
                       "tool_result and thinking blocks only", f"{where}.type")


def _result_text(block: InputBlock, where: str) -> str:
    content = block.content
    if content is None:
        text = ""
    elif isinstance(content, str):
        text = content
    else:
        for k, part in enumerate(content):
            if part.type != "text":
                raise _unsupported(part, f"{where}.content[{k}]")
        text = "\n".join(part.text or "" for part in content)
    return ERROR_PREFIX + text if block.is_error else text


def _user_turn(blocks: list[InputBlock], where: str, called: set[str]) -> list[ChatMessage]:
    results, texts = [], []
    for j, block in enumerate(blocks):
        at = f"{where}.content[{j}]"
        if block.type == "text":
            texts.append(block.text or "")
        elif block.type == "tool_result":
            if block.tool_use_id not in called:
                raise bad_request(f"{at}.tool_use_id '{block.tool_use_id}' answers no tool_use of the assistant "
                                  "turn before it", f"{at}.tool_use_id")
            results.append(ChatMessage(role="tool", content=_result_text(block, at), tool_call_id=block.tool_use_id))
        elif block.type not in DROPPED:
            raise _unsupported(block, at)
    return results + ([ChatMessage(role="user", content="\n".join(texts))] if texts else [])


def _assistant_turn(blocks: list[InputBlock], where: str) -> ChatMessage:
    texts, calls = [], []
    for j, block in enumerate(blocks):
        at = f"{where}.content[{j}]"
        if block.type == "text":
            texts.append(block.text or "")
        elif block.type == "tool_use":
            if not block.name or not block.id:
                raise bad_request(f"{at}: a tool_use block needs 'id' and 'name'", f"{at}.name")
            arguments = block.input if isinstance(block.input, dict) else {}
            calls.append(ToolCallIn(id=block.id, function=FunctionCallIn(name=block.name, arguments=arguments)))
        elif block.type not in DROPPED:
            raise _unsupported(block, at)
    return ChatMessage(role="assistant", content="\n".join(texts), tool_calls=calls or None)


def _system_turn(blocks: list[InputBlock], where: str) -> list[ChatMessage]:
    for j, block in enumerate(blocks):
        if block.type != "text":
            raise _unsupported(block, f"{where}.content[{j}]")
    return system_message([SystemBlock(text=b.text or "") for b in blocks])


def chat_messages(messages: list[InputMessage]) -> list[ChatMessage]:
    """The conversation as chat messages, in order."""
    out: list[ChatMessage] = []
    called: set[str] = set()  # the tool_use ids of the latest assistant turn
    for i, message in enumerate(messages):
        where, role = f"messages[{i}]", message.role
        if role not in ROLES:
            raise bad_request(f"{where}.role '{role}' is not supported; expected user or assistant", f"{where}.role")
        content = message.content
        if isinstance(content, str):
            out.append(ChatMessage(role=role, content=content))
        elif role == "assistant":
            out.append(_assistant_turn(content, where))
        elif role == "user":
            out += _user_turn(content, where, called)
        else:
            out += _system_turn(content, where)
        if role != "system":
            called = {c.id for c in out[-1].tool_calls or ()} if role == "assistant" else set()
    return out
