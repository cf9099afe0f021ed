"""The multiplicative repetition penalty of llama.cpp and Ollama (`repeat_penalty`,
`repeat_last_n`), vLLM's `repetition_penalty`, for one request.

Every distinct token among the last `window` tokens of the sequence (the prompt's tail
included: the backend hands it over before the first step) has its logit l made
l / penalty when l > 0, else l * penalty: a penalty above 1 makes those tokens less
likely whatever the sign of their logit. A token counts once however often it occurs;
counting occurrences is what the additive frequency penalty (penalties.py) is for.
"""

from __future__ import annotations

import copy
from collections import deque
from collections.abc import Sequence

import numpy as np

# Ollama's default `repeat_last_n`; -1 means the whole sequence, 0 turns the penalty off.
DEFAULT_REPETITION_WINDOW = 64
WHOLE_SEQUENCE = -1


class RecentTokens:
    """The distinct tokens among the last `window` tokens (all of them when the window is
    -1), with how often each occurs there, so that the oldest can drop out in O(1)."""

    __slots__ = ("window", "ring", "counts")

    def __init__(self, window: int):
        self.window = window
        # The whole sequence needs no ring: nothing ever leaves it.
        self.ring: deque[int] | None = deque(maxlen=window) if window > 0 else None
        self.counts: dict[int, int] = {}

    def extend(self, tokens: Sequence[int] | np.ndarray) -> None:
        if self.ring is None:
            # A prompt may be long: count its distinct ids at once, not token by token.
            for token in np.unique(np.asarray(tokens, dtype=np.int64)).tolist():
                self.counts[token] = self.counts.get(token, 0) + 1
            return
        for token in list(tokens)[-self.window:]:
            self.push(int(token))

    def push(self, token: int) -> None:
        ring = self.ring
        if ring is not None and len(ring) == ring.maxlen:
            oldest = ring[0]
            left = self.counts[oldest] - 1
            if left:
                self.counts[oldest] = left
            else:
                del self.counts[oldest]
        if ring is not None:
            ring.append(token)
        self.counts[token] = self.counts.get(token, 0) + 1

    def ids(self) -> np.ndarray:
        return np.fromiter(self.counts, dtype=np.int64, count=len(self.counts))

    def copy(self) -> "RecentTokens":
        twin = RecentTokens.__new__(RecentTokens)
        twin.window, twin.ring, twin.counts = self.window, copy.copy(self.ring), dict(self.counts)
        return twin


class RepetitionPenalty:
    """One request's multiplicative penalty: `penalty` (> 0, not 1) over `window` tokens."""

    __slots__ = ("penalty", "recent", "vocab_size")

    def __init__(self, penalty: float, window: int, vocab_size: int):
        self.penalty = np.float32(penalty)
        self.recent = RecentTokens(window)
        self.vocab_size = vocab_size

    def read_prompt(self, tokens: Sequence[int] | np.ndarray) -> None:
        """The prompt's tokens, read before the first step: its tail counts as recent."""
        self.recent.extend(tokens)

    def accept(self, token: int) -> None:
        self.recent.push(token)

    def apply(self, out: np.ndarray) -> None:
        """Penalise, in place, the logits of `out` (a [vocab] row) of the recent tokens."""
        ids = self.recent.ids()
        if not ids.size:
            return
        ids = ids[ids < self.vocab_size]  # a prompt id the row has no logit for cannot repeat
        values = out[ids]
        out[ids] = np.where(values > 0, values / self.penalty, values * self.penalty)

    def copy(self) -> "RepetitionPenalty":
        twin = RepetitionPenalty.__new__(RepetitionPenalty)
        twin.penalty, twin.vocab_size, twin.recent = self.penalty, self.vocab_size, self.recent.copy()
        return twin
