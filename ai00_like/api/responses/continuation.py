"""Where a Responses request's conversation picks up, and what its record keeps.

A request with `previous_response_id` renders only its own input, as the next turn, read
from the RNN state the previous response ended in; when that state is gone (dropped by the
store's cap, or made by other weights under the same model name) the conversation's stored
tokens are read again first, and the reply is the same either way.

The repetition penalties start where an explicit history would start them: chat seeds them
with the earlier assistant turns, so a stored response keeps the decayed token counts of
its conversation's assistant turns (`TokenCounts`) and a continuation starts from them. A
continued reply then equals the reply to the same conversation sent in full.
"""

from __future__ import annotations

import msgspec

from ...response_store import Caller, StoredResponse
from ...sampler import SamplingOptions, TokenCounts
from ...sampler.params import DEFAULT_PENALTY_DECAY
from ..errors import ApiError, bad_request
from ...identity import fingerprint
from ..oai.prompt import DEFAULT_TEMPLATE, assistant_turns
from .items import read_input

TURN_END = b"\n\n"


def not_found(response_id: str, param: str | None = None) -> ApiError:
    return ApiError(404, f"No response found with id '{response_id}'.", type="invalid_request_error",
                    param=param, code="not_found")


class Continuation(msgspec.Struct):
    """The previous response, its state, and the conversation's tokens when they must be
    read again (no state)."""

    previous: StoredResponse | None = None
    state: object = None  # the RNN state after the conversation, or None to read it again
    conversation: tuple[int, ...] = ()  # its tokens, when state is None
    announce_tools: bool = True

    def prompt(self, rendered: str, tokenizer) -> tuple[str, tuple[int, ...]]:
        """(the text the model reads, the token ids it reads first)."""
        previous = self.previous
        if previous is None:
            return rendered, ()
        last = b"".join(tokenizer.token_bytes(t) for t in (previous.tokens[-4:] + previous.tail))
        text = rendered if last.endswith(TURN_END) else "\n\n" + rendered
        return text, previous.tail if self.state is not None else self.conversation + previous.tail

    def record(self, own: StoredResponse, fed: tuple[int, ...]) -> StoredResponse:
        """`own` (this turn's record) with its tokens and its place in the conversation."""
        previous = self.previous
        skip = len(self.conversation) if previous is not None and self.state is None else 0
        ancestors = previous.ancestors + (previous.id,) if previous is not None else ()
        return msgspec.structs.replace(own, tokens=fed[skip:], ancestors=ancestors)


async def find(store, ask, previous_id: str, *, caller: Caller, model, tools: bytes) -> Continuation:
    """The continuation of `previous_id` for `caller` (404 for another owner's response) on
    `model`, with `ask(method, *args)` calling the store off the event loop."""
    previous = await ask(store.get, previous_id, caller)
    if previous is None:
        raise not_found(previous_id, "previous_response_id")
    if previous.model != model.name:
        raise bad_request(f"previous_response_id '{previous.id}' is a response of model '{previous.model}'; this "
                          f"server serves '{model.name}'", "previous_response_id")
    state = await ask(store.state, previous.id, fingerprint(model)) if previous.has_state else None
    conversation = ()
    if state is None:
        conversation = await ask(store.conversation, previous)
        if conversation is None:
            raise bad_request(f"previous_response_id '{previous.id}' can no longer be continued: an earlier "
                              "response of its conversation was deleted or has expired, and its own state is gone; "
                              "send the conversation as input instead", "previous_response_id",
                              code="conversation_incomplete")
    return Continuation(previous, state, conversation, announce_tools=previous.tools != tools)


def penalty_seed(previous: StoredResponse | None, messages: list, options: SamplingOptions,
                 tokenizer) -> TokenCounts:
    """The penalties' starting counts: the stored conversation's, then this input's own
    assistant turns, as chat would count them in one text."""
    earlier = TokenCounts.from_bytes(previous.history) if previous is not None else TokenCounts()
    return then_turns(earlier, assistant_turns(messages), options, tokenizer)


def after_reply(seed: TokenCounts, output: list, options: SamplingOptions, tokenizer) -> TokenCounts:
    """The counts a stored response keeps: its seed, then its reply's assistant turn as a
    client sending the conversation back would give it (thinking left out)."""
    items = [item for item in msgspec.to_builtins(output) if item.get("type") in ("message", "function_call")]
    messages = read_input(items)[0] if items else []
    return then_turns(seed, assistant_turns(messages), options, tokenizer)


def then_turns(counts: TokenCounts, turns: list[str], options: SamplingOptions, tokenizer) -> TokenCounts:
    if not turns:
        return counts
    sep = DEFAULT_TEMPLATE.sep
    text = (sep if counts.ids else "") + sep.join(turns)
    # Counts made with one decay serve a later turn whatever decay it asks for: the seed is
    # a starting point, and the tokens themselves are not kept to count again.
    decay = getattr(options.sampler, "penalty_decay", DEFAULT_PENALTY_DECAY)
    return counts.then(tokenizer.encode(text), decay)
