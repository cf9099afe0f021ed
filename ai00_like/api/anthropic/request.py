"""A Messages request's fields → chat's (`ChatCompletionRequest`), so that chat.plan_chat
makes its prompt, think plan, tool grammar, sampling and limits as for any chat request.

What maps onto what:

* `thinking`: "enabled" turns thinking on (its `budget_tokens` picks an effort when
  `output_config.effort` does not), "disabled" off, "adaptive" (and no `thinking` at all)
  leaves it to the model's configured default; `output_config.effort` is the effort.
* `tool_choice`: auto → auto, any → required, tool → that function, none → none;
  `disable_parallel_tool_use` → `parallel_tool_calls: false`.
* `max_tokens` is a ceiling, as Anthropic's: one above the model's `max_tokens_limit` is
  lowered to it rather than refused (Claude Code asks for 32000 whatever the model).
"""

from __future__ import annotations

from ..errors import bad_request
from ..oai.types import ChatCompletionRequest, FunctionDef, NamedFunction, NamedToolChoice, ToolDef
from .types import MessagesInput, MessagesRequest, ToolParam

# Anthropic's efforts onto ours ("max" is their top one).
EFFORTS = {"low": "low", "medium": "medium", "high": "high", "max": "xhigh", "xhigh": "xhigh",
           "minimal": "minimal"}
# An extended-thinking budget onto the G1 effort suffix that thinks about that long.
BUDGET_EFFORTS = ((2048, "low"), (8192, "medium"))
CUSTOM_TOOL = (None, "custom")


def _effort(req: MessagesInput) -> tuple[str | None, bool | None]:
    """(reasoning_effort, enable_thinking) of the request; None: the model's default."""
    effort = req.output_config.effort if req.output_config else None
    if effort is not None:
        if effort not in EFFORTS:
            raise bad_request(f"output_config.effort '{effort}' is not one of low, medium, high, max",
                              "output_config.effort")
        effort = EFFORTS[effort]
    thinking = req.thinking
    if thinking is None or thinking.type == "adaptive":
        return effort, None
    if thinking.type == "disabled":
        return None, False
    if thinking.type != "enabled":
        raise bad_request(f"thinking.type '{thinking.type}' is not one of enabled, disabled, adaptive",
                          "thinking.type")
    if effort is None and thinking.budget_tokens is not None:
        effort = next((e for limit, e in BUDGET_EFFORTS if thinking.budget_tokens <= limit), "high")
    return effort, True


def _tool(tool: ToolParam, i: int) -> ToolDef:
    if tool.type not in CUSTOM_TOOL:
        raise bad_request(f"tools[{i}].type '{tool.type}' is not supported: this server runs custom tools only, "
                          "not Anthropic's server tools", f"tools[{i}].type")
    if not tool.name:
        raise bad_request(f"tools[{i}].name is required", f"tools[{i}].name")
    return ToolDef(function=FunctionDef(name=tool.name, description=tool.description, parameters=tool.input_schema))


def _tool_fields(req: MessagesInput) -> dict:
    tools = [_tool(t, i) for i, t in enumerate(req.tools or ())]
    fields: dict = {"tools": tools or None}
    choice = req.tool_choice
    if choice is None:
        return fields
    if choice.disable_parallel_tool_use:
        fields["parallel_tool_calls"] = False
    if choice.type == "tool":
        if not choice.name:
            raise bad_request("tool_choice of type 'tool' needs 'name'", "tool_choice.name")
        fields["tool_choice"] = NamedToolChoice(function=NamedFunction(name=choice.name))
    elif choice.type == "any":
        fields["tool_choice"] = "required"
    elif choice.type in ("auto", "none"):
        fields["tool_choice"] = choice.type if tools else None  # nothing to choose from: nothing to say
    else:
        raise bad_request(f"tool_choice.type '{choice.type}' is not one of auto, any, tool, none", "tool_choice.type")
    return fields


def as_chat(req: MessagesInput, *, model: str, max_tokens: int | None = None) -> ChatCompletionRequest:
    """The request as chat's, for `model` (the served name it was resolved to), with the
    reply's `max_tokens` already within the model's limit."""
    effort, enable = _effort(req)
    fields = {"model": model, "max_tokens": max_tokens, "reasoning_effort": effort,
              "chat_template_kwargs": {"enable_thinking": enable} if enable is not None else None,
              **_tool_fields(req)}
    if isinstance(req, MessagesRequest):
        fields |= {"stream": req.stream, "temperature": req.temperature, "top_p": req.top_p, "top_k": req.top_k,
                   "keep_alive": req.keep_alive}
    return ChatCompletionRequest(**fields)  # every field already of chat's types
