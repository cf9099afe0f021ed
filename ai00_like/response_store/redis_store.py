"""Stored responses in Redis or Valkey, shared by every replica behind a load balancer.

The same methods as the embedded store (store.py), so the routes do not know which one
they use. A record is msgpack under `{prefix}response:{id}`, its state a blob that names
its model (state_blob.py) under `{prefix}state:{id}`. Both carry the TTL, and reading a
response refreshes it on both. There is no cap in bytes: the TTL and Redis's own
`maxmemory` policy bound the store. When the policy drops a state and keeps its record,
a continuation rebuilds the state from the stored tokens, as after the embedded store's cap.

Records reference their conversation's earlier responses (records.py); storing one
refreshes the TTL of those too, so a conversation in use keeps all of its turns.

A state and its record are written in one MULTI/EXEC, the state first: no replica ever
reads a record whose state is not there yet. Each call is one round trip (a few MB for a
state) and blocks, so the routes make it off the event loop. Any Redis failure is raised as
StoreUnavailable naming the store, and the routes answer 503. redis-py reconnects by itself
at the next call, so a Redis that comes back is used again without a restart.
"""

from __future__ import annotations

import logging
from contextlib import contextmanager
from urllib.parse import urlsplit

import msgspec
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from ..rwkv.state import State
from .errors import StoreUnavailable
from .redis_saved import RedisSavedStates
from .state_blob import decode_state, encode_state
from .records import ID, Caller, StoredResponse, conversation_tokens

log = logging.getLogger(__name__)

CONNECT_TIMEOUT = 2.0  # s: an unreachable store should cost a request little before its 503
IO_TIMEOUT = 30.0  # s: a large model's state is tens of MB


def redacted(url: str) -> str:
    """The URL without its user and password, for messages and logs."""
    parts = urlsplit(url)
    port = f":{parts.port}" if parts.port else ""
    return f"{parts.scheme}://{parts.hostname}{port}{parts.path}"


class RedisResponseStore:
    def __init__(self, url: str, *, prefix: str, ttl: int):
        self.where, self.prefix, self.ttl = redacted(url), prefix, ttl
        # One retry, at once: after Redis restarts, the first call meets a pooled connection
        # that is dead, and the retry opens a new one instead of failing the request.
        self.redis = redis.Redis.from_url(url, socket_connect_timeout=CONNECT_TIMEOUT, socket_timeout=IO_TIMEOUT,
                                          retry=Retry(NoBackoff(), 1))
        self._records = msgspec.msgpack.Encoder()
        self._decode = msgspec.msgpack.Decoder(StoredResponse).decode
        self.saved = RedisSavedStates(self.redis, prefix, self._reachable)  # kept until deleted: no TTL

    def _key(self, kind: str, response_id: str) -> str:
        return f"{self.prefix}{kind}:{response_id}"

    @contextmanager
    def _reachable(self):
        try:
            yield
        except redis.RedisError as e:
            raise StoreUnavailable(f"The response store ({self.where}) is unavailable: {e}") from None

    def check(self) -> None:
        """Raises StoreUnavailable when the store cannot be reached."""
        with self._reachable():
            self.redis.ping()

    # ------------------------------------------------------------------ reading

    def get(self, response_id: str, caller: Caller, *, touch: bool = True) -> StoredResponse | None:
        """The record, if it is there and `caller` may see it."""
        if not ID.fullmatch(response_id):
            return None
        key = self._key("response", response_id)
        with self._reachable():
            record = self._decoded(key, self.redis.get(key))
            if record is None or not record.visible_to(caller):
                return None
            if touch:
                self.redis.pipeline(transaction=False).expire(key, self.ttl).expire(
                    self._key("state", response_id), self.ttl).execute()
        return record

    def conversation(self, record: StoredResponse) -> tuple[int, ...] | None:
        """The whole conversation's tokens up to `record`; None when an earlier response of
        it was deleted or has expired."""
        if not record.ancestors:
            return record.tokens
        keys = [self._key("response", a) for a in record.ancestors]
        with self._reachable():
            blobs = self.redis.mget(keys)
        return conversation_tokens([self._decoded(k, b) for k, b in zip(keys, blobs)] + [record])

    def _decoded(self, key: str, blob: bytes | None) -> StoredResponse | None:
        if blob is None:
            return None
        try:
            return self._decode(blob)
        except msgspec.DecodeError:
            log.warning("%s holds a damaged record under %s; treated as absent", self.where, key)
            return None

    def state(self, response_id: str, fingerprint: str) -> State | None:
        """The RNN state a stored response ended in, if it is there and of the model
        `fingerprint` names; None otherwise (the caller then reads the stored tokens again)."""
        if not ID.fullmatch(response_id):
            return None
        key = self._key("state", response_id)
        with self._reachable():
            blob = self.redis.get(key)
        if blob is None:
            return None
        try:
            return decode_state(blob, fingerprint)
        except ValueError as e:
            log.warning("%s holds a damaged state under %s (%s); the conversation is read again", self.where, key, e)
            return None

    # ------------------------------------------------------------------ writing

    def put(self, record: StoredResponse, state: State | None) -> None:
        state_key, record_key = self._key("state", record.id), self._key("response", record.id)
        record = msgspec.structs.replace(record, has_state=state is not None)
        pipe = self.redis.pipeline(transaction=True)
        if state is None:
            pipe.delete(state_key)  # a record stored again without its state must not keep an old one
        else:
            pipe.set(state_key, encode_state(state, record.fingerprint), ex=self.ttl)
        pipe.set(record_key, self._records.encode(record), ex=self.ttl)
        for earlier in record.ancestors:
            pipe.expire(self._key("response", earlier), self.ttl).expire(self._key("state", earlier), self.ttl)
        with self._reachable():
            pipe.execute()

    def delete(self, response_id: str, caller: Caller) -> bool:
        if self.get(response_id, caller, touch=False) is None:
            return False
        pipe = self.redis.pipeline(transaction=True)
        pipe.delete(self._key("response", response_id)).delete(self._key("state", response_id))
        with self._reachable():
            deleted, _ = pipe.execute()
        return deleted > 0

    def close(self) -> None:
        self.redis.close()
