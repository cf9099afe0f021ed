"""One streamed reply of the demo model against the engine's own batch-1 rate (part of
bench/http_tier.py's run).

The engine's rate is a bare loop of `model.step` on one slot, one token at a time, with
argmax in between: the most a server can stream at batch 1. The HTTP figure is one SSE
stream from /v1/completions of the server subprocess, a greedy reply (`temperature` 0
and no penalties: the tokens the engine's loop makes) of `tokens` tokens. Its rate counts the token events after the first over the time after the first,
so the prompt's prefill and the request's setup do not count; what is left is the time
each token spends outside the model: sampling, detokenising, the hand-off to the event
loop, SSE encoding and writing. Greedy, the demo model writes on past 1,500 tokens of this
prompt without an end of text (checked: the reply must have `tokens` tokens).
"""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

import numpy as np
from local import StreamTail, stream_completion

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "assets" / "models" / "demo.st"
DEMO_VOCAB = ROOT / "assets" / "models" / "demo_vocab.txt"
PROMPT = "In the beginning God created the heaven and the earth."
# The server's tokenizer section: the demo model has its own vocabulary.
DEMO_SECTIONS = f'[tokenizer]\npath = "{DEMO_VOCAB}"\n'
# Every token's chunk (and only those) carries this; the finish chunk has a reason.
_TOKEN_MARK = b'"finish_reason":null'


class Engine:
    """The demo model in this process, for the batch-1 anchor."""

    def __init__(self, max_batch: int):
        from ai00_like.rwkv import load_model
        from ai00_like.rwkv.tokenizer import load_tokenizer

        self.model = load_model(DEMO, max_batch=max_batch)
        self.prompt = load_tokenizer(DEMO_VOCAB).encode(PROMPT)

    def rate(self, tokens: int) -> float:
        """Tokens/s of `tokens` greedy single-token steps after the prompt."""
        from ai00_like.rwkv.batch import StepInput

        step = self.model.step
        self.model.reset(0)
        logits = step([StepInput(0, self.prompt, "last")])[0]
        logits = step([StepInput(0, [int(np.argmax(logits))], "last")])[0]  # warm
        t = time.perf_counter()
        for _ in range(tokens):
            logits = step([StepInput(0, [int(np.argmax(logits))], "last")])[0]
        return tokens / (time.perf_counter() - t)


class _TokenClock(StreamTail):
    """A StreamTail that also times the token events as they arrive: the first one's
    arrival, the last one's and how many came (no parsing beyond a count)."""

    def __init__(self, done: asyncio.Future):
        super().__init__(done)
        self.carry, self.count, self.first, self.last = b"", 0, 0.0, 0.0

    def data_received(self, data: bytes) -> None:
        now = time.perf_counter()
        seen = (self.carry + data).count(_TOKEN_MARK) - self.carry.count(_TOKEN_MARK)
        self.carry = data[-len(_TOKEN_MARK):]  # a mark split over two reads is counted once
        if seen:
            if not self.count:
                self.first = now
            self.count += seen
            self.last = now
        super().data_received(data)


async def _stream(port: int, tokens: int) -> tuple[float, int]:
    body = {"prompt": PROMPT, "max_tokens": tokens, "temperature": 0, "presence_penalty": 0, "frequency_penalty": 0}
    clock, reply = await stream_completion(port, body, _TokenClock, timeout=120)
    return (clock.count - 1) / (clock.last - clock.first), reply


def http_rate(port: int, tokens: int) -> tuple[float, int]:
    """(tokens/s after the first, the reply's length) of one streamed reply.

    The client reads on uvloop where it is installed, as the server does: on 2 cores it
    shares the server's machine, and asyncio's own loop cost it about 160 µs of CPU a token,
    a tenth of the demo model's step, counted against the server."""
    try:
        import uvloop
    except ImportError:
        return asyncio.run(_stream(port, tokens))
    with asyncio.Runner(loop_factory=uvloop.new_event_loop) as runner:
        return runner.run(_stream(port, tokens))
