"""POST chat/completions."""

from __future__ import annotations

from dataclasses import dataclass

import msgspec
from aiohttp import web

from ...identity import fingerprint
from ...messages import ModelInfoEvent, TextPiece
from ...sampler import SamplingOptions
from ..body import decode_body
from ..serving import Serving
from .generation import (
    ChoiceResult,
    GenerationRun,
    StreamFormat,
    chat_logprobs,
    check_logit_bias,
    max_tokens,
    new_id,
    now,
    sampling_options,
    stop_strings,
    stream,
)
from .prompt import DEFAULT_CHAT_STOP, ChatPrompt, render_chat
from .reasoning import think_plan
from .reply import ReplyReader
from ..saved_states.use import read_tools, saved_state
from .state import requested_state
from .structured import Structure, structured_output
from .tools import tools_digest, with_tools
from .types import (
    AssistantMessage,
    ChatChoice,
    ChatCompletion,
    ChatCompletionChunk,
    ChatCompletionRequest,
    ChunkChoice,
    CompletionTokensDetails,
    Delta,
    FunctionCall,
    FunctionCallDelta,
    ToolCall,
    ToolCallDelta,
    Usage,
)

DEFAULT_MAX_TOKENS = 256  # Ai00's default; OpenAI's is "whatever fits", which an RNN does not bound


@dataclass
class ChatPlan:
    """A chat request made ready to generate: its prompt, constraints and limits."""

    model: ModelInfoEvent
    rendered: ChatPrompt
    opening: str  # the reply's start, written into the prompt (reasoning.py, structured.py)
    structure: Structure
    options: SamplingOptions
    budget: int
    stop: tuple[str, ...]

    @property
    def reasoning(self) -> bool:
        return self.model.spec.thinking != "none"

    def reader(self) -> ReplyReader:
        return ReplyReader(self.structure.tools, self.opening)


async def plan_chat(serving: Serving, req: ChatCompletionRequest, messages: list, *,
                    announce_tools: bool = True, stop_sequences: tuple[str, ...] = (),
                    read_tools: str = "") -> ChatPlan:
    """Prompt, grammar, sampling and limits of a chat request (and of a Responses or
    Messages request read as one). `announce_tools=False` leaves the tools out of the prompt
    (a continued conversation that offered them already) while the reply may still call
    them. `stop_sequences` end the reply besides the turn's own end (Anthropic's, which add
    to it where OpenAI's `stop` replaces it). `read_tools`: the tools turn (tools_digest)
    the starting state has read already, a saved state's; the same tools are not announced
    again, so the prompt reads as one chat of the saved messages and these."""
    model = await serving.model_for(req.model, stream=bool(req.stream), keep_alive=req.keep_alive)
    thinking = think_plan(model.spec.thinking, model.spec.reasoning_effort, req.reasoning_effort,
                          enable_thinking(req.chat_template_kwargs))
    structure = await structured_output(req, model, chat=True, opening=thinking.opening)
    offered = req.tools if structure.tools and announce_tools else None
    if offered and read_tools and tools_digest(offered) == read_tools:
        offered = None
    # A forced call's opening replaces the think's: such a reply is the call, nothing else.
    opening = structure.opening or thinking.opening
    rendered = render_chat(with_tools(messages, offered), req.names, req.template, opening=opening,
                           user_suffix="" if structure.opening else thinking.suffix)
    limit = model.spec.max_tokens_limit
    if req.max_completion_tokens is not None:
        budget = max_tokens(req.max_completion_tokens, DEFAULT_MAX_TOKENS, limit, field="max_completion_tokens",
                            minimum=1)
    else:
        budget = max_tokens(req.max_tokens, DEFAULT_MAX_TOKENS, limit, field="max_tokens", minimum=1)
    options = sampling_options(req, logprobs=req.logprobs, top_logprobs=req.top_logprobs)
    # A grammar says where the reply ends; the blank line that ends a chat turn is not needed.
    stop = stop_strings(req, DEFAULT_CHAT_STOP if structure.free_text else ())
    stop += tuple(s for s in stop_sequences if s and s not in stop)
    options = msgspec.structs.replace(options, grammar=structure.grammar)
    check_logit_bias(options, model.info.vocab)
    return ChatPlan(model, rendered, opening, structure, options, budget, stop)


async def chat_completions(request: web.Request, serving: Serving):
    config = serving.config
    req = await decode_body(request, ChatCompletionRequest, config.listen.max_body_bytes)
    messages = [req.messages] if not isinstance(req.messages, list) and req.messages is not None else req.messages
    plan = await plan_chat(serving, req, messages or [], read_tools=await read_tools(serving, request, req.state))
    model = plan.model
    state = await saved_state(serving, request, req.state, model) or requested_state(req.state, model)
    n = req.n or 1

    run = GenerationRun(serving, model, [plan.rendered.prompt], n=n, options=plan.options, max_tokens=plan.budget,
                        stop=plan.stop, model_text=plan.rendered.model_text, state=state,
                        speculative=req.speculative is not False)
    ident, created, fp = new_id("chatcmpl"), now(), fingerprint(model)
    with_logprobs = plan.options.wants_logprobs

    if req.stream:
        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        fmt = ChatStream(ident, created, model.name, fp, n, include_usage, model.tokenizer, with_logprobs,
                         [plan.reader() for _ in range(n)], plan.reasoning)
        return await stream(request, run, fmt, include_usage=include_usage,
                            ping_interval=config.listen.ping_interval)

    results = await run.collect()
    choices, readers = [], []
    for i, r in enumerate(results):
        reply = read_reply(plan.reader(), r)
        readers.append(reply)
        message, finish = _message(reply, r.finish)
        choices.append(ChatChoice(
            index=i, message=message, finish_reason=finish,
            logprobs=chat_logprobs(model.tokenizer, r.tokens, r.logprobs, r.top) if with_logprobs else None,
        ))
    return ChatCompletion(id=ident, created=created, model=model.name, choices=choices,
                          usage=with_reasoning(run.usage(), readers, plan.reasoning), system_fingerprint=fp)


