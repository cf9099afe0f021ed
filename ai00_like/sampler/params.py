"""Sampling parameters: Ai00's tagged sampler JSON, plus the per-request OpenAI extras.

The three sampler structs decode exactly Ai00's JSON, an object internally tagged by
``"type"`` whose fields each default on their own::

    {"type": "Nucleus", "top_p": 0.5, "top_k": 128, "temperature": 1,
     "presence_penalty": 0.3, "frequency_penalty": 0.3, "penalty_decay": 0.99654026}

Every struct validates itself in ``__post_init__`` (which msgspec also runs when decoding),
so an invalid sampler cannot exist. Built in Python, a bad value raises `SamplerError`;
decoded from JSON, msgspec wraps that same message in a ``msgspec.ValidationError`` (also a
ValueError) and appends the JSON path, e.g. ``"top_p: must be in [0, 1], got 1.5 - at
`$.sampler`"``.
"""

from __future__ import annotations

import math
from typing import Any, Union

import msgspec

from .errors import SamplerError
from .repetition import DEFAULT_REPETITION_WINDOW, WHOLE_SEQUENCE

# 0.5 ** (1 / 200): penalties halve every 200 tokens. Ai00's default, to the digit.
DEFAULT_PENALTY_DECAY = 0.99654026

# OpenAI's own limits for these two request fields.
MAX_TOP_LOGPROBS = 20
MAX_ABS_LOGIT_BIAS = 100.0


def _check_finite(field: str, value: float) -> None:
    if not math.isfinite(value):
        raise SamplerError(field, f"must be a finite number, got {value!r}")


def _check_at_least(field: str, value: float, low: float) -> None:
    # `not (value >= low)` is also true for NaN, which must not slip through.
    if not (value >= low) or math.isinf(value):
        raise SamplerError(field, f"must be a finite number >= {low:g}, got {value!r}")


def _check_within(field: str, value: float, low: float, high: float) -> None:
    if not (low <= value <= high):
        raise SamplerError(field, f"must be in [{low:g}, {high:g}], got {value!r}")


def _check_cut_and_penalties(params: Nucleus | Typical) -> None:
    """The fields Nucleus and Typical share: the top-k cut, temperature and penalties."""
    _check_at_least("top_k", params.top_k, 0)
    _check_at_least("temperature", params.temperature, 0.0)
    # Negative penalties are allowed, as in OpenAI (-2..2): they encourage repetition.
    _check_finite("presence_penalty", params.presence_penalty)
    _check_finite("frequency_penalty", params.frequency_penalty)
    _check_within("penalty_decay", params.penalty_decay, 0.0, 1.0)


class Nucleus(msgspec.Struct, tag="Nucleus", tag_field="type", frozen=True):
    """Top-k, then top-p (keeping the token that crosses `top_p`), then temperature.

    `top_k` 0 means no limit. Greedy (argmax) when `temperature` is 0, `top_k` is 1 or
    `top_p` is 0.
    """

    top_p: float = 0.5
    top_k: int = 128
    temperature: float = 1.0
    presence_penalty: float = 0.3
    frequency_penalty: float = 0.3
    penalty_decay: float = DEFAULT_PENALTY_DECAY

    def __post_init__(self) -> None:
        _check_within("top_p", self.top_p, 0.0, 1.0)
        _check_cut_and_penalties(self)

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0 or self.top_k == 1 or self.top_p == 0


class Typical(msgspec.Struct, tag="Typical", tag_field="type", frozen=True):
    """Locally typical sampling: tokens ordered by how close their surprise is to the
    entropy, cut at `top_k` and at probability mass `tau`, then temperature.

    `top_k` 0 means no limit. Greedy (argmax) when `temperature` is 0.
    """

    tau: float = 0.5
    top_k: int = 128
    temperature: float = 1.0
    presence_penalty: float = 0.3
    frequency_penalty: float = 0.3
    penalty_decay: float = DEFAULT_PENALTY_DECAY

    def __post_init__(self) -> None:
        _check_within("tau", self.tau, 0.0, 1.0)
        _check_cut_and_penalties(self)

    @property
    def is_greedy(self) -> bool:
        return self.temperature == 0


