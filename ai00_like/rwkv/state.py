"""RNN states as plain arrays: one sequence's `State`, and the per-slot `StatePool`.

Layouts follow rwkv-spec §2.6 and the reference package, so states can be compared
with it directly: per layer the time-mix shift row, the WKV state, the channel-mix
shift row. The WKV part is v4 `[3, C]` (aa, bb, pp), v5/v6 `[H, N(key), N(value)]`,
v7 `[H, N(value), N(key)]`.
"""

from __future__ import annotations

import mmap
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np

V4_EMPTY_EXPONENT = -1e30  # pp of a fresh v4 state: finite, so pp − q never makes a NaN


def wkv_shape(info) -> tuple[int, ...]:
    if info.version == "4":
        return (3, info.n_embd)
    return (info.n_head, info.head_size, info.head_size)


class LayerSlots(NamedTuple):
    """What one layer keeps for a sequence, in the order of its blocks: the time mix's shift
    row, the WKV state, the channel mix's shift row. As shapes (`slot_shapes`), as one
    sequence's arrays, or as every slot's ([B, ...], `StatePool.layers`); the GPU backend
    lays its buffers out by the same description (gpu/states.py)."""

    att_shift: object
    wkv: object
    ffn_shift: object


def slot_shapes(info) -> LayerSlots:
    """The shape of each part of one layer's state of one sequence."""
    return LayerSlots((info.n_embd,), wkv_shape(info), (info.n_embd,))


@dataclass
class State:
    """The recurrent state of one sequence after some tokens (arrays lead with the layer)."""

    att_shift: np.ndarray  # [L, C]
    wkv: np.ndarray  # [L, *wkv_shape]
    ffn_shift: np.ndarray  # [L, C]

    @classmethod
    def zeros(cls, info) -> State:
        L = info.n_layer
        state = cls(*(np.zeros((L, *shape), np.float32) for shape in slot_shapes(info)))
        if info.version == "4":
            state.wkv[:, 2, :] = V4_EMPTY_EXPONENT
        return state

    def parts(self) -> LayerSlots:
        return LayerSlots(self.att_shift, self.wkv, self.ffn_shift)

    def copy(self) -> State:
        return State(*(part.copy() for part in self.parts()))

    @property
    def nbytes(self) -> int:
        return sum(part.nbytes for part in self.parts())

    def check(self, info) -> None:
        want = tuple((info.n_layer, *shape) for shape in slot_shapes(info))
        got = tuple(part.shape for part in self.parts())
        if want != got:
            raise ValueError(f"state shapes {got} do not fit this model (expected {want})")


def untouched_zeros(shape: tuple[int, ...]) -> np.ndarray:
    """float32 zeros in an anonymous mapping of small pages, resident only where written.

    numpy asks for huge pages for large arrays, and a huge page is taken whole at its first
    write: one slot's first step would take 2 MiB of every layer's states of all slots.
    """
    count = int(np.prod(shape))
    private = {"flags": mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS} if hasattr(mmap, "MAP_ANONYMOUS") else {}
    pages = mmap.mmap(-1, max(4 * count, 1), **private)
    if hasattr(mmap, "MADV_NOHUGEPAGE"):
        pages.madvise(mmap.MADV_NOHUGEPAGE)
    return np.frombuffer(pages, np.float32, count=count).reshape(shape)


class StatePool:
    """The states of `size` slots, stored slot-second ([L, B, ...]) so a layer's slice is one view."""

    def __init__(self, info, size: int, initial: State | None = None):
        self.info, self.size = info, size
        self.initial = initial if initial is not None else State.zeros(info)
        self.initial.check(info)
        # Every slot starts as `initial`: when that is all zeros, as pages nobody has
        # written yet, so a slot takes memory once a sequence uses it rather than at load
        # (16 slots of a 7B model: 0.5 GiB).
        self.att_shift, self.wkv, self.ffn_shift = (
            np.repeat(part[:, None], size, axis=1) if part.any() else untouched_zeros((len(part), size, *part.shape[1:]))
            for part in self.initial.parts())

    def parts(self) -> LayerSlots:
        return LayerSlots(self.att_shift, self.wkv, self.ffn_shift)

    def layers(self) -> list[LayerSlots]:
        """Per layer, every slot's state of it: [B, C], [B, *wkv_shape], [B, C] views."""
        return [LayerSlots(*parts) for parts in zip(*self.parts())]

    def read(self, slot: int) -> State:
        return State(*(part[:, slot].copy() for part in self.parts()))

    def write(self, slot: int, state: State) -> None:
        state.check(self.info)
        for part, value in zip(self.parts(), state.parts()):
            part[:, slot] = value

    def reset(self, slot: int) -> None:
        self.write(slot, self.initial)
