"""The one error a user can cause with sampling parameters."""

from __future__ import annotations


class SamplerError(ValueError):
    """A sampling parameter that is out of range or otherwise unusable.

    `field` names the offending parameter (e.g. ``"top_p"``, ``"logit_bias"``) so the HTTP
    tier can put it in the OpenAI error envelope's ``param``; the message names it too, so
    the text alone is a complete answer to the user.
    """

    def __init__(self, field: str, problem: str):
        self.field = field
        self.problem = problem
        super().__init__(f"{field}: {problem}")
