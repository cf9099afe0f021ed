"""What chat and completions share: request fields → a Generate, events → choices or a stream.

A request becomes one `Generate` per prompt (completions may send several), each with
`n` choices; choice `i` of prompt `p` is choice `p * n + i` of the response, as OpenAI
numbers them. The handler either collects every choice (`collect`) or streams SSE
(`stream`); both cancel the generation when the client goes away (aiohttp cancels the
handler on disconnect, a write to a closed stream fails) so the slot is freed at once.
"""

from __future__ import annotations

import time
import uuid
from dataclasses import dataclass, field

import msgspec
from aiohttp import web

from ...messages import Cancel, Failed, Finished, Generate, ModelInfoEvent, Started, TextPiece
from ...sampler import SamplerError, SamplingOptions, TokenCounts, options_from_openai
from ..channel import EventChannel
from ..errors import ApiError, bad_request, from_failed, surface_of
from ..metrics import RequestObserver
from ..serving import Serving
from ..sse import EventStream
from .types import ChoiceLogprobs, PromptTokensDetails, SamplingFields, TokenLogprob, TopLogprob, Usage

# ---------------------------------------------------------------------------------- request side


def sampling_options(req: SamplingFields, *, logprobs: bool | int | None, top_logprobs: int | None) -> SamplingOptions:
    try:
        return options_from_openai(
            sampler=req.sampler_override or req.sampler,
            temperature=req.temperature, top_p=req.top_p, top_k=req.top_k,
            presence_penalty=req.presence_penalty, frequency_penalty=req.frequency_penalty,
            penalty_decay=req.penalty_decay, logit_bias=req.logit_bias or req.bias, seed=req.seed,
            logprobs=logprobs, top_logprobs=top_logprobs, repetition_penalty=req.repetition_penalty,
            repetition_window=req.repetition_window,
        )
    except SamplerError as e:
        raise bad_request(str(e), e.field) from None


def check_logit_bias(options: SamplingOptions, vocab: int) -> None:
    """Token ids of `logit_bias` must exist in this model's vocabulary."""
    for token in options.logit_bias:
        if not 0 <= token < vocab:
            raise bad_request(f"logit_bias: token id {token} is outside this model's vocabulary (0..{vocab - 1})",
                              "logit_bias")


def stop_strings(req: SamplingFields, default: tuple[str, ...]) -> tuple[str, ...]:
    """`stop` as a tuple; absent → `default`, explicit null → none (as Ai00). Any count is fine."""
    if req.stop is msgspec.UNSET:
        return default
    if req.stop is None:
        return ()
    stops = (req.stop,) if isinstance(req.stop, str) else tuple(req.stop)
    return tuple(s for s in stops if s)  # an empty stop string would end every reply at once


def max_tokens(value: int | None, default: int, limit: int, *, field: str, minimum: int) -> int:
    if value is None:
        return min(default, limit)
    if value < minimum:
        raise bad_request(f"'{field}' must be >= {minimum}, got {value}", field)
    if value > limit:
        raise bad_request(f"'{field}' is too large: {value}; this server allows at most {limit} "
                          "(config max_tokens_limit of this model)", field)
    return value


# ---------------------------------------------------------------------------------- the run


@dataclass
class ChoiceResult:
    text: list[str] = field(default_factory=list)  # the pieces as they came
    piece_tokens: list[int] = field(default_factory=list)  # how many tokens made each piece
    tokens: list[int] = field(default_factory=list)
    logprobs: list[float] = field(default_factory=list)
    top: list[tuple[tuple[int, float], ...]] = field(default_factory=list)
    finish: str | None = None
    completion_tokens: int = 0
    finished: Finished | None = None  # the event itself (with the state, when it was asked for)


class GenerationRun:
    """One request's generations in flight: prompts × n choices, events from one channel."""

    def __init__(self, serving: Serving, model: ModelInfoEvent, prompts: list[str], *, n: int,
                 options: SamplingOptions, max_tokens: int, stop: tuple[str, ...], model_text: str | TokenCounts = "",
                 state=None, prefix: tuple[int, ...] = (), keep_state: bool = False, speculative: bool = True):
        self.model, self.n, self.prompts = model, n, prompts
        # A request the middleware refuses while a state was named is about that state.
        self.failure_param = "state" if state is not None else None
        self.channel = EventChannel()
        self.cancel = Cancel()
        self.choices = [ChoiceResult() for _ in range(len(prompts) * n)]
        self.prompt_tokens = [0] * len(prompts)
        self.cached_tokens = [0] * len(prompts)
        self.open = len(self.choices)
        self.observer = RequestObserver(serving.metrics, model.name, len(prompts), n)
        self.serving = serving
        serving.run_started(self)
        for p, prompt in enumerate(prompts):
            serving.middleware.send(Generate(
                prompt=prompt, reply=self.channel.reply(p), cancel=self.cancel, options=options,
                max_tokens=max_tokens, stop=stop, n=n, state=state, prefix=prefix,
                model_text=model_text if isinstance(model_text, str) else "",
                model_counts=model_text if isinstance(model_text, TokenCounts) else None,
                keep_state=keep_state, model=model.name, speculative=speculative,
            ))

    @property
    def done(self) -> bool:
        return self.open == 0

    @property
    def ready(self) -> bool:
        """Whether `next` has an event at once (one that came with the last)."""
        return self.channel.ready

    async def next(self, timeout: float | None = None):
        """(choice index, event) with the index numbered across prompts; None on timeout.

        Raises ApiError on a failure; after that, nothing more is generated.
        """
        item = await self.channel.get(timeout)
        if item is None:
            return None
        prompt, event = item
        index = prompt * self.n + getattr(event, "index", 0)
        if isinstance(event, Failed):
            self.close()
            raise from_failed(event, self.failure_param)
        self.observer.event(index, event)
        choice = self.choices[index]
        if isinstance(event, Started):
            if event.index == 0:
                self.prompt_tokens[prompt] = event.prompt_tokens
                self.cached_tokens[prompt] = event.cached_tokens
        elif isinstance(event, TextPiece):
            choice.text.append(event.text)
            choice.piece_tokens.append(len(event.tokens))
            choice.tokens.extend(event.tokens)
            choice.logprobs.extend(event.logprobs)
            choice.top.extend(event.top_logprobs)
        elif isinstance(event, Finished):
            if choice.finish is None:
                self.open -= 1
            # "cancelled" only happens once we cancelled, i.e. nobody reads it any more.
            choice.finish = "stop" if event.reason == "cancelled" else event.reason
            choice.completion_tokens = event.completion_tokens
            choice.finished = event
            self.prompt_tokens[prompt] = event.prompt_tokens
        return index, event

    def close(self) -> None:
        """Stop whatever still runs (client gone, or an error ended the request)."""
        if not self.done:
            self.cancel.set()
        self.observer.close(unfinished=not self.done)
        self.serving.run_ended(self)

    def usage(self) -> Usage:
        prompt = sum(self.prompt_tokens)
        completion = sum(c.completion_tokens for c in self.choices)
        return Usage(prompt, completion, prompt + completion, PromptTokensDetails(sum(self.cached_tokens)))

    async def collect(self) -> list[ChoiceResult]:
        try:
            while not self.done:
                await self.next()
        finally:
            self.close()
        return self.choices


