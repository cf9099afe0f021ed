"""POST chat/completions."""

from __future__ import annotations

import msgspec
from aiohttp import web

from ...messages import TextPiece
from ..body import decode_body
from ..serving import Serving
from .generation import (
    GenerationRun,
    StreamFormat,
    chat_logprobs,
    check_logit_bias,
    fingerprint,
    max_tokens,
    new_id,
    now,
    sampling_options,
    stop_strings,
    stream,
)
from .prompt import DEFAULT_CHAT_STOP, render_chat
from .state import requested_state
from .structured import structured_output
from .tools import ToolCallReader, with_tools
from .types import (
    AssistantMessage,
    ChatChoice,
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChunkChoice,
    Delta,
    FunctionCall,
    FunctionCallDelta,
    ToolCall,
    ToolCallDelta,
    Usage,
)

DEFAULT_MAX_TOKENS = 256  # Ai00's default; OpenAI's is "whatever fits", which an RNN does not bound


async def chat_completions(request: web.Request, serving: Serving):
    config = serving.config
    req = await decode_body(request, ChatCompletionRequest, config.listen.max_body_bytes)
    messages = [req.messages] if not isinstance(req.messages, list) and req.messages is not None else req.messages
    model = serving.require_model(req.model)
    structure = await structured_output(req, model, chat=True)
    offered = req.tools if structure.tools else None
    rendered = render_chat(with_tools(messages or [], offered), req.names, req.template)
    limit = config.model.max_tokens_limit
    if req.max_completion_tokens is not None:
        budget = max_tokens(req.max_completion_tokens, DEFAULT_MAX_TOKENS, limit, field="max_completion_tokens",
                            minimum=1)
    else:
        budget = max_tokens(req.max_tokens, DEFAULT_MAX_TOKENS, limit, field="max_tokens", minimum=1)
    options = sampling_options(req, logprobs=req.logprobs, top_logprobs=req.top_logprobs)
    # A grammar says where the reply ends; the blank line that ends a chat turn is not needed.
    stop = stop_strings(req, DEFAULT_CHAT_STOP if structure.free_text else ())
    options = msgspec.structs.replace(options, grammar=structure.grammar)
    state = requested_state(req.state, model)
    check_logit_bias(options, model.info.vocab)
    n = req.n or 1

    run = GenerationRun(serving, model, [rendered.prompt], n=n, options=options, max_tokens=budget, stop=stop,
                        model_text=rendered.model_text, state=state)
    ident, created, fp = new_id("chatcmpl"), now(), fingerprint(model)
    with_logprobs = options.wants_logprobs

    if req.stream:
        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        fmt = ChatStream(ident, created, model.name, fp, n, include_usage, model.tokenizer, with_logprobs,
                         structure.tools)
        return await stream(request, run, fmt, include_usage=include_usage,
                            ping_interval=config.listen.ping_interval)

    results = await run.collect()
    choices = []
    for i, r in enumerate(results):
        # Leading whitespace trimmed as Ai00 does: the prompt ends in "Assistant:" and the
        # model answers " Hello"; the space belongs to the template, not the answer.
        message, finish = AssistantMessage(content="".join(r.text).lstrip()), r.finish
        if structure.tools:
            message, finish = _with_calls(message, finish)
        choices.append(ChatChoice(
            index=i, message=message, finish_reason=finish,
            logprobs=chat_logprobs(model.tokenizer, r.tokens, r.logprobs, r.top) if with_logprobs else None,
        ))
    return ChatCompletion(id=ident, created=created, model=model.name, choices=choices, usage=run.usage(),
                          system_fingerprint=fp)


def _with_calls(message: AssistantMessage, finish: str) -> tuple[AssistantMessage, str]:
    """A reply that called tools: `tool_calls`, finish_reason tool_calls. Cut by max_tokens, the
    last call's arguments are as far as they got (finish_reason length), as a stream sent them."""
    reader = ToolCallReader()
    reader.push(message.content)
    calls = reader.calls
    if not calls:
        return message, finish
    tool_calls = [ToolCall(id=c.id, function=FunctionCall(c.name, c.arguments)) for c in calls]
    return AssistantMessage(content=None, tool_calls=tool_calls), ("tool_calls" if finish == "stop" else finish)


class ChatStream(StreamFormat):
    def __init__(self, ident: str, created: int, model: str, fp: str, n: int, include_usage: bool, tokenizer,
                 with_logprobs: bool, tools: bool = False):
        self.ident, self.created, self.model, self.fp, self.n = ident, created, model, fp, n
        # With include_usage every chunk carries "usage": null, the last one the totals (spec);
        # without it the field is left out, since some clients choke on what they did not ask for.
        self.no_usage = None if include_usage else msgspec.UNSET
        self.tokenizer, self.with_logprobs = tokenizer, with_logprobs
        self.started = [False] * n  # has a non-blank piece been sent (leading whitespace is trimmed)
        self.readers = [ToolCallReader() for _ in range(n)] if tools else None

    def _chunk(self, choices: list[ChunkChoice], usage: Usage | None = None) -> ChatCompletionChunk:
        return ChatCompletionChunk(id=self.ident, created=self.created, model=self.model, system_fingerprint=self.fp,
                                   choices=choices, usage=usage if usage is not None else self.no_usage)

    def opening(self):
        # With tools the reply may be calls only: no content until some is known to be text.
        content = msgspec.UNSET if self.readers is not None else ""
        return [self._chunk([ChunkChoice(index=i, delta=Delta(role="assistant", content=content))])
                for i in range(self.n)]

    def _delta(self, index: int, text: str, events=()) -> Delta:
        """Content (leading whitespace trimmed) and tool call pieces, as one delta."""
        calls = []
        for event in events:
            if event[0] == "content":
                text += event[1]
            elif event[0] == "call":
                # Its place among the reply's calls: one push can name several (text a stop
                # string held back), so not "the calls read so far".
                number = next(k for k, c in enumerate(self.readers[index].calls) if c is event[1])
                calls.append(ToolCallDelta(index=number, id=event[1].id, type="function",
                                           function=FunctionCallDelta(name=event[1].name, arguments="")))
            else:
                calls.append(ToolCallDelta(index=event[1], function=FunctionCallDelta(arguments=event[2])))
        if not self.started[index]:
            text = text.lstrip()
            self.started[index] = bool(text)
        return Delta(content=text if text else msgspec.UNSET, tool_calls=calls or msgspec.UNSET)

    def piece(self, index: int, event: TextPiece):
        if self.readers is not None:
            delta = self._delta(index, "", self.readers[index].push(event.text))
        else:
            delta = self._delta(index, event.text)
        logprobs = None
        if self.with_logprobs and event.tokens:
            logprobs = chat_logprobs(self.tokenizer, list(event.tokens), list(event.logprobs),
                                     list(event.top_logprobs))
        if delta.content is msgspec.UNSET and delta.tool_calls is msgspec.UNSET and logprobs is None:
            return None
        return self._chunk([ChunkChoice(index=index, delta=delta, logprobs=logprobs)])

    def finish(self, index: int, reason: str):
        delta = Delta()
        if self.readers is not None:
            reader = self.readers[index]
            delta = self._delta(index, "", reader.finish())
            if reader.calls and reason == "stop":
                reason = "tool_calls"
        return self._chunk([ChunkChoice(index=index, delta=delta, finish_reason=reason)])

    def usage(self, usage: Usage):
        return self._chunk([], usage=usage)
