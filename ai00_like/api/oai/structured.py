"""A request's output constraints (`response_format`, `bnf_schema`, `tools`) → one Lark grammar.

The grammar is compiled (or found in the cache) before anything is sent to the backend, so
a schema, grammar or tool definition that does not compile is a 400 that names it, and the
backend only ever sees grammars that work. Composition, for chat::

    start: answer | " " answer       (response_format json_object / json_schema, bnf_schema; the
                                     chat prompt ends in "Assistant:" and RWKV answers " …")
         | calls                     (tool_choice required)
         | args_f "}</tool_call>" more    (one function forced: named, or required with one tool)
         | calls | answer | " " answer   (tool_choice auto with a response format)
         | calls | FREE_TEXT         (tool_choice auto: any text that is not a call)
    calls: call more
    more:  ("\\n" call)* "\\n\\n"?   (inlined; nothing with parallel_tool_calls false)
    call:  " "?<tool_call>{"name": "f", "arguments": <f's parameters schema>}</tool_call> | …

When one function is forced, the call's fixed opening `<tool_call>{"name": "f",
"arguments": ` is written into the prompt (`Structure.opening`): it is neither generated nor
counted against max_tokens, and only the arguments are constrained, as vLLM does. After a
complete call the model may end the reply (end of text, or the blank line that ends a
turn) or, with parallel calls allowed, write another; it is never made to go on.

A reasoning model's reply first finishes the opening its prompt gave it (reasoning.py): the
rest of its thinking, `>…</think>`, or of a fake think, `>`; the grammar then applies to
what comes after, so the thinking itself is free (as vLLM's reasoning-aware outputs do).

    start: THOUGHT (…)       (THOUGHT? with tool_choice auto and no opening: a model may think unasked)

Completions get the answer alone, with no leading space and no tools.
"""

from __future__ import annotations

import asyncio
import dataclasses
import json
import re
from dataclasses import dataclass

from ...sampler.grammar import Grammar, GrammarError, compile_grammar, json_rule
from ...sampler.kbnf import kbnf_to_lark
from ..errors import bad_request
from .reasoning import NO_THINK, THINK
from .tools import CLOSE, OPEN

TOOL_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
ANY_OBJECT = {"type": "object"}
NO_PARAMETERS = {"type": "object", "properties": {}}
# Free text that is not a tool call (tool_choice auto without a response format).
# Free text: never holds a call, and does not begin with a thought (THOUGHT takes that:
# llguidance's lexer is greedy, and a lexeme that could run on would hide the boundary).
FREE_TEXT = r"/(?s:.+)/ & ~/(?s:.*<tool_call>.*)/ & ~/(?s:\s*<think>.*)/"
# What ends an opened think: the thoughts up to the first "</think>", or a fake think's ">".
THINK_ENDS = {THINK: r"THOUGHT: /(?s:>.*<\/think>\s*)/ & ~/(?s:.*<\/think>.*<\/think>.*)/",
              NO_THINK: r"THOUGHT: />\s*/",
              # no opening: a model that thinks of its own accord may, before its calls
              "": r"THOUGHT: /(?s:\s*<think>.*<\/think>\s*)/ & ~/(?s:.*<\/think>.*<\/think>.*)/"}


@dataclass(frozen=True)
class Structure:
    grammar: Grammar | None = None
    tools: bool = False  # read tool calls out of the reply
    free_text: bool = True  # the reply may be any text (so the default stop strings still apply)
    opening: str = ""  # the reply's forced beginning, written into the prompt after the assistant's name


@dataclass(frozen=True)
class _Part:
    """One piece of the grammar, with the request field to blame when it does not compile."""

    param: str
    lark: str  # rules (the first one named `name`), or a standalone grammar for checking
    name: str


