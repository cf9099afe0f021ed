"""Ai00's repetition penalty with decay, for one request (ai00-reference §3.3).

The penalty of a token is subtracted from its logit before softmax. It grows when the
token appears and fades by `decay` every step, so a token used long ago is penalised less.
Applied by Nucleus and Typical; Mirostat has none.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


class PenaltyState:
    """The penalty of every token of the vocabulary, as a dense float32 row.

    A dense row costs one extra pass over the vocabulary per step but makes subtracting it
    from the logits part of the copy the sampler makes anyway; `seen` records which tokens
    "have a penalty" (Ai00 keeps a map and never removes entries, so a token once seen gets
    the frequency penalty forever after, however far its penalty has decayed).
    """

    __slots__ = ("presence", "frequency", "decay", "values", "seen", "active")

    def __init__(
        self,
        presence: float,
        frequency: float,
        decay: float,
        vocab_size: int,
        model_tokens: Sequence[int] | np.ndarray = (),
    ):
        self.presence = float(presence)
        self.frequency = float(frequency)
        self.decay = float(decay)
        self.values = np.zeros(vocab_size, dtype=np.float32)
        self.seen = np.zeros(vocab_size, dtype=bool)
        # False while every value is zero: then there is nothing to subtract or decay.
        self.active = False
        tokens = np.asarray(model_tokens, dtype=np.int64).reshape(-1)
        if tokens.size:
            self._init_from(tokens)

    def _init_from(self, tokens: np.ndarray) -> None:
        """Ai00's `init(model_tokens)`: walk the text from its last token backwards with
        index i (0 for the last token); each token's penalty becomes (its current value, or
        `presence` if it has none) + `frequency * decay**i`.

        Summed up: presence once for every distinct token, plus frequency times the decayed
        count of its occurrences. Note that, unlike during generation, the presence part is
        not decayed and the first occurrence also earns the frequency part; that is Ai00's
        rule and we keep it.
        """
        vocab_size = self.values.shape[0]
        if tokens.min() < 0 or tokens.max() >= vocab_size:
            raise ValueError(f"model token ids must be in [0, {vocab_size}), got {tokens.min()}..{tokens.max()}")
        ages = np.arange(tokens.size - 1, -1, -1, dtype=np.float64)
        decayed = self.frequency * np.power(self.decay, ages)
        frequency_part = np.bincount(tokens, weights=decayed, minlength=vocab_size)
        self.seen = np.bincount(tokens, minlength=vocab_size) > 0
        self.values = np.where(self.seen, self.presence + frequency_part, 0.0).astype(np.float32)
        self.active = True

    def subtract_from(self, logits: np.ndarray, out: np.ndarray) -> None:
        """out = logits - penalties (one pass; `out` may be a row of a larger array)."""
        if self.active:
            np.subtract(logits, self.values, out=out)
        else:
            out[...] = logits

    def accept(self, token: int) -> None:
        """After a token is generated: decay every penalty, then add `frequency` to the
        token if it already had a penalty, else set it to `presence`."""
        if self.active and self.decay != 1.0:
            self.values *= self.decay
        if self.seen[token]:
            self.values[token] += self.frequency
        else:
            self.values[token] = self.presence
            self.seen[token] = True
        self.active = True

    def copy(self) -> "PenaltyState":
        twin = PenaltyState.__new__(PenaltyState)
        twin.presence, twin.frequency, twin.decay = self.presence, self.frequency, self.decay
        twin.values = self.values.copy()
        twin.seen = self.seen.copy()
        twin.active = self.active
        return twin
