"""Which sequences hold the model's slots, and what each runs in the next step.

Admission is first come, first served into free slots, starting from the longest cached
prefix of each prompt; a prompt that another sequence is computing waits for it instead
of being computed twice. A prompt may have a longer prefix in a tier below memory (the disk,
then the store shared by replicas): it then waits while the tier's reader thread looks
(requests for the same prompt wait on one look), and comes back to the queue's head with
what the tier read; the other slots keep stepping meanwhile. A step gives every decoding
slot its next token and shares the rest of the `token_chunk_size` budget among
prefilling slots.
"""

from __future__ import annotations

from collections import deque

import numpy as np

from ..messages import Started
from .sequence import Sequence
from .state_cache import CacheEntry, StateCache, token_key


class TierRead:
    """What a tier's reader thread hands the backend thread: the longest prefix of a prompt
    it held beyond memory's (`length` tokens, its state and logits), or length 0 for none."""

    __slots__ = ("tier", "asked", "length", "state", "logits")

    def __init__(self, tier, asked: tuple[str, bytes], length: int, state, logits):
        self.tier, self.asked, self.length, self.state, self.logits = tier, asked, length, state, logits


class Scheduler:
    def __init__(self, model, cache: StateCache, *, token_chunk_size: int, checkpoint_interval: int,
                 post=None):
        self.model, self.cache = model, cache
        self.post = post  # puts a TierRead into the backend thread's inbox (from a tier's reader thread)
        self.token_chunk_size = max(1, token_chunk_size)
        self.checkpoint_interval = max(1, checkpoint_interval)
        self.slots: list[Sequence | None] = [None] * model.max_batch
        self.waiting: deque[Sequence] = deque()
        self.asking: dict[tuple[str, bytes], list[Sequence]] = {}  # (partition, prompt) → waiting on a tier

    @property
    def running(self) -> list[Sequence]:
        return [s for s in self.slots if s is not None]

    @property
    def busy(self) -> bool:
        return bool(self.waiting) or any(s is not None for s in self.slots)

    def take_cancelled(self) -> tuple[list[Sequence], list[Sequence]]:
        """The cancelled sequences: those in slots (still placed) and those that were waiting
        (now dropped from the queue)."""
        running = [s for s in self.running if s.cancelled]
        waiting = [s for s in self.waiting if s.cancelled]
        for seq in waiting:
            self.waiting.remove(seq)
        return running, waiting

    # ------------------------------------------------------------------ admission

    def admit(self) -> None:
        while self.waiting and None in self.slots:
            seq = self.waiting.popleft()
            entry = seq.hit or self.cache.lookup(seq.job.partition, seq.prompt, count=False)
            if entry is not None and not entry.ready:
                entry.waiters.append(seq)  # the same prompt is being computed: wait for it
                continue
            if seq.hit is None and self._ask_tier(seq, entry):
                continue
            self._place(seq, self.slots.index(None), entry)

    def _ask_tier(self, seq: Sequence, entry: CacheEntry | None) -> bool:
        """Ask the next tier below memory for a longer prefix of `seq`'s prompt than memory
        holds, with `seq` waiting for the answer; False when no tier is left to ask."""
        tiers, above = self.cache.tiers, entry.length if entry is not None else 0
        if self.post is None or seq.tier >= len(tiers):
            return False
        asked = (seq.job.partition, token_key(seq.prompt))
        # Left out: a failing tier (its store is gone: memory and the model serve) and one
        # that cannot hold more than memory has.
        while seq.tier < len(tiers) and not (tiers[seq.tier].available()
                                             and tiers[seq.tier].worth_asking(*asked, above)):
            seq.tier += 1
        if seq.tier >= len(tiers):
            return False
        if asked in self.asking:  # the same prompt (another choice, another request): one look
            self.asking[asked].append(seq)
            return True
        self.asking[asked] = [seq]
        tier, post = tiers[seq.tier], self.post
        tier.fetch(*asked, above, lambda length, state, logits: post(TierRead(tier, asked, length, state, logits)))
        return True

    def tier_read(self, read: TierRead) -> None:
        """On the backend thread: put the sequences that waited for `read` back at the head of
        the queue, in their order, starting from what it read, or asking the next tier."""
        waiters = self.asking.pop(read.asked, None)
        if waiters is None:
            return  # dropped meanwhile (an unload): its waiters were ended with it
        after = self.cache.tiers.index(read.tier) + 1
        entry = None
        if read.state is not None:
            partition, key = read.asked
            tokens = np.frombuffer(key[:4 * read.length], np.int32).tolist()
            entry = self.cache.insert(partition, tokens, read.state, read.logits)
            entry.shared = True  # read from a tier: not to be written back
            after = len(self.cache.tiers)  # found: the tiers below are not asked
        for seq in waiters:
            seq.tier = max(seq.tier, after)
            if entry is not None and entry.ready:
                seq.hit, seq.hit_from = entry, read.tier.name
        self.waiting.extendleft(reversed(waiters))

    def _place(self, seq: Sequence, slot: int, entry: CacheEntry | None) -> None:
        seq.slot = slot
        self.slots[slot] = seq
        if entry is not None:
            self.cache.count_hit(seq.hit_from, entry.length)
            self.model.write_state(slot, entry.state)
            seq.fed = seq.prompt[: entry.length]
            seq.pending = seq.prompt[entry.length :]
            seq.logits = entry.logits if not seq.pending else None
        elif seq.job.initial_state is not None:
            self.model.write_state(slot, seq.job.initial_state)
            seq.fed, seq.pending = [], list(seq.prompt)
        else:
            self.model.reset(slot)
            seq.fed, seq.pending = [], list(seq.prompt)
        if seq.pending:
            seq.reservation = self.cache.reserve(seq.job.partition, seq.prompt)
        seq.send(Started(seq.index, len(seq.prompt), entry.length if entry is not None else 0))

    # ------------------------------------------------------------------ one step

    def plan(self) -> list[tuple[Sequence, list[int]]]:
        active = [s for s in self.slots if s is not None and s.pending]
        # A decoding sequence reads its token (and a draft, or the tokens a failed one read
        # again) in one piece: speculation.py keeps that within a step's room.
        singles = [s for s in active if len(s.pending) == 1 or s.decoding]
        prefills = [s for s in active if len(s.pending) > 1 and not s.decoding]
        plan = [(s, list(s.pending)) for s in singles]
        # Share the rest among prefilling slots, shortest first, so short prompts finish in
        # one step beside a long one. A chunk never crosses a checkpoint boundary, so cache
        # checkpoints land at fixed positions whatever the batch looked like.
        limits = {}
        for s in prefills:
            to_boundary = self.checkpoint_interval - len(s.fed) % self.checkpoint_interval
            limits[id(s)] = min(len(s.pending), to_boundary)
        left = max(self.token_chunk_size - sum(len(c) for _, c in plan), 1)
        for n, s in enumerate(sorted(prefills, key=lambda s: limits[id(s)])):
            take = min(limits[id(s)], max(1, left // (len(prefills) - n)))
            if take <= 0 or left <= 0:
                break
            plan.append((s, s.pending[:take]))
            left -= take
        return plan

    def after_chunk(self, seq: Sequence, logits) -> None:
        """Cache what the chunk reached: the whole prompt fills the sequence's reservation
        (and wakes the sequences waiting on it), a checkpoint boundary gets an entry."""
        if logits is not None:
            seq.logits = logits
        if len(seq.fed) == len(seq.prompt) and seq.reservation is not None:
            entry, seq.reservation = seq.reservation, None
            for waiter in self.cache.fill(entry, self.model.read_state(seq.slot), logits):
                waiter.hit = entry
                self.waiting.appendleft(waiter)
            self.cache.share(entry)
        elif seq.pending and len(seq.fed) < len(seq.prompt) and len(seq.fed) % self.checkpoint_interval == 0:
            checkpoint = self.cache.insert(seq.job.partition, seq.fed, self.model.read_state(seq.slot))
            if len(seq.prompt) - len(seq.fed) <= self.checkpoint_interval:
                self.cache.share(checkpoint)  # the last: a next turn whose prompt ends otherwise starts here

    # ------------------------------------------------------------------ ending

    def keep(self, seq: Sequence) -> None:
        """Cache the state after everything `seq` has read, keyed by those tokens: the next
        turn of a chat starts with them and computes only its new text."""
        if seq.logits is not None and seq.fed and not seq.pending:
            self.cache.share(self.cache.insert(seq.job.partition, seq.fed, self.model.read_state(seq.slot), seq.logits))

    def release(self, seq: Sequence) -> None:
        if seq.reservation is not None:
            for waiter in self.cache.abandon(seq.reservation):
                self.waiting.appendleft(waiter)
            seq.reservation = None
        if seq.slot is not None and self.slots[seq.slot] is seq:
            self.slots[seq.slot] = None
        seq.slot = None

    def drain(self) -> list[Sequence]:
        """Every sequence placed, waiting or parked on a reservation, released."""
        asking = [seq for waiters in self.asking.values() for seq in waiters]
        seqs = self.running + list(self.waiting) + self.cache.clear() + asking
        for seq in seqs:
            self.release(seq)
        self.waiting.clear()
        self.asking.clear()
        return seqs
