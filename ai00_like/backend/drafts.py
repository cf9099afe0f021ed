"""Prompt-lookup drafts for speculative decoding: the tokens that followed the last place
where the sequence's latest n tokens occurred before.

A reply that copies its input (code returned with one change, an answer quoting a
document, a rewrite) repeats long runs of the prompt; after its last few tokens the next
ones are likely those that followed them there. Such a draft costs no model: a dict from
each n-gram of the sequence to the latest place it ended. While the sequence goes on as a
draft's source did, the next draft goes on from there too (the source's n-grams may also
occur later, in a file of look-alike lines or in the reply itself, with other tokens after
them). The backend checks a draft in one pass of the model over the draft's tokens
(backend.py), which a memory-bound decoding step runs for little more than one token's
price.

Each sequence also keeps how often its drafts' tokens were the model's own (`chance`): a
token's chance of being accepted, counted with recent drafts weighing more. speculation.py
weighs it against what a draft costs the step. A sequence that stops drafting starts again
after a while, from the prior.
"""

from __future__ import annotations

from collections.abc import Sequence

NGRAMS = (3, 2)  # the longest match first: a longer context is a better guess
# Tokens without drafting once drafts do not pay, before trying again from the prior; each
# pause in a row without a draft token accepted in between twice as long, up to LONGEST_PAUSE.
PAUSE, LONGEST_PAUSE = 32, 1024
# The prior of a draft token's chance, as counts: where the last tokens occurred before, what
# followed is more often than not what follows (an optimistic start, so that drafts are tried).
PRIOR_ACCEPTED, PRIOR_FAILED = 2.0, 1.0
FORGET = 0.8  # each draft's weight against the one after it


class Drafter:
    """The drafts of one sequence: `extend` it with every token the model reads or will read
    (prompt, then each sampled token), `draft(k)` gives up to k tokens to check next."""

    def __init__(self, tokens: Sequence[int] = ()):
        self.tokens: list[int] = []
        self.ends: dict[tuple[int, ...], int] = {}  # n-gram → the latest position just after it
        self.accepted, self.failed = PRIOR_ACCEPTED, PRIOR_FAILED
        self.paused_until = 0
        self.pause_length = PAUSE
        self.source: tuple[int, int] | None = None  # (where the last draft came from, the length then)
        self.extend(tokens)

    def extend(self, tokens: Sequence[int]) -> None:
        for token in tokens:
            self.tokens.append(int(token))
            end = len(self.tokens)
            # The n-grams that end one token before the end: their next token is known.
            for n in NGRAMS:
                if end > n:
                    self.ends[tuple(self.tokens[end - 1 - n : end - 1])] = end - 1

    def draft(self, k: int) -> list[int]:
        """Up to k tokens: where the last draft's source goes on, or what followed the latest
        earlier occurrence of the last n tokens."""
        if k <= 0 or self.paused:
            return []
        start = self._followed()
        if start is None:
            start = self._looked_up()
        self.source = None if start is None else (start, len(self.tokens))
        return [] if start is None else self.tokens[start : start + k]

    def _followed(self) -> int | None:
        """Where the last draft's source goes on, if every token since was the source's."""
        if self.source is None:
            return None
        start, length = self.source
        since = self.tokens[length:]
        resume = start + len(since)
        if not since or resume >= len(self.tokens) or self.tokens[start:resume] != since:
            return None
        return resume

    def _looked_up(self) -> int | None:
        for n in NGRAMS:
            if len(self.tokens) >= n and (start := self.ends.get(tuple(self.tokens[-n:]))) is not None:
                return start
        return None

    @property
    def paused(self) -> bool:
        return len(self.tokens) < self.paused_until

    @property
    def chance(self) -> float:
        """A draft token's chance of being the model's own, after the ones before it were."""
        return self.accepted / (self.accepted + self.failed)

    def checked(self, drafted: int, accepted: int) -> None:
        """How a draft of `drafted` tokens fared: `accepted` of them were the model's own."""
        if drafted:
            self.accepted = self.accepted * FORGET + accepted
            self.failed = self.failed * FORGET + (accepted < drafted)
        if accepted:
            self.pause_length = PAUSE

    def pause(self) -> None:
        """No drafts for a while (they do not pay); then from the prior again."""
        self.paused_until = len(self.tokens) + self.pause_length
        self.pause_length = min(2 * self.pause_length, LONGEST_PAUSE)
        self.accepted, self.failed = PRIOR_ACCEPTED, PRIOR_FAILED
