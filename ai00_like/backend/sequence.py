"""One choice of one generate request, from the waiting queue through a slot to its end.

A Sequence keeps the generation's bookkeeping: which prompt tokens the slot's state
holds, what runs next, how many tokens it has made, and the text it has sent so far
(stop strings are cut there). The scheduler decides when it runs; the backend feeds it
the sampled tokens.
"""

from __future__ import annotations

import numpy as np

from ..messages import GenerateJob, TextPiece
from .state_cache import CacheEntry
from .textstream import TextStream


class Sequence:
    def __init__(self, job: GenerateJob, index: int):
        self.job, self.index = job, index
        self.sampler = job.samplers[index]
        self.prompt = list(job.tokens)
        self.sampler.read_prompt(self.prompt)  # the repetition penalty's window reaches into it
        self.fed: list[int] = []  # tokens whose effect the slot's state holds
        self.pending: list[int] = []  # tokens to run next
        self.logits: np.ndarray | None = None  # after `fed`, when `pending` is empty
        self.slot: int | None = None
        self.generated = 0
        self.last_token: int | None = None  # the latest sampled token: the model reads it next
        self.text = TextStream(job.stop)
        self.reservation: CacheEntry | None = None  # the prompt entry this sequence computes
        self.hit: CacheEntry | None = None  # set when admitted straight from a filled reservation
        self.tier = 0  # the next of the cache's tiers below memory to ask for a longer prefix
        self.hit_from = "memory"  # where `hit`'s state came from (the metrics count hits by tier)
        # Speculative decoding (speculation.py): the draft at the end of `pending`, the slot's
        # state and len(fed) from before the step that checks it, and the drafts' source.
        self.draft: list[int] = []
        self.snapshot: tuple | None = None
        self.drafter = None

    @property
    def decoding(self) -> bool:
        """Whether the prompt is read: what `pending` holds are sampled tokens (and a draft)."""
        return len(self.fed) >= len(self.prompt)

    @property
    def cancelled(self) -> bool:
        return self.job.cancel.cancelled

    def send(self, event) -> None:
        self.job.reply(event)

    def ran(self, chunk: list[int]) -> int:
        """`chunk` (the head of `pending`) went through the model; returns how many of its
        tokens were prompt tokens."""
        prompt_tokens = max(0, min(len(chunk), len(self.prompt) - len(self.fed)))
        self.fed.extend(chunk)
        del self.pending[: len(chunk)]
        return prompt_tokens

    def accept(self, token: int, token_bytes: bytes, logprob: tuple = (), top: tuple = ()) -> str | None:
        """Take one sampled token: send the text it completes and return why the sequence
        ends ("stop", "length"), or None when `token` is to be fed next."""
        self.generated += 1
        self.last_token = token
        if self.drafter is not None:
            self.drafter.extend((token,))
        if token == 0 and self.job.stop_on_eos:
            self._emit(self.text.finish(), ())
            return "stop"
        piece = self.text.push(token_bytes)
        self._emit(piece.text, (token,), logprob, top)
        if piece.stopped:
            return "stop"
        if self.sampler.grammar_complete:  # only end-of-text may follow: end now, not a token later
            self._emit(self.text.finish(), ())
            return "stop"
        if self.generated >= self.job.max_tokens:
            self._emit(self.text.finish(), ())
            return "length"
        self.pending = [token]
        return None

    def _emit(self, text: str, tokens: tuple, logprobs: tuple = (), top: tuple = ()) -> None:
        if text or tokens:
            self.send(TextPiece(self.index, text, tokens, logprobs, top))
