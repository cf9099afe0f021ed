"""POST completions (the legacy text API): raw prompts, no template.

A list of prompts gives one choice per prompt (times `n`); Ai00 concatenated them into
one prompt instead. Streamed chunks use `choices[].text` as OpenAI does (Ai00 sent
`delta.content`). `max_tokens` defaults to 16 as in OpenAI's spec, and no stop string is
added unless the request gives one.
"""

from __future__ import annotations

import codecs

import msgspec
from aiohttp import web

from ...identity import fingerprint
from ...messages import Failed, ScorePrompt, TextPiece
from ..body import decode_body
from ..channel import EventChannel
from ..errors import bad_request, from_failed
from ..serving import Serving
from .generation import (
    GenerationRun, StreamFormat, check_logit_bias, max_tokens, new_id, now, sampling_options,
    stop_strings, stream, token_text,
)
from ..saved_states.use import saved_state
from .state import requested_state
from .structured import structured_output
from .types import Completion, CompletionChoice, CompletionRequest, LegacyLogprobs, Usage

DEFAULT_MAX_TOKENS = 16  # OpenAI's default for this route


def _prompts(req: CompletionRequest) -> list[str]:
    prompt = req.prompt
    if prompt is None:
        return [""]  # the model starts from end-of-text, a new document
    if isinstance(prompt, str):
        return [prompt]
    if not prompt:
        raise bad_request("'prompt' must not be an empty list", "prompt")
    for i, item in enumerate(prompt):
        if not isinstance(item, str):
            raise bad_request("Prompts given as token ids are not supported; send the text", f"prompt[{i}]")
    return prompt


def _refuse_unsupported(req: CompletionRequest, n: int) -> None:
    if req.suffix:
        raise bad_request("'suffix' (fill in the middle) is not supported", "suffix")
    if req.best_of is not None and req.best_of > 1 and req.best_of != n:
        raise bad_request("'best_of' is not supported; use 'n'", "best_of")
    if req.echo and req.logprobs is not None and req.stream:
        raise bad_request("'echo' with 'logprobs' is answered whole: send it without 'stream'", "stream")


class LegacyLogprobBuilder:
    """`logprobs` of one choice in the legacy form, with character offsets into its text."""

    def __init__(self, tokenizer, offset: int):
        self.tokenizer, self.offset = tokenizer, offset
        # Offsets count whole characters: a character split over tokens counts where it ends.
        self.decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def build(self, event: TextPiece) -> LegacyLogprobs:
        tokens, offsets, tops = [], [], []
        for k, token in enumerate(event.tokens):
            text, raw = token_text(self.tokenizer, token)
            tokens.append(text)
            offsets.append(self.offset)
            self.offset += len(self.decoder.decode(bytes(raw)))
            top = event.top_logprobs[k] if k < len(event.top_logprobs) else ()
            first_of_prompt = k < len(event.logprobs) and event.logprobs[k] is None
            tops.append(None if first_of_prompt else {token_text(self.tokenizer, alt)[0]: float(lp) for alt, lp in top})
        logprobs = [None if lp is None else float(lp) for lp in event.logprobs[: len(tokens)]]
        return LegacyLogprobs(tokens=tokens, token_logprobs=logprobs, top_logprobs=tops, text_offset=offsets)


