"""The chat template: OpenAI messages → one RWKV prompt, as Ai00 renders it (ai00-reference §4).

Default rendering::

    System: You are helpful.

    User: Hi!

    Assistant:

Each message is `template.record` with `{role}` and `{content}` filled in; messages are
joined with `template.sep` and followed by `sep` + `template.prefix`, whose `{assistant}`
and `{user}` are the display names. Blank lines inside a message are collapsed to single
newlines (Ai00 does this so that a "\\n\\n" in user text cannot look like the end of a
turn, which is also the default stop string).

Where Ai00 refuses what OpenAI clients send, we accept it: content as a list of text
parts, the `developer` role (same as system), `function` (same as tool), role names in any
case, null content on assistant messages that only carried tool calls.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..errors import bad_request
from .types import ChatMessage, ChatTemplate

DEFAULT_TEMPLATE = ChatTemplate(record="{role}: {content}", prefix="{assistant}:", sep="\n\n")
DEFAULT_CHAT_STOP = ("\n\n",)

# Request roles → the speaker they render as. Ai00 renders tool output as "Observation".
_SPEAKER = {
    "system": "system",
    "developer": "system",
    "user": "user",
    "assistant": "assistant",
    "tool": "observation",
    "function": "observation",
    "observation": "observation",
}
_DEFAULT_NAMES = {"system": "System", "user": "User", "assistant": "Assistant", "observation": "Observation"}

_BLANK_LINES = re.compile(r"\n(\s*\n)+")
_THOUGHTS = re.compile(r"\s*<think>.*?</think>\s*", re.S)  # a reasoning model's earlier thinking
_RECORD_FIELD = re.compile(r"\{(role|content)\}")
_PREFIX_FIELD = re.compile(r"\{(assistant|user)\}")


@dataclass(frozen=True)
class ChatPrompt:
    prompt: str
    model_text: str  # earlier assistant turns, raw: they seed the repetition penalties


def message_text(message: ChatMessage, where: str) -> str:
    content = message.content
    if content is None:
        if message.role.lower() == "assistant":
            return ""  # an assistant turn that only called tools
        raise bad_request(f"'{where}.content' is required for role '{message.role}'", f"{where}.content")
    if isinstance(content, str):
        return content
    texts = []
    for j, part in enumerate(content):
        if part.type != "text" or part.text is None:
            raise bad_request(
                f"{where}.content[{j}]: content part type '{part.type}' is not supported: this model reads text only",
                f"{where}.content[{j}]",
            )
        texts.append(part.text)
    return "\n".join(texts)


def speaker_names(names: dict[str, str] | None) -> dict[str, str]:
    """Display names per speaker; `names` keys may be any request role (Ai00's `names`)."""
    result = dict(_DEFAULT_NAMES)
    for role, display in (names or {}).items():
        speaker = _SPEAKER.get(role.lower())
        if speaker is None:
            raise bad_request(f"Unknown role '{role}' in names", f"names.{role}")
        result[speaker] = display
    return result


def assistant_turns(messages: list[ChatMessage]) -> list[str]:
    """The raw text of each assistant turn, without its thinking: what seeds the penalties."""
    return [_THOUGHTS.sub("\n", message_text(m, f"messages[{i}]")) for i, m in enumerate(messages)
            if _SPEAKER.get(m.role.lower()) == "assistant"]


def render_chat(messages: list[ChatMessage], names: dict[str, str] | None = None,
                template: ChatTemplate | None = None, *, opening: str = "", user_suffix: str = "",
                assistant_prompt: bool = True) -> ChatPrompt:
    """The prompt, ending with the assistant's name and then `opening` (the start of the reply
    written for it: a think tag, a forced call); `user_suffix` ends the last user turn (a
    G1 effort). Earlier assistant turns go back without their thinking. Without
    `assistant_prompt` it ends after the last turn's separator: what a saved state reads, so
    that a chat continuing from it renders the rest exactly as one chat of all would."""
    if not messages:
        raise bad_request("'messages' must contain at least one message", "messages", code="invalid_value")
    template = template or DEFAULT_TEMPLATE
    display = speaker_names(names)
    records = []
    last_user = max((i for i, m in enumerate(messages) if _SPEAKER.get(m.role.lower()) == "user"), default=-1)
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        speaker = _SPEAKER.get(message.role.lower())
        if speaker is None:
            raise bad_request(
                f"Invalid role '{message.role}' in {where}; expected one of system, developer, user, "
                "assistant, tool",
                f"{where}.role",
            )
        raw = message_text(message, where)
        if speaker == "assistant":
            raw = _THOUGHTS.sub("\n", raw)
        content = _BLANK_LINES.sub("\n", raw).strip() + (user_suffix if i == last_user else "")
        fields = {"role": display[speaker], "content": content}
        records.append(_RECORD_FIELD.sub(lambda m: fields[m.group(1)], template.record))
    if not assistant_prompt:
        return ChatPrompt(template.sep.join(records) + template.sep, template.sep.join(assistant_turns(messages)))
    prefix = _PREFIX_FIELD.sub(lambda m: display[m.group(1)], template.prefix)
    prompt = template.sep.join(records) + template.sep + prefix + (" " + opening if opening else "")
    return ChatPrompt(prompt, template.sep.join(assistant_turns(messages)))
