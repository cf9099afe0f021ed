"""Saved states (saved.py) in Redis or Valkey, shared by every replica.

A record is msgpack under `{prefix}saved:{id}`, its state blob (state_blob.py) under
`{prefix}saved_state:{id}`, and each owner's ids are the set `{prefix}saved_by:{owner}`.
None of them has a TTL: a saved state is kept until it is deleted (a `maxmemory-policy`
of `allkeys-*` could still evict them; `volatile-*` and `noeviction` never do). The blob
and record are written in one MULTI/EXEC, the blob first.
"""

from __future__ import annotations

import time

import msgspec

from ..rwkv.state import State
from .records import ID, Caller
from .saved import SavedStateRecord
from .state_blob import decode_state, encode_state


class RedisSavedStates:
    def __init__(self, client, prefix: str, reachable):
        self.redis, self.prefix, self._reachable = client, prefix, reachable
        self._encode = msgspec.msgpack.Encoder().encode
        self._decode = msgspec.msgpack.Decoder(SavedStateRecord).decode

    def _key(self, kind: str, name: str) -> str:
        return f"{self.prefix}{kind}:{name}"

    def _decoded(self, blob: bytes | None) -> SavedStateRecord | None:
        try:
            return self._decode(blob) if blob is not None else None
        except msgspec.DecodeError:
            return None

    def get(self, state_id: str, caller: Caller) -> SavedStateRecord | None:
        if not ID.fullmatch(state_id):
            return None
        with self._reachable():
            record = self._decoded(self.redis.get(self._key("saved", state_id)))
        return record if record is not None and record.visible_to(caller) else None

    def list(self, caller: Caller) -> list[SavedStateRecord]:
        with self._reachable():
            if caller.sees_all:
                keys = list(self.redis.scan_iter(match=self._key("saved", "*"), count=500))
            else:
                ids = sorted(i.decode() for i in self.redis.smembers(self._key("saved_by", caller.owner)))
                keys = [self._key("saved", i) for i in ids]
            blobs = self.redis.mget(keys) if keys else []
        records = [r for r in map(self._decoded, blobs) if r is not None and r.visible_to(caller)]
        return sorted(records, key=lambda r: (r.created, r.id))

    def state(self, record: SavedStateRecord) -> State | None:
        with self._reachable():
            blob = self.redis.get(self._key("saved_state", record.id))
        try:
            return decode_state(blob, record.fingerprint) if blob is not None else None
        except ValueError:
            return None

    def touch(self, state_id: str) -> None:
        key = self._key("saved", state_id)
        with self._reachable():
            record = self._decoded(self.redis.get(key))
            if record is not None:
                self.redis.set(key, self._encode(msgspec.structs.replace(record, used=time.time())), xx=True)

    def put(self, record: SavedStateRecord, state: State) -> None:
        pipe = self.redis.pipeline(transaction=True)
        pipe.set(self._key("saved_state", record.id), encode_state(state, record.fingerprint))
        pipe.set(self._key("saved", record.id), self._encode(record))
        pipe.sadd(self._key("saved_by", record.owner), record.id)
        with self._reachable():
            pipe.execute()

    def delete(self, state_id: str, caller: Caller) -> bool:
        record = self.get(state_id, caller)
        if record is None:
            return False
        pipe = self.redis.pipeline(transaction=True)
        pipe.delete(self._key("saved", state_id)).delete(self._key("saved_state", state_id))
        pipe.srem(self._key("saved_by", record.owner), state_id)
        with self._reachable():
            deleted = pipe.execute()[0]
        return deleted > 0
