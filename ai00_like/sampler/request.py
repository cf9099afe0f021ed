"""One request's sampler: its options plus the state that changes as it generates."""

from __future__ import annotations

import copy
from collections.abc import Sequence

import numpy as np

from .errors import SamplerError
from .fused import MAX_TOP_K
from .params import MAX_ABS_LOGIT_BIAS, Mirostat, Nucleus, SamplingOptions
from .penalties import PenaltyState, TokenCounts
from .repetition import RepetitionPenalty


class RequestSampler:
    """The mutable sampling state of one request (one choice when n > 1).

    * `penalties`: Ai00's decaying repetition penalty (None for Mirostat, or when both
      penalties are 0), started from `model_tokens` (the earlier assistant text, in chat),
      or from a stored conversation's `TokenCounts` of it.
    * `repetition`: the multiplicative repetition penalty over the last tokens (None when
      it is off), which reads the prompt's tail through `read_prompt`.
    * its own random generator: seeded from `options.seed` when given, so the request draws
      the same numbers whatever else is in the batch. Each sampled token consumes exactly
      one uniform draw.
    * `max_surprise`: Mirostat's running threshold (None for the other samplers).
    * `allowed`: an optional boolean [vocab] mask a grammar engine may set before each step;
      disallowed tokens get -inf before sampling. None means every token is allowed.

    `sample_batch` reads and updates this state; `accept` is for tokens that enter the
    text without being sampled here.
    """

    def __init__(
        self,
        options: SamplingOptions,
        vocab_size: int,
        model_tokens: Sequence[int] | np.ndarray | TokenCounts = (),
        *,
        choice_index: int = 0,
    ):
        if vocab_size <= 0:
            raise ValueError(f"vocab_size must be positive, got {vocab_size}")
        self.options = options
        self.params = options.sampler
        self.vocab_size = vocab_size
        self.choice_index = choice_index
        self.allowed: np.ndarray | None = None
        # The grammar the output must follow (response_format, bnf_schema, tools): its mask
        # joins `allowed` each step, and each recorded token advances it.
        self.constraint = options.grammar.start() if options.grammar is not None else None
        self.steps = 0

        params = self.params
        self.penalties: PenaltyState | None = None
        self.max_surprise: float | None = None
        if isinstance(params, Mirostat):
            self.max_surprise = 2.0 * params.tau
        elif params.presence_penalty != 0 or params.frequency_penalty != 0:
            self.penalties = PenaltyState(
                params.presence_penalty,
                params.frequency_penalty,
                params.penalty_decay,
                vocab_size,
                model_tokens,
            )
        self.repetition: RepetitionPenalty | None = None
        if options.penalises_repetition:
            self.repetition = RepetitionPenalty(options.repetition_penalty, options.repetition_window, vocab_size)

        self._bias_ids, self._bias_values = _bias_arrays(options.logit_bias, vocab_size)
        # The seed material is kept so clones can derive their own streams from it. Without
        # a seed, SeedSequence draws fresh entropy from the OS.
        self._entropy = np.random.SeedSequence(_seed_entropy(options.seed)).entropy
        self._rng = _generator(self._entropy, choice_index)

    # ---- what sample_batch uses -------------------------------------------------------

    @property
    def kind(self) -> str:
        """Which algorithm picks this request's tokens: "greedy" (argmax), or the sampler's
        type name ("Nucleus", "Typical", "Mirostat")."""
        return "greedy" if self.params.is_greedy else type(self.params).__name__

    def prepare_logits(self, logits: np.ndarray, out: np.ndarray) -> None:
        """out = logits, repetition penalised, minus penalties, disallowed tokens -inf, plus
        logit_bias."""
        if self.repetition is not None:
            # llama.cpp's order: the multiplicative penalty, then the additive ones.
            out[...] = logits
            self.repetition.apply(out)
            logits = out
        if self.penalties is not None:
            self.penalties.subtract_from(logits, out)
        elif self.repetition is None:
            out[...] = logits
        if self.allowed is not None:
            if self.allowed.shape != (self.vocab_size,):
                raise ValueError(f"allowed mask has shape {self.allowed.shape}, expected ({self.vocab_size},)")
            np.copyto(out, -np.inf, where=~self.allowed)
        if self.constraint is not None:
            np.copyto(out, -np.inf, where=~self.constraint.allowed())
        if self._bias_ids.size:
            out[self._bias_ids] += self._bias_values
            if self.constraint is not None and out.max() == -np.inf:
                # logit_bias banned every token the grammar allows: end the reply rather than
                # let the sampler's fallback pick a token outside the grammar.
                out[0] = 0.0

    def fused_top_k(self) -> int:
        """The top_k the compiled sampler (fused.py) runs this row with: 1 for greedy, the
        Nucleus top_k when it is at most fused.MAX_TOP_K; 0 when the row needs the numpy
        path (another sampler, a mask, a grammar, logit_bias, logprobs or the multiplicative
        repetition penalty)."""
        if self.allowed is not None or self.constraint is not None or self._bias_ids.size:
            return 0
        if self.repetition is not None:
            return 0
        if self.options.wants_logprobs:
            return 0
        if self.params.is_greedy:
            return 1
        if isinstance(self.params, Nucleus) and 1 < self.params.top_k <= MAX_TOP_K:
            return self.params.top_k
        return 0

    def next_uniform(self) -> float:
        self.steps += 1
        return float(self._rng.random())

    def record(self, token: int, surprise: float | None) -> None:
        """Update the state after sample_batch picked `token`."""
        self.accept(token)
        if self.max_surprise is not None and surprise is not None:
            params = self.params
            error = surprise - params.tau
            self.max_surprise = min(self.max_surprise - params.rate * error, 4.0 * params.tau)

    # ---- public ------------------------------------------------------------------------

    def read_prompt(self, tokens: Sequence[int] | np.ndarray) -> None:
        """The tokens the model reads before this request's first step: what the
        multiplicative repetition penalty counts besides the reply (llama.cpp counts the
        prompt's tail too). Ai00's penalties start from `model_tokens` instead."""
        if self.repetition is not None:
            self.repetition.read_prompt(tokens)

    def accept(self, token: int) -> None:
        """A token joined the text (sampled, or forced by the caller): update penalties."""
        if self.penalties is not None:
            self.penalties.accept(int(token))
        if self.repetition is not None:
            self.repetition.accept(int(token))
        if self.constraint is not None:
            self.constraint.advance(int(token))

    @property
    def grammar_complete(self) -> bool:
        """The output's grammar allows only end-of-text now."""
        return self.constraint is not None and self.constraint.complete

    def clone(self, index: int) -> "RequestSampler":
        """A copy for choice `index` of an n > 1 request.

        Penalties, Mirostat's threshold and the mask are copied. The random stream is the
        one that belongs to (seed, `index`), at the same position as this sampler's: so a
        seeded request's choice i is the same whether it was built directly or cloned, and
        clone(self.choice_index) continues exactly like this sampler.
        """
        twin = copy.copy(self)
        twin.choice_index = index
        if self.penalties is not None:
            twin.penalties = self.penalties.copy()
        if self.repetition is not None:
            twin.repetition = self.repetition.copy()
        if self.allowed is not None:
            twin.allowed = self.allowed.copy()
        if self.constraint is not None:
            twin.constraint = self.constraint.clone()
        if index == self.choice_index:
            twin._rng = copy.deepcopy(self._rng)
        else:
            twin._rng = _generator(self._entropy, index)
            # One uniform double consumes one 64-bit output of PCG64.
            twin._rng.bit_generator.advance(self.steps)
        return twin


