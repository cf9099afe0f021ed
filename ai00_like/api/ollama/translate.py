"""Ollama's chat and generate requests read as OpenAI chat requests, so that they are
planned by chat.plan_chat (prompt, thinking, tools, structured output, sampling, limits)
like every other generation of this server."""

from __future__ import annotations

import msgspec

from ...messages import ModelInfoEvent
from ..errors import bad_request
from ..oai.types import ChatCompletionRequest, ChatMessage, FunctionCallIn, ToolCallIn
from .options import chat_fields, read_options
from .types import ChatRequest, GenerationFields, GenerateRequest, Message

THINK_LEVELS = {"low": "low", "medium": "medium", "high": "high", "max": "xhigh"}


def _think(req: GenerationFields, model: ModelInfoEvent) -> dict:
    """`think` → chat's reasoning fields. Like Ollama, asking a model that does not think to
    think is a 400; `think: false` is always fine."""
    think = req.think
    if think is None or think is False:
        return {"chat_template_kwargs": {"enable_thinking": False}} if think is False else {}
    if model.spec.thinking == "none":
        raise bad_request(f"\"{model.name}\" does not support thinking", "think")
    if think is True:
        return {"chat_template_kwargs": {"enable_thinking": True}}
    if think not in THINK_LEVELS:
        raise bad_request(f"'think' must be true, false or one of {', '.join(THINK_LEVELS)}, got {think!r}", "think")
    return {"reasoning_effort": THINK_LEVELS[think]}


def _format(value) -> dict:
    """`format`: "json" (any JSON object) or a JSON schema → chat's response_format."""
    if value is None or value == "":
        return {}
    if value == "json":
        return {"response_format": {"type": "json_object"}}
    if isinstance(value, dict):
        return {"response_format": {"type": "json_schema", "json_schema": {"name": "format", "schema": value}}}
    raise bad_request(f"'format' must be \"json\" or a JSON schema object, got {value!r}", "format")


def as_chat(req: GenerationFields, model: ModelInfoEvent, **extra) -> ChatCompletionRequest:
    """The request's generation fields as chat's (the model already found: `model`)."""
    fields = {"model": model.name, **chat_fields(read_options(req.options), model.spec.max_tokens_limit),
              **_think(req, model), **_format(req.format), **extra}
    return msgspec.convert(fields, ChatCompletionRequest)


def chat_request(req: ChatRequest, model: ModelInfoEvent) -> tuple[ChatCompletionRequest, list[ChatMessage]]:
    tools = [msgspec.to_builtins(t) for t in req.tools] if req.tools else None
    chat = as_chat(req, model, **({"tools": tools} if tools else {}))
    return chat, [_message(m, f"messages[{i}]") for i, m in enumerate(req.messages or [])]


def _message(message: Message, where: str) -> ChatMessage:
    if message.images:
        raise bad_request(f"'{where}.images': images are not supported: this model reads text only",
                          f"{where}.images")
    calls = [ToolCallIn(function=FunctionCallIn(c.function.name, c.function.arguments))
             for c in message.tool_calls] if message.tool_calls else None
    return ChatMessage(role=message.role, content=message.content if message.content is not None else "",
                       name=message.tool_name, tool_calls=calls)


def generate_request(req: GenerateRequest, model: ModelInfoEvent) -> tuple[ChatCompletionRequest, list[ChatMessage]]:
    """A generate request (not raw) as a one-turn chat: its system, then its prompt."""
    messages = [ChatMessage(role="system", content=req.system)] if req.system else []
    messages.append(ChatMessage(role="user", content=req.prompt or ""))
    return as_chat(req, model), messages


def refuse_unsupported(req: GenerateRequest) -> None:
    for name, why in (("suffix", "fill in the middle is not supported"),
                      ("images", "images are not supported: this model reads text only"),
                      ("template", "Go templates are not supported; send a `raw` prompt instead"),
                      ("context", "the deprecated `context` is not supported; use /api/chat with the history")):
        if getattr(req, name):
            raise bad_request(f"'{name}': {why}", name)