# omit_defaults keeps the input-only alias `learning_rate` (always None once decoded) out
# of encoded output; decoding the output gives the same struct back.
class Mirostat(msgspec.Struct, tag="Mirostat", tag_field="type", frozen=True, omit_defaults=True):
    """Mirostat (v2-like): keeps the tokens whose surprise is below a running threshold
    that is steered towards the target surprise `tau` (bits) at step size `rate`.

    No penalties, no temperature, no top-k, as in Ai00. `learning_rate` is Ai00's alias of
    `rate`; when given it wins, and it reads None afterwards.
    """

    tau: float = 3.0
    rate: float = 0.1
    learning_rate: float | None = None

    def __post_init__(self) -> None:
        if self.learning_rate is not None:
            msgspec.structs.force_setattr(self, "rate", self.learning_rate)
            msgspec.structs.force_setattr(self, "learning_rate", None)
        _check_at_least("tau", self.tau, 0.0)
        _check_at_least("rate", self.rate, 0.0)

    @property
    def is_greedy(self) -> bool:
        return False


SamplerParams = Union[Nucleus, Typical, Mirostat]


class SamplingOptions(msgspec.Struct, frozen=True):
    """Everything that decides how one request picks its tokens.

    * `sampler`: the algorithm and its parameters (Ai00's tagged JSON).
    * `logit_bias`: token id -> value added to that token's logit before softmax, in
      [-100, 100] as in OpenAI. -100 is a hard ban (the token gets -inf, it can never be
      picked), +100 in practice forces the token.
    * `seed`: makes the request reproducible, whatever else shares its batch.
    * `logprobs` / `top_logprobs` (0-20): report the chosen token's log-probability and the
      `top_logprobs` most likely alternatives.
    * `grammar`: a compiled `grammar.Grammar` the output must follow, or None.
    * `repetition_penalty` / `repetition_window`: llama.cpp's multiplicative penalty
      (repetition.py) on the distinct tokens among the last `repetition_window` tokens of
      the sequence, prompt included (-1: all of it, 0: none). 1.0, the default, is off.
    """

    sampler: SamplerParams = msgspec.field(default_factory=Nucleus)
    logit_bias: dict[int, float] = msgspec.field(default_factory=dict)
    seed: int | None = None
    top_logprobs: int = 0
    logprobs: bool = False
    grammar: Any = None
    repetition_penalty: float = 1.0
    repetition_window: int = DEFAULT_REPETITION_WINDOW

    def __post_init__(self) -> None:
        for token, bias in self.logit_bias.items():
            if token < 0:
                raise SamplerError("logit_bias", f"token ids must be >= 0, got {token}")
            if not (-MAX_ABS_LOGIT_BIAS <= bias <= MAX_ABS_LOGIT_BIAS):
                raise SamplerError(
                    "logit_bias", f"bias of token {token} must be in [-100, 100], got {bias!r}"
                )
        _check_within("top_logprobs", self.top_logprobs, 0, MAX_TOP_LOGPROBS)
        # `not (x > 0)` is also true for NaN.
        if not (self.repetition_penalty > 0) or math.isinf(self.repetition_penalty):
            raise SamplerError("repetition_penalty", f"must be a finite number > 0, got {self.repetition_penalty!r}")
        if not isinstance(self.repetition_window, int) or self.repetition_window < WHOLE_SEQUENCE:
            raise SamplerError("repetition_window", "must be -1 (the whole sequence), 0 (off) or a token "
                                                    f"count, got {self.repetition_window!r}")

    @property
    def wants_logprobs(self) -> bool:
        return self.logprobs or self.top_logprobs > 0

    @property
    def penalises_repetition(self) -> bool:
        """The multiplicative repetition penalty changes anything."""
        return self.repetition_penalty != 1.0 and self.repetition_window != 0