def _seed_entropy(seed: int | None) -> int | None:
    if seed is None:
        return None
    # SeedSequence takes non-negative integers; OpenAI seeds may be negative.
    return seed if seed >= 0 else seed % (1 << 64)


def _generator(entropy: int, choice_index: int) -> np.random.Generator:
    # Choice 0 uses the seed's own stream, so n = 1 and the first of n > 1 agree.
    spawn_key = (choice_index,) if choice_index else ()
    return np.random.Generator(np.random.PCG64(np.random.SeedSequence(entropy, spawn_key=spawn_key)))


def _bias_arrays(logit_bias: dict[int, float], vocab_size: int) -> tuple[np.ndarray, np.ndarray]:
    if not logit_bias:
        return np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.float32)
    ids = np.fromiter(logit_bias.keys(), dtype=np.int64, count=len(logit_bias))
    values = np.fromiter(logit_bias.values(), dtype=np.float32, count=len(logit_bias))
    outside = ids[ids >= vocab_size]
    if outside.size:
        raise SamplerError(
            "logit_bias", f"token id {int(outside[0])} is outside the vocabulary (0..{vocab_size - 1})"
        )
    # -100 is a ban, as OpenAI documents: make it exact, not just very unlikely.
    values[values <= -MAX_ABS_LOGIT_BIAS] = -np.inf
    return ids, values
