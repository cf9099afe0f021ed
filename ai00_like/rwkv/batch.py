"""One batched step: which slot each stacked row belongs to (rwkv-spec §4.1–4.2).

A step runs the tokens of several slots as one stack of rows: the prefill chunk of one
slot, single decode tokens of others. The plan records where each slot's run of rows
starts and ends so the token shift and the WKV recurrence can find the slot's state.
"""

from __future__ import annotations

import itertools
from collections.abc import Sequence
from typing import Literal, NamedTuple

import numpy as np

Want = Literal["none", "last", "all"] | int


class StepInput(NamedTuple):
    slot: int
    tokens: Sequence[int]
    # Which logits to return: none, the last token's, every token's, or (an int n) the last
    # n tokens' (a speculative step's: its draft's and the token before it).
    want: Want = "last"


class BatchPlan:
    def __init__(self, segments: Sequence[tuple[int, int]]):
        """segments: (slot, number of tokens ≥ 1) in stacking order; each slot at most once."""
        # In Python lists, then an array each: a step's plan is a few numbers, and a numpy
        # call on them costs microseconds, tens right after a step has streamed the weights
        # through the caches.
        slots = [int(s) for s, _ in segments]
        lengths = [int(n) for _, n in segments]
        if len(set(slots)) != len(slots):
            raise ValueError("a slot appears twice in one step")
        if any(n < 1 for n in lengths):
            raise ValueError("every segment of a step needs at least one token")
        stops = list(itertools.accumulate(lengths))
        starts = [stop - n for stop, n in zip(stops, lengths)]
        self.slots = np.array(slots, dtype=np.intp)
        self.starts, self.stops = np.array(starts, dtype=np.intp), np.array(stops, dtype=np.intp)
        self.first_rows, self.last_rows = self.starts, self.stops - 1
        self.n_rows = stops[-1] if stops else 0
        single = [n == 1 for n in lengths]
        single_slots = [s for s, one in zip(slots, single) if one]
        self.single_rows = np.array([a for a, one in zip(starts, single) if one], dtype=np.intp)
        self.single_slots = np.array(single_slots, dtype=np.intp)
        n = len(single_slots)
        first = single_slots[0] if n else 0
        contiguous = n > 0 and single_slots == list(range(first, first + n))
        self.single_slot_range = slice(first, first + n) if contiguous else None
        self.long_segments = [(s, a, b) for s, a, b, one in zip(slots, starts, stops, single) if not one]


class StepLayout:
    """How a batch step is planned, the same on both backends: the inputs with tokens stacked
    as rows (`ids`, `plan`), and which rows' logits are wanted, in the order they are given
    back (`wanted`: ln_out and the head run on those rows only)."""

    def __init__(self, inputs: Sequence[StepInput], vocab: int, slots: int, pool: int):
        """`slots`: the slots a step may use; `pool`: the pool's size, for the message (the GPU
        backend's `forward` steps a scratch slot past the pool)."""
        self.inputs = [StepInput(*i) for i in inputs]
        self.active = [i for i in self.inputs if len(i.tokens)]
        for i in self.active:
            if not 0 <= i.slot < slots:
                raise ValueError(f"slot {i.slot} is outside the pool of {pool}")
        self.wanted: list[int] = []
        self._where: list[tuple[int, int]] = []  # per active input: (its first row in `wanted`, how many)
        if not self.active:
            self.ids, self.plan = np.zeros(0, np.intp), BatchPlan([])
            return
        self.ids = np.concatenate([np.asarray(i.tokens, dtype=np.intp) for i in self.active])
        low, high = (int(self.ids[0]),) * 2 if len(self.ids) == 1 else (self.ids.min(), self.ids.max())
        if low < 0 or high >= vocab:
            raise ValueError(f"token ids must be in [0, {vocab})")
        self.plan = BatchPlan([(i.slot, len(i.tokens)) for i in self.active])
        for i, start, stop in zip(self.active, self.plan.starts, self.plan.stops):
            rows = range(start, stop) if i.want == "all" else [stop - 1] if i.want == "last" else \
                range(max(start, stop - i.want), stop) if isinstance(i.want, int) else []
            self._where.append((len(self.wanted), len(rows)))
            self.wanted.extend(rows)

    def results(self, logits: np.ndarray | None) -> list[np.ndarray | None]:
        """Per input its logits (`logits`: the wanted rows'): one row for "last", all its rows
        for "all" (its last n for n), None for "none" and for an input without tokens."""
        results: list[np.ndarray | None] = [None] * len(self.inputs)
        where = iter(self._where)
        for n, i in enumerate(self.inputs):
            if not len(i.tokens):
                continue
            offset, count = next(where)
            if i.want == "last":
                results[n] = logits[offset]
            elif i.want == "all" or isinstance(i.want, int):
                results[n] = logits[offset : offset + count]
        return results
