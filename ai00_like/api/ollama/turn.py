"""One chat or generate request from its plan to its answer: the run, read by OllamaReply,
as one object or as NDJSON lines, the last with Ollama's statistics."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import msgspec
from aiohttp import web

from ...messages import ModelInfoEvent, TextPiece
from ..oai.generation import GenerationRun, run_as_sse
from ..serving import Serving
from .names import rfc3339, served_name
from .ndjson import NdjsonStream
from .reply import OllamaReply, Piece
from .types import ChatResponse, GenerateResponse, GenerationFields, MessageOut


@dataclass
class Clock:
    """When each part of a request happened (time.monotonic_ns), for its statistics."""

    start: int = field(default_factory=time.monotonic_ns)
    load: int = 0  # nanoseconds model_for took
    first_token: int = 0
    end: int = 0

    async def model(self, serving: Serving, req: GenerationFields) -> ModelInfoEvent:
        """The request's model, loaded (the time it took is its load_duration)."""
        before = time.monotonic_ns()
        model = await serving.model_for(served_name(serving, req.model), stream=False, keep_alive=req.keep_alive)
        self.load = time.monotonic_ns() - before
        return model

    def stats(self, run: GenerationRun) -> dict:
        end = self.end or time.monotonic_ns()
        first = self.first_token or end
        begun = self.start + self.load
        usage = run.usage()
        return {"total_duration": end - self.start, "load_duration": self.load,
                "prompt_eval_count": usage.prompt_tokens, "prompt_eval_duration": max(first - begun, 0),
                "eval_count": usage.completion_tokens, "eval_duration": end - first}


def chat_object(model: str, piece: Piece, *, done: bool, **final) -> ChatResponse:
    message = MessageOut(content=piece.content, thinking=piece.thinking or msgspec.UNSET,
                         tool_calls=piece.calls or msgspec.UNSET)
    return ChatResponse(model=model, created_at=rfc3339(), message=message, done=done, **final)


def generate_object(model: str, piece: Piece, *, done: bool, **final) -> GenerateResponse:
    return GenerateResponse(model=model, created_at=rfc3339(), response=piece.content,
                            thinking=piece.thinking or msgspec.UNSET, done=done, **final)


Shape = Callable[..., msgspec.Struct]  # chat_object or generate_object


@dataclass
class Turn:
    serving: Serving
    plan: Any  # oai.chat.ChatPlan (not imported: this module is below chat's planning, beside it)
    clock: Clock
    shape: Shape

    def run(self) -> GenerationRun:
        plan = self.plan
        return GenerationRun(self.serving, plan.model, [plan.rendered.prompt], n=1, options=plan.options,
                             max_tokens=plan.budget, stop=plan.stop, model_text=plan.rendered.model_text)

    def final(self, run: GenerationRun, piece: Piece) -> msgspec.Struct:
        self.clock.end = self.clock.end or time.monotonic_ns()
        return self.shape(self.plan.model.name, piece, done=True, done_reason=run.choices[0].finish or "stop",
                          **self.clock.stats(run))

    async def answer(self, request: web.Request, stream: bool):
        run = self.run()
        if stream:
            return await self._stream(request, run)
        reply = await self._collect(run)
        whole = Piece(reply.content, reply.thinking or "", reply.calls)
        return self.final(run, whole)

    async def _collect(self, run: GenerationRun):
        """The reply read whole (as GenerationRun.collect runs it), the time its first token came noted."""
        reply = OllamaReply(self.plan.reader())
        try:
            while not run.done:
                item = await run.next()
                if item is not None and isinstance(item[1], TextPiece):
                    self.clock.first_token = self.clock.first_token or time.monotonic_ns()
                    reply.push(item[1].text, len(item[1].tokens))
        finally:
            run.close()
        reply.finish()
        self.clock.end = time.monotonic_ns()
        return reply

    async def _stream(self, request: web.Request, run: GenerationRun):
        clock, model = self.clock, self.plan.model.name

        async def write(out: NdjsonStream, items) -> None:
            reply = OllamaReply(self.plan.reader())
            if reply.opened:
                await out.send(self.shape(model, reply.opened, done=False))
            async for _, event in items:
                if isinstance(event, TextPiece):
                    clock.first_token = clock.first_token or time.monotonic_ns()
                    piece = reply.push(event.text, len(event.tokens))
                    if piece:
                        await out.send(self.shape(model, piece, done=False))
            last = reply.finish()
            if last:
                await out.send(self.shape(model, last, done=False))
            await out.send(self.final(run, Piece()))
            await out.done()

        return await run_as_sse(request, run, self.serving.config.listen.ping_interval, write, opener=NdjsonStream)