# ---------------------------------------------------------------------------------- response side


def new_id(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex}"


def now() -> int:
    return int(time.time())


def token_text(tokenizer, token: int) -> tuple[str, list[int]]:
    """A token as OpenAI shows it: text (undecodable bytes escaped) and its raw bytes."""
    raw = tokenizer.token_bytes(token) if tokenizer is not None else b""
    return raw.decode("utf-8", errors="backslashreplace"), list(raw)


def chat_logprobs(tokenizer, tokens: list[int], logprobs: list[float],
                  top: list[tuple[tuple[int, float], ...]]) -> ChoiceLogprobs:
    content = []
    for k, token in enumerate(tokens):
        text, raw = token_text(tokenizer, token)
        alternatives = []
        for alt, alt_lp in (top[k] if k < len(top) else ()):
            alt_text, alt_raw = token_text(tokenizer, alt)
            alternatives.append(TopLogprob(alt_text, float(alt_lp), alt_raw))
        content.append(TokenLogprob(text, float(logprobs[k]) if k < len(logprobs) else 0.0, raw, alternatives))
    return ChoiceLogprobs(content=content, refusal=None)


# ---------------------------------------------------------------------------------- streaming


class StreamFormat:
    """How one route renders its stream; chat and completions each provide one."""

    def opening(self) -> list[msgspec.Struct]:
        return []

    def piece(self, index: int, event: TextPiece) -> msgspec.Struct | None:
        raise NotImplementedError

    def finish(self, index: int, reason: str) -> msgspec.Struct:
        raise NotImplementedError

    def usage(self, usage: Usage) -> msgspec.Struct:
        raise NotImplementedError


async def run_as_sse(request: web.Request, run: GenerationRun, ping_interval: float, write, *,
                     opener=EventStream.of) -> web.StreamResponse:
    """Send the run as server-sent events, written by `await write(out, items)` where `items`
    yields each (choice index, event) as it comes (and pings through silences). Errors before
    the first byte are plain HTTP errors; after it, an error event. `opener(request)` makes
    the stream: another kind with EventStream's methods (Ollama's NDJSON) is run the same way."""
    out: EventStream | None = None
    try:
        # Requests the middleware refuses (no model, bad state) fail within milliseconds:
        # wait that long for a first event so they get a real status code.
        first = await run.next(timeout=min(ping_interval, 0.25))
        out = opener(request)  # begun already, with pings, if it waited for its model
        await out.start()

        async def items():
            item = first
            while True:
                if item is None:
                    await out.ping()  # silence: keep proxies and browsers from dropping the stream
                else:
                    yield item
                if run.done:
                    return
                item = await run.next(timeout=ping_interval)

        await write(out, items())
        return out.response
    except ApiError as e:
        if out is None:
            raise
        await out.error(e.envelope(surface_of(request)))
        return out.response
    finally:
        run.close()


async def stream(request: web.Request, run: GenerationRun, fmt: StreamFormat, *, include_usage: bool,
                 ping_interval: float) -> web.StreamResponse:
    """Send the run as chat's or completions' SSE chunks, then `data: [DONE]`."""

    async def write(out: EventStream, items) -> None:
        for chunk in fmt.opening():
            await out.send(chunk)
        # Events that reached the loop together (it was late for a step, or a step made
        # several) leave in one write; a lone one leaves at once, as before.
        chunks = []
        async for index, event in items:
            if isinstance(event, TextPiece):
                chunk = fmt.piece(index, event)
                if chunk is not None:
                    chunks.append(chunk)
            elif isinstance(event, Finished):
                chunks.append(fmt.finish(index, run.choices[index].finish))
            if chunks and not run.ready:
                await out.send_all(chunks)
                chunks = []
        if include_usage:
            chunks.append(fmt.usage(run.usage()))
        if chunks:
            await out.send_all(chunks)
        await out.done()

    return await run_as_sse(request, run, ping_interval, write)
