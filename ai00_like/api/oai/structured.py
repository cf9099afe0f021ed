"""A request's output constraints (`response_format`, `bnf_schema`, `tools`) → one Lark grammar.

The grammar is compiled (or found in the cache) before anything is sent to the backend, so
a schema, grammar or tool definition that does not compile is a 400 that names it, and the
backend only ever sees grammars that work. Composition, for chat::

    start: answer | " " answer       (response_format json_object / json_schema, bnf_schema; the
                                     chat prompt ends in "Assistant:" and RWKV answers " …")
         | calls                     (tool_choice required, or a named function)
         | calls | answer | " " answer   (tool_choice auto with a response format)
         | calls | FREE_TEXT         (tool_choice auto: any text that is not a call)
    calls: call ("\\n" call)*         (one call only with parallel_tool_calls false)
    call:  " "?<tool_call>{"name": "f", "arguments": <f's parameters schema>}</tool_call> | …

Completions get the answer alone, with no leading space and no tools.
"""

from __future__ import annotations

import asyncio
import json
import re
from dataclasses import dataclass

from ...sampler.grammar import Grammar, GrammarError, compile_grammar, json_rule
from ...sampler.kbnf import kbnf_to_lark
from ..errors import bad_request
from .tools import CLOSE, OPEN

TOOL_NAME = re.compile(r"[A-Za-z0-9_-]{1,64}")
ANY_OBJECT = {"type": "object"}
NO_PARAMETERS = {"type": "object", "properties": {}}
# Free text that is not a tool call (tool_choice auto without a response format).
FREE_TEXT = r"/(?s:.+)/ & ~/\s*<tool_call>(?s:.*)/"


@dataclass(frozen=True)
class Structure:
    grammar: Grammar | None = None
    tools: bool = False  # read tool calls out of the reply
    free_text: bool = True  # the reply may be any text (so the default stop strings still apply)


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
    """("none" | "auto" | "required", the forced function's name or None)."""
    choice = req.tool_choice
    if choice is None:
        return ("auto" if req.tools else "none"), None
    if isinstance(choice, str):
        if choice != "none" and not req.tools:
            raise bad_request(f"tool_choice '{choice}' needs 'tools'", "tool_choice")
        return choice, None
    names = [t.function.name for t in req.tools or ()]
    if choice.function.name not in names:
        raise bad_request(f"tool_choice names function '{choice.function.name}', which is not in 'tools'",
                          "tool_choice.function.name")
    return "required", choice.function.name


def _calls(req, only: str | None) -> list[_Part]:
    parts = []
    for i, tool in enumerate(req.tools):
        fn = tool.function
        if tool.type != "function":
            raise bad_request(f"tools[{i}].type '{tool.type}' is not supported; use 'function'", f"tools[{i}].type")
        if not TOOL_NAME.fullmatch(fn.name):
            raise bad_request(f"tools[{i}].function.name '{fn.name}' must be 1-64 letters, digits, '_' or '-'",
                              f"tools[{i}].function.name")
        if only is not None and fn.name != only:
            continue
        head = json.dumps(f'"name": "{fn.name}", "arguments": ')
        rule = json_rule(closed_objects(fn.parameters or NO_PARAMETERS), lenient=not fn.strict)
        parts.append(_Part(f"tools[{i}].function.parameters",
                           f"call_{i}: CALL_OPEN {head} args_{i} {json.dumps('}' + CLOSE)}\nargs_{i}: {rule}",
                           f"call_{i}"))
    return parts


def _grammar_text(req, *, chat: bool) -> tuple[str | None, list[_Part], Structure]:
    answer = _answer(req)
    choice, only = _tool_choice(req) if chat else ("none", None)
    parts = [answer] if answer is not None else []
    rules = []
    if choice == "none":
        if answer is None:
            return None, [], Structure()
        body = "answer"
    else:
        calls = _calls(req, only)
        parts += calls
        repeat = ' ("\\n" call)*' if req.parallel_tool_calls is not False else ""
        # The call's first lexeme carries the optional leading space itself: a separate " "
        # lexeme would race free text that begins with a space.
        rules += [f"calls: call{repeat}", "call: " + " | ".join(c.name for c in calls),
                  f"CALL_OPEN: / ?{re.escape(OPEN)}\\{{/"]
        if choice == "required":
            body = "calls"
        elif answer is not None:
            body = "calls | answer"
        else:
            body, rules = "calls | FREE_TEXT", rules + [f"FREE_TEXT: {FREE_TEXT}"]
    lead = ' | " " answer' if chat and body.endswith("answer") else ""
    start = f"start: {body}{lead}"
    text = "\n".join([start, *rules, *(p.lark for p in parts)])
    free = choice == "auto" and answer is None
    return text, parts, Structure(tools=choice != "none", free_text=free)


def _essence(message: str) -> str:
    """llguidance's message without the listing of our generated grammar around the problem."""
    for line in message.splitlines():
        if "failed to compile JSON schema:" in line:
            return line.split("failed to compile JSON schema:", 1)[1].strip()
    return message


async def structured_output(req, model, *, chat: bool) -> Structure:
    """The compiled grammar of a request's output, or 400 naming what does not compile."""
    text, parts, structure = _grammar_text(req, chat=chat)
    if text is None:
        return structure
    loop = asyncio.get_running_loop()
    vocab, tokenizer = model.info.vocab, model.tokenizer
    try:
        # Off the event loop: a large schema takes a while the first time (then it is cached).
        grammar = await loop.run_in_executor(None, compile_grammar, text, tokenizer, vocab)
    except GrammarError as whole:
        for part in parts:  # find the request field whose piece does not compile on its own
            alone = f"start: {part.name}\n{part.lark}".replace("CALL_OPEN", json.dumps(OPEN + "{"))
            try:
                await loop.run_in_executor(None, compile_grammar, alone, tokenizer, vocab)
            except GrammarError as e:
                raise bad_request(f"{part.param}: {_essence(str(e))}", part.param) from None
        raise bad_request(f"the output constraints do not compile: {whole}", parts[0].param if parts else None) \
            from None
    return Structure(grammar=grammar, tools=structure.tools, free_text=structure.free_text)