# The flat OpenAI fields that can land on a sampler, in the order they are applied.
_FLAT_SAMPLER_FIELDS = (
    "temperature",
    "top_p",
    "top_k",
    "presence_penalty",
    "frequency_penalty",
    "penalty_decay",
)


# more than 12 parameters: one keyword-only parameter per wire field, which every caller names.
def options_from_openai(
    *,
    sampler: SamplerParams | None = None,
    temperature: float | None = None,
    top_p: float | None = None,
    top_k: int | None = None,
    presence_penalty: float | None = None,
    frequency_penalty: float | None = None,
    penalty_decay: float | None = None,
    logit_bias: dict[int, float] | None = None,
    seed: int | None = None,
    logprobs: bool | int | None = None,
    top_logprobs: int | None = None,
    repetition_penalty: float | None = None,
    repetition_window: int | None = None,
) -> SamplingOptions:
    """Build `SamplingOptions` from an OpenAI-style request that may also carry Ai00's
    tagged `sampler`.

    The merge rule:

    1. Start from `sampler` if the request gave one, else from ``Nucleus()``, i.e. Ai00's
       defaults (top_p 0.5, top_k 128, temperature 1, penalties 0.3/0.3, decay 0.99654026),
       not OpenAI's (top_p 1, no penalties).
    2. Every flat field the client gave (not None) replaces the field of the same name on
       that sampler, if the sampler has one; the client's explicit value beats both the
       tagged sampler's value and the default. A flat field the sampler does not have is
       ignored: `top_p` does not become Typical's `tau`, and Mirostat has no temperature,
       top_k or penalties at all.
    3. Fields nobody gave keep the sampler's own value (Ai00's default when it was not set).

    `logprobs` may be the chat form (bool) or the legacy completions form (an int n, which
    means "log-probabilities with the n best alternatives"); `top_logprobs` > 0 implies
    `logprobs` (OpenAI would reject it alone; we accept it). `repetition_penalty` and
    `repetition_window` apply whatever the sampler (not given: 1.0, which is off, and 64).
    Raises `SamplerError` naming the field when a value is out of range.
    """
    params = sampler if sampler is not None else Nucleus()
    given = {
        "temperature": temperature,
        "top_p": top_p,
        "top_k": top_k,
        "presence_penalty": presence_penalty,
        "frequency_penalty": frequency_penalty,
        "penalty_decay": penalty_decay,
    }
    own_fields = set(params.__struct_fields__)
    overrides = {
        name: given[name]
        for name in _FLAT_SAMPLER_FIELDS
        if given[name] is not None and name in own_fields
    }
    if overrides:
        # replace() runs __post_init__, so the merged sampler is validated as a whole.
        params = msgspec.structs.replace(params, **overrides)

    if isinstance(logprobs, bool) or logprobs is None:
        want_logprobs = bool(logprobs)
        n_top = top_logprobs or 0
    else:
        # Legacy /completions: `logprobs` is the number of alternatives (0-5).
        if logprobs < 0:
            raise SamplerError("logprobs", f"must be >= 0, got {logprobs}")
        want_logprobs = True
        n_top = top_logprobs if top_logprobs is not None else logprobs
    return SamplingOptions(
        sampler=params,
        logit_bias=_token_keyed(logit_bias or {}),
        seed=seed,
        top_logprobs=n_top,
        logprobs=want_logprobs or n_top > 0,
        repetition_penalty=1.0 if repetition_penalty is None else repetition_penalty,
        repetition_window=DEFAULT_REPETITION_WINDOW if repetition_window is None else repetition_window,
    )


def _token_keyed(logit_bias: dict) -> dict[int, float]:
    """OpenAI's wire form keys logit_bias by token ids written as strings; accept both."""
    out: dict[int, float] = {}
    for key, bias in logit_bias.items():
        try:
            token = int(key)
        except (TypeError, ValueError):
            raise SamplerError("logit_bias", f"keys must be token ids, got {key!r}") from None
        try:
            out[token] = float(bias)
        except (TypeError, ValueError):
            raise SamplerError("logit_bias", f"bias of token {key} must be a number, got {bias!r}") from None
    return out
