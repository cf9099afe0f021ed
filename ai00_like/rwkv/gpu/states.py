"""The recurrent states of every slot on the GPU: a buffer per part of a layer's state (the
`LayerSlots` of state.py), slot-first, so that a slot's state is one contiguous range of
each and moves in or out with one copy per part."""

from __future__ import annotations

import numpy as np

from ..state import LayerSlots, State, slot_shapes
from .buffers import Uploader


class GpuStates:
    def __init__(self, up: Uploader, info, slots: int):
        self.info, self.slots, self.queue = info, slots, up.device.queue
        self.layer_floats = LayerSlots(*(int(np.prod(shape)) for shape in slot_shapes(info)))
        # floats per slot in each part: the layers one after the other
        self.slot_floats = LayerSlots(*(info.n_layer * n for n in self.layer_floats))
        self.buffers = LayerSlots(*(up.buffer(slots * n) for n in self.slot_floats))

    def at(self, part: str, layer: int) -> tuple[int, int]:
        """(where `layer`'s state begins within a slot's range, floats per slot) of a part: what
        the token-shift and WKV kernels take to find a row's state."""
        return layer * getattr(self.layer_floats, part), getattr(self.slot_floats, part)

    def write(self, slot: int, state: State) -> None:
        state.check(self.info)
        for buffer, n, values in zip(self.buffers, self.slot_floats, state.parts()):
            self.queue.write_buffer(buffer, 4 * slot * n, np.ascontiguousarray(values, dtype=np.float32))

    def read(self, slot: int) -> State:
        L = self.info.n_layer
        return State(*(np.frombuffer(self.queue.read_buffer(buffer, 4 * slot * n, 4 * n), dtype=np.float32)
                       .copy().reshape(L, *shape)
                       for buffer, n, shape in zip(self.buffers, self.slot_floats, slot_shapes(self.info))))