def closed_objects(schema):
    """The schema with `additionalProperties: false` on every object that lists its properties
    and does not say otherwise. JSON Schema allows any extra key by default; a model under a
    grammar that allows them may invent keys forever. OpenAI's structured outputs give objects
    their declared properties only, and so do we."""
    if isinstance(schema, list):
        return [closed_objects(item) for item in schema]
    if not isinstance(schema, dict):
        return schema
    out = {key: (value if key in ("enum", "const", "default", "examples") else closed_objects(value))
           for key, value in schema.items()}
    if isinstance(out.get("properties"), dict) and "additionalProperties" not in out:
        out["additionalProperties"] = False
    return out


def _answer(req) -> _Part | None:
    fmt = req.response_format
    kind = fmt.type if fmt is not None else "text"
    if kind not in ("text", "json_object", "json_schema"):
        raise bad_request(f"response_format.type '{kind}' is not supported; use 'text', 'json_object' or "
                          "'json_schema'", "response_format.type")
    if req.bnf_schema is not None and kind != "text":
        raise bad_request("Give either 'bnf_schema' or a JSON 'response_format', not both", "bnf_schema")
    if kind == "json_object":
        return _Part("response_format", f"answer: {json_rule(ANY_OBJECT, lenient=True)}", "answer")
    if kind == "json_schema":
        spec = fmt.json_schema
        if spec is None or spec.schema is None:
            raise bad_request("response_format json_schema needs 'json_schema.schema'",
                              "response_format.json_schema.schema")
        # strict: unsupported keywords are an error; otherwise they are ignored (OpenAI's
        # non-strict mode does not promise the schema either).
        rule = json_rule(closed_objects(spec.schema), lenient=not spec.strict)
        return _Part("response_format.json_schema.schema", f"answer: {rule}", "answer")
    if req.bnf_schema is not None:
        try:
            rules, start = kbnf_to_lark(req.bnf_schema)
        except GrammarError as e:
            raise bad_request(str(e), "bnf_schema") from None
        return _Part("bnf_schema", f"answer: {start}\n{rules}", "answer")
    return None


def _tool_choice(req) -> tuple[str, str | None]:
    """("none" | "auto" | "required", the forced function's name or None): a named function,
    or `required` when only one function is offered."""
    choice = req.tool_choice
    if choice is None:
        return ("auto" if req.tools else "none"), None
    if isinstance(choice, str):
        if choice != "none" and not req.tools:
            raise bad_request(f"tool_choice '{choice}' needs 'tools'", "tool_choice")
        return choice, (req.tools[0].function.name if choice == "required" and len(req.tools) == 1 else None)
    names = [t.function.name for t in req.tools or ()]
    if choice.function.name not in names:
        raise bad_request(f"tool_choice names function '{choice.function.name}', which is not in 'tools'",
                          "tool_choice.function.name")
    return "required", choice.function.name


def _check_tool(i: int, tool) -> None:
    if tool.type != "function":
        raise bad_request(f"tools[{i}].type '{tool.type}' is not supported; use 'function'", f"tools[{i}].type")
    if not TOOL_NAME.fullmatch(tool.function.name):
        raise bad_request(f"tools[{i}].function.name '{tool.function.name}' must be 1-64 letters, digits, '_' or '-'",
                          f"tools[{i}].function.name")


def offered_tools(req) -> list | None:
    """The tools a chat request's prompt announces (tools.with_tools): its `tools`, unless
    `tool_choice` is "none"; a 400 for a choice or a tool that chat refuses. What a saved
    state reads with its messages, so a chat from it with the same tools renders as one."""
    choice, _ = _tool_choice(req)
    if choice == "none":
        return None
    for i, tool in enumerate(req.tools):
        _check_tool(i, tool)
    return req.tools


def _calls(req) -> list[_Part]:
    """A `call_i` rule per tool, its arguments as `args_i`."""
    parts = []
    for i, tool in enumerate(req.tools):
        fn = tool.function
        _check_tool(i, tool)
        head = json.dumps(call_opening(fn.name)[len(OPEN) + 1:])
        rule = json_rule(closed_objects(fn.parameters or NO_PARAMETERS), lenient=not fn.strict)
        parts.append(_Part(f"tools[{i}].function.parameters",
                           f"call_{i}: CALL_OPEN {head} args_{i} CALL_CLOSE\nargs_{i}: {rule}", f"call_{i}"))
    return parts


