"""Live tokens per second for the status stream, from the backend's running totals.

The backend only counts; the rate is the change of its totals over the last few seconds of
samples, so any reader (the status stream every half second, /api/models/info now and then)
sees a rate without the backend keeping clocks.
"""

from __future__ import annotations

import time
from collections import deque

from ..messages import BackendCounters

WINDOW = 5.0  # seconds of samples a rate is taken over


class Throughput:
    def __init__(self, window: float = WINDOW, clock=time.monotonic):
        self.window, self.clock = window, clock
        self.samples: deque[tuple[float, int, int]] = deque()  # (time, prompt tokens, generated tokens)

    def rates(self, counters: BackendCounters) -> tuple[float, float]:
        """(prompt tokens/s, generated tokens/s) over the window ending now."""
        now = self.clock()
        if self.samples and counters.generated_tokens < self.samples[-1][2]:
            self.samples.clear()  # a new model: its totals started again from zero
        self.samples.append((now, counters.prompt_tokens, counters.generated_tokens))
        while len(self.samples) > 2 and now - self.samples[1][0] >= self.window:
            self.samples.popleft()
        first, last = self.samples[0], self.samples[-1]
        elapsed = last[0] - first[0]
        if elapsed <= 0:
            return 0.0, 0.0
        return (last[1] - first[1]) / elapsed, (last[2] - first[2]) / elapsed
