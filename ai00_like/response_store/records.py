"""What a stored response is, whose it is, and how much of the conversation it holds.

A record holds only its own turn: the tokens the model read since its previous response
ended, and the ids of the responses before it (`ancestors`). The whole conversation's
tokens are its ancestors' tokens followed by its own, so 200 turns of a long conversation
cost 200 turns' tokens, and deleting a response deletes its text: no later record holds a
copy of it. What the earlier assistant turns did to the repetition penalties is kept as
their decayed token counts (`history`), bounded by the number of distinct tokens.
"""

from __future__ import annotations

import hashlib
import re
from typing import NamedTuple

import msgspec
import numpy as np

ID = re.compile(r"[A-Za-z0-9_]{1,128}")  # ours are resp_<hex>; anything else names no stored response
ANONYMOUS = "anonymous"  # the owner of everything stored while no API keys are set


class Caller(NamedTuple):
    """Who asks: the owner their records get, and whether they may see everyone's."""

    owner: str = ANONYMOUS
    sees_all: bool = False  # the admin key


def key_owner(key: str) -> str:
    """The owner name of an API key: a digest, so the store never holds the key itself."""
    return "key:" + hashlib.sha256(key.encode("utf-8", "surrogateescape")).hexdigest()[:32]


class StoredResponse(msgspec.Struct, kw_only=True):
    """A record: JSON bodies as bytes, token ids as tuples."""

    id: str
    model: str
    fingerprint: str  # the weights and settings that made it (identity.fingerprint)
    created: int
    response: bytes  # the Response object, as GET returns it
    input_items: bytes  # a JSON list of the input items, as GET …/input_items returns them
    tools: bytes  # the tools offered, as JSON
    tokens: tuple[int, ...]  # this turn's tokens the state holds, after its ancestors'
    tail: tuple[int, ...]  # tokens generated after them, not yet read by the model
    owner: str = ANONYMOUS
    ancestors: tuple[str, ...] = ()  # the conversation's earlier responses, oldest first
    history: bytes = b""  # TokenCounts of the conversation's assistant turns, as bytes
    has_state: bool = False

    def visible_to(self, caller: Caller) -> bool:
        return caller.sees_all or self.owner == caller.owner

    @property
    def size(self) -> int:
        """The bytes the record takes, for the store's cap."""
        return (len(self.response) + len(self.input_items) + len(self.tools) + 4 * (len(self.tokens) + len(self.tail))
                + len(self.history) + sum(len(a) + 1 for a in self.ancestors))


def conversation_tokens(chain: list[StoredResponse | None]) -> tuple[int, ...] | None:
    """The tokens of a conversation from its records, oldest first; None when one is gone."""
    if any(record is None for record in chain):
        return None
    return tuple(t for record in chain for t in record.tokens)


def ids_of(blob: bytes) -> tuple[int, ...]:
    return tuple(np.frombuffer(blob, dtype="<u4").tolist())


def blob_of(ids: tuple[int, ...]) -> bytes:
    return np.asarray(ids, dtype="<u4").tobytes()
