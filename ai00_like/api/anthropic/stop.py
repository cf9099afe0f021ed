"""Why a reply ended, as Anthropic says it: `stop_reason` and the `stop_sequence` that matched.

The backend ends a reply at a stop string without saying which (its Finished event says
"stop" for end-of-text, a complete grammar and a stop string alike). The reply's tokens
say it: the text they decode to runs on past the text that was sent by exactly the stop
string that cut it, so the request's stop sequence that this rest begins with is the one.
"""

from __future__ import annotations

from ..oai.generation import ChoiceResult
from .types import StopReason


def matched_stop(tokenizer, result: ChoiceResult, stops: tuple[str, ...]) -> str | None:
    """The stop sequence of `stops` that ended `result`, or None."""
    if tokenizer is None or not stops:
        return None
    sent = "".join(result.text).encode()
    rest = tokenizer.decode_bytes(result.tokens)[len(sent):].decode("utf-8", errors="replace")
    # Of two that end at the same place, the stream completes (and so stops at) the longer.
    return max((s for s in stops if rest.startswith(s)), key=len, default=None)


def stop_reason(result: ChoiceResult, *, calls: bool, stop_sequence: str | None) -> StopReason:
    if result.finish == "length":
        return "max_tokens"
    if calls:
        return "tool_use"
    return "stop_sequence" if stop_sequence is not None else "end_turn"
