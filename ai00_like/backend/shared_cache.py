"""The prefix cache's shared tier: states in the Redis or Valkey of `[store] url`, found by
every replica behind the load balancer, so a prompt one replica has read is not computed
again by another.

* Keys: `{prefix}pcache:{digest}:{l|s}` (the digest of cache_tier.py: model key, partition,
  tokens; `l` for an entry that holds logits and may end a prompt, `s` for a checkpoint),
  with the store's TTL, refreshed by every hit. Redis's own `maxmemory` policy bounds it.
* Finding is one sorted set per model, `{prefix}pcache:lengths:{model key}`: the prefix
  lengths present, each scored with when its latest entry expires. A lookup reads the
  live lengths, then asks for the digests of the prompt's prefixes of those lengths in
  one pipelined round trip, then reads the longest: three round trips, on the reader
  thread, never on the backend's.
* Writes: replicas run side by side, so an entry written only when it leaves memory would
  come too late; state_cache.py hands this tier the prompt ends (entries with logits) and
  the last checkpoint of a long prompt when they are filled. Entries over
  `max_entry_bytes` are skipped.
* A Redis that goes away costs a warning, and the tier is left out for a few seconds at a
  time until it answers again (cache_tier.py); redis-py reconnects by itself.
"""

from __future__ import annotations

import time

import redis
from redis.backoff import NoBackoff
from redis.retry import Retry

from ..response_store.redis_store import redacted
from .cache_tier import CacheTier

CONNECT_TIMEOUT = 1.0  # s: a request waits for its lookup; an unreachable store must cost it little
IO_TIMEOUT = 10.0  # s: a large model's state is tens of MB
MAX_ENTRY_BYTES = 256 << 20  # a bigger state would hold a connection (and Redis's memory) too long


class SharedCache(CacheTier):
    """One model's entries in a Redis shared by the replicas."""

    name = "shared"
    write_through = True
    errors = (redis.RedisError,)
    readers = 2  # a lookup (a few small round trips) need not wait for another's state to arrive

    def __init__(self, url: str, model_key: str, *, prefix: str, ttl: int, min_tokens: int = 0,
                 max_entry_bytes: int = MAX_ENTRY_BYTES):
        super().__init__(model_key, min_tokens, max_entry_bytes)
        self.where, self.prefix, self.ttl = redacted(url), prefix, ttl
        self.redis = redis.Redis.from_url(url, socket_connect_timeout=CONNECT_TIMEOUT, socket_timeout=IO_TIMEOUT,
                                          retry=Retry(NoBackoff(), 1))  # one retry: a pooled connection Redis closed
        self.lengths_key = f"{prefix}pcache:lengths:{model_key}"

    def key(self, digest: str, has_logits: bool) -> str:
        return f"{self.prefix}pcache:{digest}:{'l' if has_logits else 's'}"

    def close(self) -> None:
        super().close()
        self.redis.close()

    # ------------------------------------------------------------------ CacheTier's

    def _find(self, partition: str, key: bytes, above: int):
        n = len(key) // 4
        live = self.redis.zrangebyscore(self.lengths_key, time.time(), "+inf")
        lengths = sorted({int(x) for x in live if above < int(x) <= n})
        if not lengths:
            return None
        digests = self.digests(partition, key, lengths)
        keys = []  # longest first; a checkpoint cannot end the prompt
        for length in reversed(lengths):
            keys.append((length, self.key(digests[length], True)))
            if length < n:
                keys.append((length, self.key(digests[length], False)))
        pipe = self.redis.pipeline(transaction=False)
        for _, k in keys:
            pipe.exists(k)
        for (length, k), present in zip(keys, pipe.execute()):
            if present:
                return length, (k, length)
        return None

    def _load(self, where: tuple[str, int]) -> bytes | None:
        key, length = where
        pipe = self.redis.pipeline(transaction=False)
        pipe.getex(key, ex=self.ttl)  # used: it lives another TTL, and so does its length below
        pipe.zadd(self.lengths_key, {str(length): time.time() + self.ttl}, gt=True)
        pipe.expire(self.lengths_key, self.ttl)
        return pipe.execute()[0]

    def _store(self, digest: str, length: int, has_logits: bool, data: bytes) -> bool:
        key, now = self.key(digest, has_logits), time.time()
        pipe = self.redis.pipeline(transaction=True)
        pipe.set(key, data, ex=self.ttl, nx=True)  # another replica's copy is the same state
        pipe.zadd(self.lengths_key, {str(length): now + self.ttl}, gt=True)  # GT adds a new length too
        pipe.zremrangebyscore(self.lengths_key, "-inf", now)  # lengths whose entries have all expired
        pipe.expire(self.lengths_key, self.ttl)
        return bool(pipe.execute()[0])

    def _drop(self, where: tuple[str, int]) -> None:
        self.redis.delete(where[0])