async def completions(request: web.Request, serving: Serving):
    config = serving.config
    req = await decode_body(request, CompletionRequest, config.listen.max_body_bytes)
    n = req.n or 1
    _refuse_unsupported(req, n)
    prompts = _prompts(req)
    options = sampling_options(req, logprobs=req.logprobs, top_logprobs=None)
    stop = stop_strings(req, ())
    model = await serving.model_for(req.model, stream=bool(req.stream), keep_alive=req.keep_alive)
    budget = max_tokens(req.max_tokens, DEFAULT_MAX_TOKENS, model.spec.max_tokens_limit, field="max_tokens",
                        minimum=0)
    structure = await structured_output(req, model, chat=False)
    options = msgspec.structs.replace(options, grammar=structure.grammar)
    state = await saved_state(serving, request, req.state, model) or requested_state(req.state, model)
    check_logit_bias(options, model.info.vocab)
    ident, created, fp = new_id("cmpl"), now(), fingerprint(model)
    echoes = [p if req.echo else "" for p in prompts for _ in range(n)]
    with_logprobs = req.logprobs is not None

    # echo + logprobs: the prompt's own log-probabilities lead each choice's (lm-eval's way
    # of asking for log-likelihoods, usually with max_tokens 0).
    prompt_logprobs = ([await _score_prompt(serving, model, p, req.logprobs or 0, state) for p in prompts]
                       if req.echo and with_logprobs else None)

    def echoed(i: int) -> LegacyLogprobs:
        return prompt_logprobs[i // n] if prompt_logprobs else LegacyLogprobs([], [], [], [])

    if budget == 0:
        # Nothing to generate: answer without the backend's generation loop.
        tokens = [len(model.tokenizer.encode(p)) if model.tokenizer else 0 for p in prompts]
        choices = [CompletionChoice(index=i, text=echoes[i], logprobs=echoed(i) if with_logprobs else None,
                                    finish_reason="length") for i in range(len(echoes))]
        usage = Usage(sum(tokens), 0, sum(tokens))
        return Completion(id=ident, created=created, model=model.name, system_fingerprint=fp, choices=choices,
                          usage=usage)

    run = GenerationRun(serving, model, prompts, n=n, options=options, max_tokens=budget, stop=stop, state=state,
                        speculative=req.speculative is not False)
    if req.stream:
        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        fmt = CompletionStream(ident, created, model.name, fp, echoes, model.tokenizer, with_logprobs)
        return await stream(request, run, fmt, include_usage=include_usage,
                            ping_interval=config.listen.ping_interval)

    results = await run.collect()
    choices = []
    for i, r in enumerate(results):
        logprobs = None
        if with_logprobs:
            builder = LegacyLogprobBuilder(model.tokenizer, len(echoes[i]))
            logprobs = _joined(echoed(i), builder.build(TextPiece(i, "", tuple(r.tokens), tuple(r.logprobs),
                                                                  tuple(r.top))))
        choices.append(CompletionChoice(index=i, text=echoes[i] + "".join(r.text), logprobs=logprobs,
                                        finish_reason=r.finish))
    return Completion(id=ident, created=created, model=model.name, system_fingerprint=fp, choices=choices,
                      usage=run.usage())


async def _score_prompt(serving: Serving, model, prompt: str, top: int, state) -> LegacyLogprobs:
    channel = EventChannel()
    serving.middleware.send(ScorePrompt(prompt, channel.reply(), top, state, model=model.name))
    event = await channel.first()
    if isinstance(event, Failed):
        raise from_failed(event, "prompt")
    builder = LegacyLogprobBuilder(model.tokenizer, 0)
    # OpenAI's legacy form gives the first token null: nothing came before it.
    return builder.build(TextPiece(0, "", event.tokens, event.logprobs, event.top_logprobs))


def _joined(first: LegacyLogprobs, then: LegacyLogprobs) -> LegacyLogprobs:
    return LegacyLogprobs(first.tokens + then.tokens, first.token_logprobs + then.token_logprobs,
                          first.top_logprobs + then.top_logprobs, first.text_offset + then.text_offset)


class CompletionStream(StreamFormat):
    def __init__(self, ident: str, created: int, model: str, fp: str, echoes: list[str], tokenizer,
                 with_logprobs: bool):
        self.ident, self.created, self.model, self.fp, self.echoes = ident, created, model, fp, echoes
        self.builders = [LegacyLogprobBuilder(tokenizer, len(e)) for e in echoes] if with_logprobs else None

    def _chunk(self, choices: list[CompletionChoice], usage: Usage | None = None) -> Completion:
        chunk = Completion(id=self.ident, created=self.created, model=self.model, system_fingerprint=self.fp,
                           choices=choices)
        if usage is not None:
            chunk.usage = usage  # only on the final usage chunk: the spec's usage is not nullable here
        return chunk

    def opening(self):
        return [self._chunk([CompletionChoice(index=i, text=e, logprobs=None, finish_reason=None)])
                for i, e in enumerate(self.echoes) if e]

    def piece(self, index: int, event: TextPiece):
        logprobs = self.builders[index].build(event) if self.builders and event.tokens else None
        if not event.text and logprobs is None:
            return None
        return self._chunk([CompletionChoice(index=index, text=event.text, logprobs=logprobs, finish_reason=None)])

    def finish(self, index: int, reason: str):
        return self._chunk([CompletionChoice(index=index, text="", logprobs=None, finish_reason=reason)])

    def usage(self, usage: Usage):
        return self._chunk([], usage=usage)
