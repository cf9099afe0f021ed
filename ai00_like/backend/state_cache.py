"""The prefix state cache: token-id prefixes → the exact RNN state (and logits) after them.

An RNN's whole context is its state, so a request whose prompt starts with a cached
prefix loads that state and computes only the rest. Entries are exact copies, so a hit
continues exactly as a cold run would. Entries are partitioned by initial state (the
same tokens after different initial states are different states), bounded by a memory
budget and evicted least recently used first.

A prompt that is being computed can be reserved: other requests for the same prompt
wait for it instead of computing it again (n > 1 choices use this too).

Tiers below memory (cache_tier.py) keep entries beyond it, each written on its own thread,
never on the path of a step. The disk tier (disk_cache.py) gets an entry when it leaves
memory and every entry still in memory when the model stops (a clean stop, an unload or a
replacement): a state is written once, when it would otherwise be lost; a process that
dies without stopping loses what only its memory held. The shared tier (shared_cache.py)
gets the entries the scheduler `share`s as soon as they are filled, since the other
replicas want them while this one still runs.

Only the backend thread touches a cache; other threads read its counters. Hits are
counted by where the state came from (`count_hit`): memory, or the tier a read brought it
from; `hits` and `hit_tokens` are their sums.
"""

from __future__ import annotations

from collections import Counter, OrderedDict
from collections.abc import Sequence

import numpy as np


TIERS = ("memory", "disk", "shared")  # where a hit's state came from


class CacheEntry:
    __slots__ = ("partition", "key", "length", "state", "logits", "nbytes", "waiters", "shared")

    def __init__(self, partition: str, key: bytes, length: int):
        self.partition, self.key, self.length = partition, key, length
        self.state = None  # None while reserved: the computation is in flight
        self.logits: np.ndarray | None = None
        self.nbytes = 0
        self.waiters: list = []  # requests waiting for a reserved entry
        self.shared = False  # handed to the tiers written through (once is enough)

    @property
    def ready(self) -> bool:
        return self.state is not None


def token_key(tokens: Sequence[int]) -> bytes:
    return np.asarray(tokens, dtype=np.int32).tobytes()


class StateCache:
    def __init__(self, budget_bytes: int, tiers=()):
        self.budget = budget_bytes
        self.tiers = tuple(tiers)  # CacheTiers (disk, then shared) asked in order; none: memory only
        self.entries: OrderedDict[tuple[str, bytes], CacheEntry] = OrderedDict()  # oldest use first
        self.lengths: dict[str, Counter] = {}
        self.bytes = 0
        self.queries = 0
        self.tier_hits = dict.fromkeys(TIERS, 0)
        self.tier_hit_tokens = dict.fromkeys(TIERS, 0)

    def __len__(self) -> int:
        return len(self.entries)

    @property
    def hits(self) -> int:
        return sum(self.tier_hits.values())

    @property
    def hit_tokens(self) -> int:
        return sum(self.tier_hit_tokens.values())

    def lookup(self, partition: str, tokens: Sequence[int], *, count: bool = True) -> CacheEntry | None:
        """The entry of the longest cached prefix of `tokens` (ready or reserved), or None.

        An entry covering all of `tokens` must hold the logits after them (the next token is
        sampled from those); a mid-prompt checkpoint of that length has none and is skipped.
        Without `count` a ready entry is not counted as a hit: the caller counts the one it uses.
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
                if entry.ready and count:
                    self.count_hit("memory", length)
                return entry
        return None

    def count_hit(self, tier: str, tokens: int) -> None:
        """A prompt started from `tokens` cached tokens, whose state came from `tier`."""
        self.tier_hits[tier] += 1
        self.tier_hit_tokens[tier] += tokens

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

    def insert(self, partition: str, tokens: Sequence[int], state, logits: np.ndarray | None = None) -> CacheEntry:
        """Store a copy-free snapshot (the caller hands over `state`) unless one exists; the
        entry of `tokens` either way."""
        entry = self.reserve(partition, tokens)
        if entry is not None:
            self.fill(entry, state, logits)
            return entry
        self.entries.move_to_end((partition, token_key(tokens)))  # already there: now the most recent
        return self.entries[(partition, token_key(tokens))]

    def share(self, entry: CacheEntry) -> None:
        """Hand a filled entry to the tiers written through (the shared one): other replicas
        may want it while this one still holds it in memory."""
        if entry.shared or not entry.ready:
            return
        entry.shared = True
        for tier in self.tiers:
            if tier.write_through:
                tier.put(entry.partition, entry.key, entry.state, entry.logits)

    def spill(self) -> None:
        """Hand every ready entry to the tiers written at eviction (the model is stopping),
        least recently used first, so that the files' ages keep the memory's order for the cap."""
        for entry in list(self.entries.values()):
            if entry.ready:
                self._keep(entry, wait=True)

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
            self._keep(victim)
            self._remove(victim)

    def _keep(self, entry: CacheEntry, wait: bool = False) -> None:
        for tier in self.tiers:
            if not tier.write_through:
                tier.put(entry.partition, entry.key, entry.state, entry.logits, wait=wait)
