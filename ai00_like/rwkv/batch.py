"""One batched step: which slot each stacked row belongs to (rwkv-spec §4.1–4.2).

A step runs the tokens of several slots as one stack of rows: the prefill chunk of one
slot, single decode tokens of others. The plan records where each slot's run of rows
starts and ends so the token shift and the WKV recurrence can find the slot's state.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Literal, NamedTuple

import numpy as np

Want = Literal["none", "last", "all"]


class StepInput(NamedTuple):
    slot: int
    tokens: Sequence[int]
    want: Want = "last"  # which logits to return: none, the last token's, or every token's


class BatchPlan:
    def __init__(self, segments: Sequence[tuple[int, int]]):
        """segments: (slot, number of tokens ≥ 1) in stacking order; each slot at most once."""
        slots = np.array([s for s, _ in segments], dtype=np.intp)
        lengths = np.array([n for _, n in segments], dtype=np.intp)
        if len(set(slots.tolist())) != len(slots):
            raise ValueError("a slot appears twice in one step")
        if (lengths < 1).any():
            raise ValueError("every segment of a step needs at least one token")
        stops = np.cumsum(lengths)
        starts = stops - lengths
        self.slots = slots
        self.starts, self.stops = starts, stops
        self.first_rows, self.last_rows = starts, stops - 1
        self.n_rows = int(stops[-1]) if len(stops) else 0
        single = lengths == 1
        self.single_rows, self.single_slots = starts[single], slots[single]
        n = len(self.single_slots)
        first = int(self.single_slots[0]) if n else 0
        contiguous = n > 0 and np.array_equal(self.single_slots, np.arange(first, first + n))
        self.single_slot_range = slice(first, first + n) if contiguous else None
        self.long_segments = [
            (int(s), int(a), int(b)) for s, a, b, one in zip(slots, starts, stops, single) if not one
        ]
