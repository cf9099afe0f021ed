"""What the engine asks of a loaded model: the seam both backends (cpu.model.CpuModel,
gpu.model.GpuModel) fill, so run.py, middleware.py and the tests never ask which one it is."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Protocol, runtime_checkable

import numpy as np

from .batch import StepInput
from .info import ModelInfo
from .state import State


@runtime_checkable
class Model(Protocol):
    device: str  # "cpu" or "gpu"
    precision: str  # how the large matrices are kept: "fp32", "fp16" or "bf16"
    info: ModelInfo
    tensors: Mapping[str, np.ndarray]  # as loaded (LoRAs merged, quantised): what saving writes

    @property
    def max_batch(self) -> int:
        """How many slots the state pool has: `step`'s inputs name slots below it."""

    def initial_state(self) -> State:
        """A copy of the state a reset slot starts from (zeros, or a state-tuning file's)."""

    def read_state(self, slot: int) -> State: ...

    def write_state(self, slot: int, state: State) -> None: ...

    def reset(self, slot: int) -> None: ...

    def step(self, inputs: Sequence[StepInput]) -> list[np.ndarray | None]:
        """One batched forward over the pool's slots; per input its wanted logits or None."""

    def forward(self, tokens: Sequence[int], state: State | None = None,
                full_output: bool = False) -> tuple[np.ndarray, State]:
        """The logits of the last token (or of every token) and the state after `tokens`, outside
        the pool; `state` is not changed."""

    def forward_hidden(self, tokens: Sequence[int], state: State | None = None) -> tuple[np.ndarray, State]:
        """The last layer's normalised output (ln_out, before the head) for every token, and the state."""
