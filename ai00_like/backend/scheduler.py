"""Which sequences hold the model's slots, and what each runs in the next step.

Admission is first come, first served into free slots, starting from the longest cached
prefix of each prompt; a prompt that another sequence is computing waits for it instead
of being computed twice. A prompt whose longer prefix is on disk (the cache's disk tier)
waits the same way, on a reservation that the disk tier's reader thread fills: the other
slots keep stepping meanwhile. A step gives every decoding slot its next token and shares the
rest of the `token_chunk_size` budget among prefilling slots.
"""

from __future__ import annotations

from collections import deque

from ..messages import Started
from .sequence import Sequence
from .state_cache import CacheEntry, StateCache, token_key


class DiskRead:
    """What the disk tier's reader thread hands the backend thread: the state and logits of a
    reserved entry, or None for an entry that turned out gone or damaged."""

    __slots__ = ("entry", "state", "logits")

    def __init__(self, entry: CacheEntry, state, logits):
        self.entry, self.state, self.logits = entry, state, logits


class Scheduler:
    def __init__(self, model, cache: StateCache, *, token_chunk_size: int, checkpoint_interval: int,
                 post=None):
        self.model, self.cache = model, cache
        self.post = post  # puts a DiskRead into the backend thread's inbox (from the reader thread)
        self.token_chunk_size = max(1, token_chunk_size)
        self.checkpoint_interval = max(1, checkpoint_interval)
        self.slots: list[Sequence | None] = [None] * model.max_batch
        self.waiting: deque[Sequence] = deque()

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
            if seq.hit is not None:  # from a reservation it waited on: count what lookup did not
                self.cache.count_hit(seq.hit.length - seq.hit_counted, new=not seq.hit_counted)
            entry = seq.hit or self.cache.lookup(seq.job.partition, seq.prompt)
            if entry is not None and not entry.ready:
                entry.waiters.append(seq)  # the same prompt is being computed: wait for it
                continue
            if seq.hit is None and self._read_from_disk(seq, entry):
                continue
            self._place(seq, self.slots.index(None), entry)

    def _read_from_disk(self, seq: Sequence, entry: CacheEntry | None) -> bool:
        """Start reading a longer prefix of `seq`'s prompt from disk than memory holds, with
        `seq` waiting on its reservation; False when the disk has none."""
        disk, partition = self.cache.disk, seq.job.partition
        if disk is None or self.post is None or seq.disk_checked:
            return False
        seq.disk_checked = True  # once: a read that fails leaves it to memory and the model
        seq.hit_counted = entry.length if entry is not None and entry.ready else 0
        length = disk.find(partition, token_key(seq.prompt), above=entry.length if entry is not None else 0)
        reservation = self.cache.reserve(partition, seq.prompt[:length]) if length else None
        if reservation is None:
            return False
        reservation.waiters.append(seq)
        post = self.post
        disk.load(partition, reservation.key, lambda state, logits: post(DiskRead(reservation, state, logits)))
        return True

    def disk_read(self, read: DiskRead) -> None:
        """On the backend thread: fill the reservation with what the disk gave (or drop it)
        and put its waiters back at the head of the queue, in their order."""
        entry = read.entry
        if self.cache.entries.get((entry.partition, entry.key)) is not entry:
            return  # cleared meanwhile (an unload): its waiters were ended with it
        if read.state is None:
            waiters = self.cache.abandon(entry)
        else:
            waiters = self.cache.fill(entry, read.state, read.logits)
            for waiter in waiters:
                waiter.hit = entry
        self.waiting.extendleft(reversed(waiters))

    def _place(self, seq: Sequence, slot: int, entry: CacheEntry | None) -> None:
        seq.slot = slot
        self.slots[slot] = seq
        if entry is not None:
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
        singles = [s for s in active if len(s.pending) == 1]
        prefills = [s for s in active if len(s.pending) > 1]
        plan = [(s, s.pending[:1]) for s in singles]
        # Share the rest among prefilling slots, shortest first, so short prompts finish in
        # one step beside a long one. A chunk never crosses a checkpoint boundary, so cache
        # checkpoints land at fixed positions whatever the batch looked like.
        limits = {}
        for s in prefills:
            to_boundary = self.checkpoint_interval - len(s.fed) % self.checkpoint_interval
            limits[id(s)] = min(len(s.pending), to_boundary)
        left = max(self.token_chunk_size - len(singles), 1)
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
        elif seq.pending and len(seq.fed) < len(seq.prompt) and len(seq.fed) % self.checkpoint_interval == 0:
            self.cache.insert(seq.job.partition, seq.fed, self.model.read_state(seq.slot))

    # ------------------------------------------------------------------ ending

    def keep(self, seq: Sequence) -> None:
        """Cache the state after everything `seq` has read, keyed by those tokens: the next
        turn of a chat starts with them and computes only its new text."""
        if seq.logits is not None and seq.fed and not seq.pending:
            self.cache.insert(seq.job.partition, seq.fed, self.model.read_state(seq.slot), seq.logits)

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
        seqs = self.running + list(self.waiting) + self.cache.clear()
        for seq in seqs:
            self.release(seq)
        self.waiting.clear()
        return seqs