def enable_thinking(kwargs: dict | None) -> bool | None:
    """vLLM's `chat_template_kwargs: {"enable_thinking": …}`, if given."""
    value = (kwargs or {}).get("enable_thinking")
    return value if isinstance(value, bool) else None


def read_reply(reader: ReplyReader, result: ChoiceResult) -> ReplyReader:
    """A collected choice read through `reader`, its pieces as they came."""
    for text, tokens in zip(result.text, result.piece_tokens):
        reader.push(text, tokens)
    reader.finish()
    return reader


def with_reasoning(usage: Usage, readers: list[ReplyReader], reasoning: bool) -> Usage:
    """`usage` with `completion_tokens_details.reasoning_tokens` where the model thinks."""
    if not reasoning:
        return usage
    details = CompletionTokensDetails(reasoning_tokens=sum(r.reasoning_tokens for r in readers))
    return msgspec.structs.replace(usage, completion_tokens_details=details)


def _message(reply: ReplyReader, finish: str) -> tuple[AssistantMessage, str]:
    """The reply as a message: tool calls (finish_reason tool_calls) or content, with its
    thinking. Cut by max_tokens, the last call's arguments are as far as they got
    (finish_reason length), as a stream sent them."""
    thought = reply.reasoning_text if reply.reasoning_text is not None else msgspec.UNSET
    if not reply.calls:
        return AssistantMessage(content=reply.content_text, reasoning_content=thought), finish
    tool_calls = [ToolCall(id=c.id, function=FunctionCall(c.name, c.arguments)) for c in reply.calls]
    return (AssistantMessage(content=None, tool_calls=tool_calls, reasoning_content=thought),
            "tool_calls" if finish == "stop" else finish)


class ChatStream(StreamFormat):
    def __init__(self, ident: str, created: int, model: str, fp: str, n: int, include_usage: bool, tokenizer,
                 with_logprobs: bool, readers: list[ReplyReader], reasoning: bool = False):
        self.ident, self.created, self.model, self.fp, self.n = ident, created, model, fp, n
        # With include_usage every chunk carries "usage": null, the last one the totals (spec);
        # without it the field is left out, since some clients choke on what they did not ask for.
        self.no_usage = None if include_usage else msgspec.UNSET
        self.tokenizer, self.with_logprobs = tokenizer, with_logprobs
        self.readers, self.reasoning = readers, reasoning
        self.tools = readers[0].tool_reader is not None

    def _chunk(self, choices: list[ChunkChoice], usage: Usage | None = None) -> ChatCompletionChunk:
        return ChatCompletionChunk(id=self.ident, created=self.created, model=self.model, system_fingerprint=self.fp,
                                   choices=choices, usage=usage if usage is not None else self.no_usage)

    def opening(self):
        # With tools or thinking the reply may hold no content: none until some is known.
        content = msgspec.UNSET if self.tools or self.reasoning else ""
        chunks = [self._chunk([ChunkChoice(index=i, delta=Delta(role="assistant", content=content))])
                  for i in range(self.n)]
        # A forced call's name is known from the prompt: it goes out before any token.
        return chunks + [self._chunk([ChunkChoice(index=i, delta=self._delta(i, reader.opened))])
                         for i, reader in enumerate(self.readers) if reader.opened]

    def _delta(self, index: int, events) -> Delta:
        """Thinking, content and tool call pieces, as one delta."""
        text, thought, calls = "", "", []
        for event in events:
            if event[0] == "content":
                text += event[1]
            elif event[0] == "reasoning":
                thought += event[1]
            elif event[0] == "call":
                # Its place among the reply's calls: one push can name several (text a stop
                # string held back), so not "the calls read so far".
                number = next(k for k, c in enumerate(self.readers[index].calls) if c is event[1])
                calls.append(ToolCallDelta(index=number, id=event[1].id, type="function",
                                           function=FunctionCallDelta(name=event[1].name, arguments="")))
            else:
                calls.append(ToolCallDelta(index=event[1], function=FunctionCallDelta(arguments=event[2])))
        return Delta(content=text or msgspec.UNSET, reasoning_content=thought or msgspec.UNSET,
                     tool_calls=calls or msgspec.UNSET)

    def piece(self, index: int, event: TextPiece):
        delta = self._delta(index, self.readers[index].push(event.text, len(event.tokens)))
        logprobs = None
        if self.with_logprobs and event.tokens:
            logprobs = chat_logprobs(self.tokenizer, list(event.tokens), list(event.logprobs),
                                     list(event.top_logprobs))
        if delta == Delta() and logprobs is None:
            return None
        return self._chunk([ChunkChoice(index=index, delta=delta, logprobs=logprobs)])

    def finish(self, index: int, reason: str):
        reader = self.readers[index]
        delta = self._delta(index, reader.finish())
        if reader.calls and reason == "stop":
            reason = "tool_calls"
        return self._chunk([ChunkChoice(index=index, delta=delta, finish_reason=reason)])

    def usage(self, usage: Usage):
        return self._chunk([], usage=with_reasoning(usage, self.readers, self.reasoning))
