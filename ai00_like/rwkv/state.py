"""RNN states as plain arrays: one sequence's `State`, and the per-slot `StatePool`.

Layouts follow rwkv-spec §2.6 and the reference package, so states can be compared
with it directly: per layer the time-mix shift row, the WKV state, the channel-mix
shift row. The WKV part is v4 `[3, C]` (aa, bb, pp), v5/v6 `[H, N(key), N(value)]`,
v7 `[H, N(value), N(key)]`.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

V4_EMPTY_EXPONENT = -1e30  # pp of a fresh v4 state: finite, so pp − q never makes a NaN


def wkv_shape(info) -> tuple[int, ...]:
    if info.version == "4":
        return (3, info.n_embd)
    return (info.n_head, info.head_size, info.head_size)


@dataclass
class State:
    """The recurrent state of one sequence after some tokens (arrays lead with the layer)."""

    att_shift: np.ndarray  # [L, C]
    wkv: np.ndarray  # [L, *wkv_shape]
    ffn_shift: np.ndarray  # [L, C]

    @classmethod
    def zeros(cls, info) -> "State":
        L, C = info.n_layer, info.n_embd
        wkv = np.zeros((L, *wkv_shape(info)), dtype=np.float32)
        if info.version == "4":
            wkv[:, 2, :] = V4_EMPTY_EXPONENT
        return cls(np.zeros((L, C), np.float32), wkv, np.zeros((L, C), np.float32))

    def copy(self) -> "State":
        return State(self.att_shift.copy(), self.wkv.copy(), self.ffn_shift.copy())

    @property
    def nbytes(self) -> int:
        return self.att_shift.nbytes + self.wkv.nbytes + self.ffn_shift.nbytes

    def check(self, info) -> None:
        L, C = info.n_layer, info.n_embd
        want = ((L, C), (L, *wkv_shape(info)), (L, C))
        got = (self.att_shift.shape, self.wkv.shape, self.ffn_shift.shape)
        if want != got:
            raise ValueError(f"state shapes {got} do not fit this model (expected {want})")


class StatePool:
    """The states of `size` slots, stored slot-second ([L, B, ...]) so a layer's slice is one view."""

    def __init__(self, info, size: int, initial: State | None = None):
        self.info, self.size = info, size
        self.initial = initial if initial is not None else State.zeros(info)
        self.initial.check(info)
        self.att_shift = np.repeat(self.initial.att_shift[:, None], size, axis=1)
        self.wkv = np.repeat(self.initial.wkv[:, None], size, axis=1)
        self.ffn_shift = np.repeat(self.initial.ffn_shift[:, None], size, axis=1)

    def read(self, slot: int) -> State:
        return State(self.att_shift[:, slot].copy(), self.wkv[:, slot].copy(), self.ffn_shift[:, slot].copy())

    def write(self, slot: int, state: State) -> None:
        state.check(self.info)
        self.att_shift[:, slot] = state.att_shift
        self.wkv[:, slot] = state.wkv
        self.ffn_shift[:, slot] = state.ffn_shift

    def reset(self, slot: int) -> None:
        self.write(slot, self.initial)
