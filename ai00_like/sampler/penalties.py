"""Ai00's repetition penalty with decay, for one request (ai00-reference §3.3).

The penalty of a token is subtracted from its logit before softmax. It grows when the
token appears and fades by `decay` every step, so a token used long ago is penalised less.
Applied by Nucleus and Typical; Mirostat has none.
"""

from __future__ import annotations

from collections.abc import Sequence

import msgspec
import numpy as np


class TokenCounts(msgspec.Struct, frozen=True):
    """How often each token occurred in a text, each occurrence weighted by `decay ** age`
    (0 for its last token): what Ai00's penalty init makes of the earlier assistant text.

    It is the whole of that text's effect on the penalties and no bigger than the number of
    distinct tokens, so a stored conversation keeps it instead of its text (`then` extends
    it by the next turn exactly as if the turns had been counted as one text)."""

    ids: tuple[int, ...] = ()  # ascending
    counts: tuple[float, ...] = ()

    @classmethod
    def of(cls, tokens: Sequence[int] | np.ndarray, decay: float) -> "TokenCounts":
        tokens = np.asarray(tokens, dtype=np.int64).reshape(-1)
        if not tokens.size:
            return cls()
        ages = np.arange(tokens.size - 1, -1, -1, dtype=np.float64)
        ids, where = np.unique(tokens, return_inverse=True)
        return cls(tuple(ids.tolist()), tuple(np.bincount(where, weights=np.power(decay, ages)).tolist()))

    def then(self, tokens: Sequence[int] | np.ndarray, decay: float) -> "TokenCounts":
        """The counts of this text followed by `tokens`."""
        later = TokenCounts.of(tokens, decay)
        if not self.ids:
            return later
        aged = np.asarray(self.counts) * decay ** len(tokens)
        ids = np.union1d(np.asarray(self.ids, dtype=np.int64), np.asarray(later.ids, dtype=np.int64))
        counts = np.zeros(ids.size)
        counts[np.searchsorted(ids, self.ids)] += aged
        counts[np.searchsorted(ids, later.ids)] += later.counts
        return TokenCounts(tuple(ids.tolist()), tuple(counts.tolist()))

    def to_bytes(self) -> bytes:
        return np.asarray(self.ids, "<u4").tobytes() + np.asarray(self.counts, "<f8").tobytes()

    @classmethod
    def from_bytes(cls, blob: bytes) -> "TokenCounts":
        n = len(blob) // 12
        return cls(tuple(np.frombuffer(blob, "<u4", n).tolist()), tuple(np.frombuffer(blob, "<f8", n, 4 * n).tolist()))


class PenaltyState:
    """The penalties of the tokens that have one, as sorted token ids and their values.

    Only tokens that appeared have a penalty, a few hundred at most against a vocabulary of
    65,536, so they are kept sparse: subtracting them touches those tokens only, and the
    compiled sampler reads each row of logits once, not a penalty row beside it. The values
    are kept as `unscaled` times a float `scale`, so the decay of every penalty at every
    step is one multiplication. A token once seen keeps its entry (Ai00 keeps a map and
    never removes entries, so it gets the frequency penalty forever after, however far its
    penalty has decayed).
    """

    __slots__ = ("presence", "frequency", "decay", "vocab_size", "ids", "unscaled", "scale")

    # Below this, `scale` is folded into `unscaled` before the floats lose precision.
    _SMALLEST_SCALE = 1e-20

    def __init__(
        self,
        presence: float,
        frequency: float,
        decay: float,
        vocab_size: int,
        model_tokens: Sequence[int] | np.ndarray | TokenCounts = (),
    ):
        self.presence = float(presence)
        self.frequency = float(frequency)
        self.decay = float(decay)
        self.vocab_size = vocab_size
        self.ids = np.zeros(0, dtype=np.int64)  # ascending
        self.unscaled = np.zeros(0, dtype=np.float32)
        self.scale = 1.0
        if not isinstance(model_tokens, TokenCounts):
            model_tokens = TokenCounts.of(model_tokens, self.decay)
        if model_tokens.ids:
            self._init_from(model_tokens)

    def _init_from(self, history: TokenCounts) -> None:
        """Ai00's `init(model_tokens)`: walk the text from its last token backwards with
        index i (0 for the last token); each token's penalty becomes (its current value, or
        `presence` if it has none) + `frequency * decay**i`.

        Summed up: presence once for every distinct token, plus frequency times the decayed
        count of its occurrences. Note that, unlike during generation, the presence part is
        not decayed and the first occurrence also earns the frequency part; that is Ai00's
        rule and we keep it.
        """
        ids = np.asarray(history.ids, dtype=np.int64)
        if ids[0] < 0 or ids[-1] >= self.vocab_size:
            raise ValueError(f"model token ids must be in [0, {self.vocab_size}), got {ids[0]}..{ids[-1]}")
        self.ids = ids
        self.unscaled = (self.presence + self.frequency * np.asarray(history.counts)).astype(np.float32)

    @property
    def active(self) -> bool:
        """False while no token has a penalty: nothing to subtract."""
        return bool(self.ids.size)

    def now(self) -> np.ndarray:
        """The current penalties of `ids` (float32)."""
        return self.unscaled * np.float32(self.scale)

    @property
    def values(self) -> np.ndarray:
        """Every token's penalty now, as a dense float32 [vocab] row."""
        dense = np.zeros(self.vocab_size, dtype=np.float32)
        dense[self.ids] = self.now()
        return dense

    @property
    def seen(self) -> np.ndarray:
        """Which tokens have a penalty, as a dense bool [vocab] row."""
        dense = np.zeros(self.vocab_size, dtype=bool)
        dense[self.ids] = True
        return dense

    def subtract_from(self, logits: np.ndarray, out: np.ndarray) -> None:
        """out = logits - penalties (`out` may be a row of a larger array)."""
        out[...] = logits
        if self.ids.size:
            out[self.ids] = logits[self.ids] - self.now()

    def accept(self, token: int) -> None:
        """After a token is generated: decay every penalty, then add `frequency` to the
        token if it already had a penalty, else set it to `presence`."""
        if self.ids.size and self.decay != 1.0:
            self.scale *= self.decay
            if self.scale < self._SMALLEST_SCALE:
                self.unscaled *= np.float32(self.scale)
                self.scale = 1.0
        at = int(np.searchsorted(self.ids, token))
        if at < self.ids.size and self.ids[at] == token:
            self.unscaled[at] += np.float32(self.frequency / self.scale)
        else:
            # (np.insert does the same at ten times the cost: this runs per row per step.)
            self.ids = np.concatenate((self.ids[:at], (token,), self.ids[at:])).astype(np.int64, copy=False)
            self.unscaled = np.concatenate(
                (self.unscaled[:at], (self.presence / self.scale,), self.unscaled[at:])).astype(np.float32, copy=False)

    def copy(self) -> "PenaltyState":
        twin = PenaltyState.__new__(PenaltyState)
        twin.presence, twin.frequency, twin.decay = self.presence, self.frequency, self.decay
        twin.vocab_size, twin.scale = self.vocab_size, self.scale
        twin.ids, twin.unscaled = self.ids.copy(), self.unscaled.copy()
        return twin
