"""POST /v1/messages and /v1/messages/count_tokens: Anthropic's Messages API.

A Messages request is read as a chat request (request.py, conversation.py) and planned by
chat.plan_chat, so it gets the same prompt, think plan, tool grammar, sampling and limits
as /v1/chat/completions; it runs as any GenerationRun, and its reply is read by the same
ReplyReader into thinking, text and tool calls, which blocks.py writes as Anthropic's
content blocks (and their stream events). Errors are raised as everywhere (ApiError); the
route table tags these routes as Anthropic's, so they leave in Anthropic's envelope.
"""

from __future__ import annotations

import asyncio
import uuid
from dataclasses import dataclass, field

import msgspec
from aiohttp import web

from ...messages import TextPiece
from ..body import decode_body
from ..errors import ANTHROPIC
from ..oai.chat import ChatPlan, plan_chat
from ..oai.generation import GenerationRun, run_as_sse
from ..openapi import Route
from ..serving import Serving
from ..sse import STARTED, EventStream
from .blocks import BlockBuilder
from .conversation import chat_messages, system_message
from .request import as_chat
from .stop import matched_stop, stop_reason
from .types import (
    ContentBlock,
    DeltaUsage,
    Event,
    Message,
    MessageDelta,
    MessageDeltaBody,
    MessagesInput,
    MessagesRequest,
    MessageStart,
    TokenCount,
    ToolUseBlock,
    Usage,
)

PING = Event(type="ping")


class MessageEventStream(EventStream):
    """Anthropic's stream fills its silences with `ping` events, as Anthropic's own does."""

    async def ping(self) -> None:
        await self.send_typed(PING)


def _open_stream(request: web.Request) -> EventStream:
    # One begun while its model loaded keeps its comment pings (the SDK skips them too).
    return request.get(STARTED) or MessageEventStream(request)


@dataclass
class MessageTurn:
    """One request's reply in the making: its plan, its run and what it is called."""

    plan: ChatPlan
    run: GenerationRun
    stops: tuple[str, ...]  # the request's stop_sequences
    ident: str = field(default_factory=lambda: "msg_" + uuid.uuid4().hex[:24])

    def usage(self) -> Usage:
        u = self.run.usage()
        cached = u.prompt_tokens_details.cached_tokens if u.prompt_tokens_details else 0
        return Usage(input_tokens=u.prompt_tokens - cached, output_tokens=u.completion_tokens,
                     cache_read_input_tokens=cached)

    def message(self, content: list[ContentBlock]) -> Message:
        """The message as it stands: with no stop reason while it is still being written."""
        result = self.run.choices[0]
        reason = stop = None
        if result.finish is not None:
            stop = matched_stop(self.plan.model.tokenizer, result, self.stops) if result.finish == "stop" else None
            reason = stop_reason(result, calls=any(isinstance(b, ToolUseBlock) for b in content),
                                 stop_sequence=stop)
        return Message(id=self.ident, model=self.plan.model.name, content=content, stop_reason=reason,
                       stop_sequence=stop, usage=self.usage())


async def _plan(serving: Serving, req: MessagesInput, *, max_tokens: int | None = None, stream: bool = False,
                keep_alive=None, stops: tuple[str, ...] = ()) -> ChatPlan:
    """The request's chat plan, on the model it names; `max_tokens` lowered to the model's limit."""
    chat = as_chat(req, model=req.model)  # what can be refused without the model, before loading it
    messages = system_message(req.system) + chat_messages(req.messages)
    model = await serving.model_for(req.model, stream=stream, keep_alive=keep_alive)
    budget = min(max_tokens, model.spec.max_tokens_limit) if max_tokens is not None else None
    chat = msgspec.structs.replace(chat, model=model.name, max_tokens=budget)
    return await plan_chat(serving, chat, messages, stop_sequences=stops)


async def create_message(request: web.Request, serving: Serving):
    req = await decode_body(request, MessagesRequest, serving.config.listen.max_body_bytes)
    stops = tuple(req.stop_sequences or ())
    plan = await _plan(serving, req, max_tokens=req.max_tokens, stream=bool(req.stream), keep_alive=req.keep_alive,
                       stops=stops)
    run = GenerationRun(serving, plan.model, [plan.rendered.prompt], n=1, options=plan.options,
                        max_tokens=plan.budget, stop=plan.stop, model_text=plan.rendered.model_text)
    turn = MessageTurn(plan, run, stops)
    if req.stream:
        return await _stream(request, serving, turn)
    result = (await run.collect())[0]
    reply, builder = plan.reader(), BlockBuilder()
    builder.push(reply.opened)
    for piece, count in zip(result.text, result.piece_tokens):
        builder.push(reply.push(piece, count))
    builder.push(reply.finish())
    builder.close()
    return turn.message(builder.blocks)


async def _stream(request: web.Request, serving: Serving, turn: MessageTurn) -> web.StreamResponse:
    """The message as Anthropic's typed events, from message_start to message_stop, or
    ending with an error event when the reply cannot be finished."""

    async def write(out: EventStream, pieces) -> None:
        reply, builder = turn.plan.reader(), BlockBuilder()
        for event in [MessageStart(type="message_start", message=turn.message([])), PING,
                      *builder.push(reply.opened)]:
            await out.send_typed(event)
        # A failure from here on reaches run_as_sse, which ends the stream with an error event.
        async for _, piece in pieces:
            if isinstance(piece, TextPiece):
                for event in builder.push(reply.push(piece.text, len(piece.tokens))):
                    await out.send_typed(event)
        for event in builder.push(reply.finish()) + builder.close():
            await out.send_typed(event)
        final, usage = turn.message(builder.blocks), turn.usage()
        await out.send_typed(MessageDelta(
            type="message_delta", delta=MessageDeltaBody(stop_reason=final.stop_reason,
                                                         stop_sequence=final.stop_sequence),
            usage=DeltaUsage(output_tokens=usage.output_tokens, input_tokens=usage.input_tokens,
                             cache_read_input_tokens=usage.cache_read_input_tokens)))
        await out.send_typed(Event(type="message_stop"))
        await out.done(marker=False)

    return await run_as_sse(request, turn.run, serving.config.listen.ping_interval, write, opener=_open_stream)


async def count_tokens(request: web.Request, serving: Serving) -> TokenCount:
    req = await decode_body(request, MessagesInput, serving.config.listen.max_body_bytes)
    plan = await _plan(serving, req)
    tokens = await asyncio.get_running_loop().run_in_executor(None, plan.model.tokenizer.encode,
                                                              plan.rendered.prompt)
    return TokenCount(input_tokens=len(tokens))


ROUTES = [
    Route("POST", "/v1/messages", create_message, "A message (Anthropic's Messages API), read as a chat request",
          body=MessagesRequest, returns=Message, streams=Event, surface=ANTHROPIC),
    Route("POST", "/v1/messages/count_tokens", count_tokens, "The prompt's token count of a Messages request "
          "(Anthropic's)", body=MessagesInput, returns=TokenCount, surface=ANTHROPIC),
]