def call_opening(name: str) -> str:
    """A call up to its arguments: what the prompt ends with when `name` is forced."""
    return f'{OPEN}{{"name": "{name}", "arguments": '


def _grammar_text(req, *, chat: bool, opening: str = "") -> tuple[str | None, list[_Part], Structure]:
    answer = _answer(req)
    choice, only = _tool_choice(req) if chat else ("none", None)
    parts = [answer] if answer is not None else []
    rules = []
    opening = ""
    if choice == "none":
        if answer is None:
            return None, [], Structure()
        body = "answer"
    else:
        calls = _calls(req)
        parts += calls
        more = ' ("\\n" call)* "\\n\\n"?' if req.parallel_tool_calls is not False else ""
        # The call's first lexeme carries the optional leading space itself: a separate " "
        # lexeme would race free text that begins with a space.
        rules += [f"calls: call{more}", "call: " + " | ".join(c.name for c in calls),
                  f"CALL_OPEN: / ?{re.escape(OPEN)}\\{{/", f"CALL_CLOSE: {json.dumps('}' + CLOSE)}"]
        if only is not None:
            forced = next(i for i, t in enumerate(req.tools) if t.function.name == only)
            body, opening = f"args_{forced} CALL_CLOSE{more}", call_opening(only)
        elif choice == "required":
            body = "calls"
        elif answer is not None:
            body = "calls | answer"
        else:
            body, rules = "calls | FREE_TEXT", rules + [f"FREE_TEXT: {FREE_TEXT}"]
    lead = ' | " " answer' if chat and body.endswith("answer") else ""
    start = f"start: {body}{lead}"
    # A forced call's opening replaces the think's. Unasked thinking only where free text is
    # allowed anyway: a weak model let loose in a thought may never reach a JSON answer.
    if chat and only is None and (opening or body == "calls | FREE_TEXT"):
        optional = "?" if opening == "" else ""
        start, rules = f"start: THOUGHT{optional} ({body}{lead})", rules + [THINK_ENDS[opening]]
    text = "\n".join([start, *rules, *(p.lark for p in parts)])
    free = choice == "auto" and answer is None
    return text, parts, Structure(tools=choice != "none", free_text=free, opening=opening)


def _essence(message: str) -> str:
    """llguidance's message without the listing of our generated grammar around the problem."""
    for line in message.splitlines():
        if "failed to compile JSON schema:" in line:
            return line.split("failed to compile JSON schema:", 1)[1].strip()
    return message


async def structured_output(req, model, *, chat: bool, opening: str = "") -> Structure:
    """The compiled grammar of a request's output, or 400 naming what does not compile.
    `opening`: the think opening the chat prompt ends with, if any."""
    text, parts, structure = _grammar_text(req, chat=chat, opening=opening)
    if text is None:
        return structure
    loop = asyncio.get_running_loop()
    vocab, tokenizer = model.info.vocab, model.tokenizer
    try:
        # Off the event loop: a large schema takes a while the first time (then it is cached).
        grammar = await loop.run_in_executor(None, compile_grammar, text, tokenizer, vocab)
    except GrammarError as whole:
        for part in parts:  # find the request field whose piece does not compile on its own
            alone = f"start: {part.name}\n{part.lark}".replace("CALL_OPEN", json.dumps(OPEN + "{")).replace(
                "CALL_CLOSE", json.dumps("}" + CLOSE))
            try:
                await loop.run_in_executor(None, compile_grammar, alone, tokenizer, vocab)
            except GrammarError as e:
                raise bad_request(f"{part.param}: {_essence(str(e))}", part.param) from None
        raise bad_request(f"the output constraints do not compile: {whole}", parts[0].param if parts else None) \
            from None
    return dataclasses.replace(structure, grammar=grammar)

