"""POST chat/completions."""

from __future__ import annotations

import msgspec
from aiohttp import web

from ...messages import TextPiece
from ..body import decode_body
from ..errors import bad_request
from ..prompt import DEFAULT_CHAT_STOP, render_chat
from ..serving import Serving
from .generation import (
    GenerationRun, StreamFormat, chat_logprobs, check_logit_bias, fingerprint, max_tokens, new_id, now,
    sampling_options, stop_strings, stream,
)
from .state import requested_state
from .types import (
    AssistantMessage, ChatChoice, ChatCompletion, ChatCompletionChunk, ChatCompletionRequest, ChunkChoice, Delta,
    Usage,
)

DEFAULT_MAX_TOKENS = 256  # Ai00's default; OpenAI's is "whatever fits", which an RNN does not bound


def _refuse_unsupported(req: ChatCompletionRequest) -> None:
    """Fields we cannot honour get a clear 400 instead of a reply that silently ignores them."""
    if req.response_format is not None and req.response_format.type != "text":
        raise bad_request(f"response_format '{req.response_format.type}' is not supported yet (no constrained "
                          "decoding); use 'text'", "response_format.type")
    choice = req.tool_choice
    if req.tools and (choice == "required" or isinstance(choice, dict)):
        raise bad_request("Tool calling is not supported yet; tool_choice cannot force a call", "tool_choice")


async def chat_completions(request: web.Request, serving: Serving):
    config = serving.config
    req = await decode_body(request, ChatCompletionRequest, config.listen.max_body_bytes)
    _refuse_unsupported(req)
    messages = [req.messages] if not isinstance(req.messages, list) and req.messages is not None else req.messages
    rendered = render_chat(messages or [], req.names, req.template)
    limit = config.model.max_tokens_limit
    if req.max_completion_tokens is not None:
        budget = max_tokens(req.max_completion_tokens, DEFAULT_MAX_TOKENS, limit, field="max_completion_tokens",
                            minimum=1)
    else:
        budget = max_tokens(req.max_tokens, DEFAULT_MAX_TOKENS, limit, field="max_tokens", minimum=1)
    options = sampling_options(req, logprobs=req.logprobs, top_logprobs=req.top_logprobs)
    stop = stop_strings(req, DEFAULT_CHAT_STOP)
    model = serving.require_model(req.model)
    state = requested_state(req.state, model)
    check_logit_bias(options, model.info.vocab)
    n = req.n or 1

    run = GenerationRun(serving, model, [rendered.prompt], n=n, options=options, max_tokens=budget, stop=stop,
                        model_text=rendered.model_text, state=state)
    ident, created, fp = new_id("chatcmpl"), now(), fingerprint(model)
    with_logprobs = options.wants_logprobs

    if req.stream:
        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        fmt = ChatStream(ident, created, model.name, fp, n, include_usage, model.tokenizer, with_logprobs)
        return await stream(request, run, fmt, include_usage=include_usage,
                            ping_interval=config.listen.ping_interval)

    results = await run.collect()
    choices = [
        ChatChoice(
            index=i,
            # Leading whitespace trimmed as Ai00 does: the prompt ends in "Assistant:" and the
            # model answers " Hello"; the space belongs to the template, not the answer.
            message=AssistantMessage(content="".join(r.text).lstrip()),
            logprobs=chat_logprobs(model.tokenizer, r.tokens, r.logprobs, r.top) if with_logprobs else None,
            finish_reason=r.finish,
        )
        for i, r in enumerate(results)
    ]
    return ChatCompletion(id=ident, created=created, model=model.name, choices=choices, usage=run.usage(),
                          system_fingerprint=fp)


class ChatStream(StreamFormat):
    def __init__(self, ident: str, created: int, model: str, fp: str, n: int, include_usage: bool, tokenizer,
                 with_logprobs: bool):
        self.ident, self.created, self.model, self.fp, self.n = ident, created, model, fp, n
        # With include_usage every chunk carries "usage": null, the last one the totals (spec);
        # without it the field is left out, since some clients choke on what they did not ask for.
        self.no_usage = None if include_usage else msgspec.UNSET
        self.tokenizer, self.with_logprobs = tokenizer, with_logprobs
        self.started = [False] * n  # has a non-blank piece been sent (leading whitespace is trimmed)

    def _chunk(self, choices: list[ChunkChoice], usage: Usage | None = None) -> ChatCompletionChunk:
        return ChatCompletionChunk(id=self.ident, created=self.created, model=self.model, system_fingerprint=self.fp,
                                   choices=choices, usage=usage if usage is not None else self.no_usage)

    def opening(self):
        return [self._chunk([ChunkChoice(index=i, delta=Delta(role="assistant", content=""))])
                for i in range(self.n)]

    def piece(self, index: int, event: TextPiece):
        text = event.text
        if not self.started[index]:
            text = text.lstrip()
            self.started[index] = bool(text)
        logprobs = None
        if self.with_logprobs and event.tokens:
            logprobs = chat_logprobs(self.tokenizer, list(event.tokens), list(event.logprobs),
                                     list(event.top_logprobs))
        if not text and logprobs is None:
            return None
        return self._chunk([ChunkChoice(index=index, delta=Delta(content=text), logprobs=logprobs)])

    def finish(self, index: int, reason: str):
        return self._chunk([ChunkChoice(index=index, delta=Delta(), finish_reason=reason)])

    def usage(self, usage: Usage):
        return self._chunk([], usage=usage)
