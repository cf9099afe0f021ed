"""Stored responses of the Responses API: their records and the RNN states they ended in."""

from __future__ import annotations

import logging

from ..config import Config
from .errors import StoreError, StoreUnavailable
from .records import ANONYMOUS, Caller, StoredResponse, key_owner
from .saved import SavedStateRecord, StoreFull
from .store import ResponseStore

__all__ = ["ANONYMOUS", "Caller", "ResponseStore", "SavedStateRecord", "StoreError", "StoreFull", "StoreUnavailable",
           "StoredResponse", "key_owner", "open_store"]

log = logging.getLogger(__name__)


def open_store(config: Config):
    """The store `[responses]` and `[store]` ask for (a ResponseStore or a RedisResponseStore,
    which have the same methods); None with `[responses] store = false`. StoreError when the
    embedded store cannot be opened (a damaged file, a read-only folder, another server on
    it): the caller stops or serves without it, as `[responses] required` says.

    A shared store that cannot be reached at start does not stop the server: the model is
    served all the same, the routes that need the store answer 503 until it is back."""
    if not config.responses.store:
        return None
    section = config.store
    if not section.url:
        section = config.responses
        return ResponseStore(config.resolve(section.path), max_state_bytes=section.max_state_bytes,
                             max_record_bytes=section.max_record_bytes, ttl=section.ttl)
    from .redis_store import RedisResponseStore  # one machine's server needs no Redis client

    store = RedisResponseStore(section.url, prefix=section.prefix, ttl=section.ttl)
    try:
        store.check()
    except StoreUnavailable as e:
        log.error("%s. Serving without it: stored responses and previous_response_id answer 503 until it is "
                  "reachable again ([store] url)", str(e).rstrip("."))
    else:
        log.info("stored responses go to %s (keys %s…, kept %d s after their last use)", store.where,
                 section.prefix, section.ttl)
    return store
