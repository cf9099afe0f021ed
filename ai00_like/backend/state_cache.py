"""The prefix state cache: token-id prefixes → the exact RNN state (and logits) after them.

An RNN's whole context is its state, so a request whose prompt starts with a cached
prefix loads that state and computes only the rest. Entries are exact copies, so a hit
continues exactly as a cold run would. Entries are partitioned by initial state (the
same tokens after different initial states are different states), bounded by a memory
budget and evicted least recently used first.

A prompt that is being computed can be reserved: other requests for the same prompt
wait for it instead of computing it again (n > 1 choices use this too).

With a disk tier (disk_cache.py), an entry that leaves memory is written there (on the disk
tier's own thread), and so is every entry still in memory when the model stops (a clean
stop, an unload or a replacement): a state is written once, when it would otherwise be
lost, never on the path of a step. A process that dies without stopping loses what only
its memory held.

Only the backend thread touches a cache; other threads read its counters.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Sequence

import numpy as np


class CacheEntry:
    __slots__ = ("partition", "key", "length", "state", "logits", "nbytes", "waiters")

    def __init__(self, partition: str, key: bytes, length: int):
        self.partition, self.key, self.length = partition, key, length
        self.state = None  # None while reserved: the computation is in flight
        self.logits: np.ndarray | None = None
        self.nbytes = 0
        self.waiters: list = []  # requests waiting for a reserved entry

    @property
    def ready(self) -> bool:
        return self.state is not None


def token_key(tokens: Sequence[int]) -> bytes:
    return np.asarray(tokens, dtype=np.int32).tobytes()


class StateCache:
    def __init__(self, budget_bytes: int, disk=None):
        self.budget = budget_bytes
        self.disk = disk  # a DiskCache (put, find, load), or None: memory only
        self.entries: OrderedDict[tuple[str, bytes], CacheEntry] = OrderedDict()  # oldest use first
        self.lengths: dict[str, Counter] = {}
        self.bytes = 0
        self.queries = 0
        self.hits = 0
        self.hit_tokens = 0

    def __len__(self) -> int:
        return len(self.entries)

    def lookup(self, partition: str, tokens: Sequence[int]) -> CacheEntry | None:
        """The entry of the longest cached prefix of `tokens` (ready or reserved), or None.

        An entry covering all of `tokens` must hold the logits after them (the next token is
        sampled from those); a mid-prompt checkpoint of that length has none and is skipped.
        """
        self.queries += 1
        lengths = self.lengths.get(partition)
        if not lengths:
            return None
        key = token_key(tokens)
        for length in sorted(lengths, reverse=True):
            if length > len(tokens):
                continue
            entry = self.entries.get((partition, key[: 4 * length]))
            if entry is not None and entry.ready and entry.logits is None and length == len(tokens):
                continue
            if entry is not None:
                self.entries.move_to_end((partition, entry.key))
                if entry.ready:
                    self.hits += 1
                    self.hit_tokens += length
                return entry
        return None

    def count_hit(self, tokens: int, *, new: bool) -> None:
        """A hit that came by a reservation (filled by a computation or the disk tier) rather
        than by `lookup`: `tokens` more read from the cache, and one more hit if `new`."""
        self.hits += int(new)
        self.hit_tokens += tokens

    def reserve(self, partition: str, tokens: Sequence[int]) -> CacheEntry | None:
        """Mark `tokens` as being computed; None if an entry for them exists already."""
        key = token_key(tokens)
        if (partition, key) in self.entries:
            return None
        entry = CacheEntry(partition, key, len(tokens))
        self._add(entry)
        return entry

    def fill(self, entry: CacheEntry, state, logits: np.ndarray | None) -> list:
        """Store the computed state of a reserved entry; returns the requests that waited for it."""
        entry.state, entry.logits = state, None if logits is None else np.array(logits, dtype=np.float32)
        entry.nbytes = state.nbytes + (0 if entry.logits is None else entry.logits.nbytes)
        self.bytes += entry.nbytes
        waiters, entry.waiters = entry.waiters, []
        if (entry.partition, entry.key) in self.entries:
            self._evict()
        return waiters

    def abandon(self, entry: CacheEntry) -> list:
        """Drop a reservation whose computation will not finish; returns its waiters."""
        if not entry.ready:
            self._remove(entry)
        waiters, entry.waiters = entry.waiters, []
        return waiters

    def insert(self, partition: str, tokens: Sequence[int], state, logits: np.ndarray | None = None) -> None:
        """Store a copy-free snapshot (the caller hands over `state`) unless one exists."""
        entry = self.reserve(partition, tokens)
        if entry is not None:
            self.fill(entry, state, logits)
        else:  # already there: refresh its place in the LRU order
            self.entries.move_to_end((partition, token_key(tokens)))

    def spill(self) -> None:
        """Hand every ready entry to the disk tier (the model is stopping), least recently used
        first, so that the files' ages keep the memory's order for the cap."""
        if self.disk is None:
            return
        for entry in list(self.entries.values()):
            if entry.ready:
                self.disk.put(entry.partition, entry.key, entry.state, entry.logits, wait=True)

    def clear(self) -> list:
        waiters = [w for e in self.entries.values() for w in e.waiters]
        self.entries.clear()
        self.lengths.clear()
        self.bytes = 0
        return waiters

    def _add(self, entry: CacheEntry) -> None:
        self.entries[(entry.partition, entry.key)] = entry
        self.lengths.setdefault(entry.partition, Counter())[entry.length] += 1

    def _remove(self, entry: CacheEntry) -> None:
        del self.entries[(entry.partition, entry.key)]
        lengths = self.lengths[entry.partition]
        lengths[entry.length] -= 1
        if not lengths[entry.length]:
            del lengths[entry.length]
        self.bytes -= entry.nbytes

    def _evict(self) -> None:
        while self.bytes > self.budget:
            victim = next((e for e in self.entries.values() if e.ready), None)
            if victim is None:
                return
            if self.disk is not None:
                self.disk.put(victim.partition, victim.key, victim.state, victim.logits)
            self._remove(victim)
