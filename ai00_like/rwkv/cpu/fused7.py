"""v7's layer for a decoding step (each row the next token of its own slot: batch 1 to
SKINNY_ROWS), each layer in one compiled call (fused7_layer.py).

The same equations as blocks.py's Block, TimeMix7 and ChannelMix7, in the same order and
in fp32, written out row by row. At batch 1 the matrix products read a layer's weights
once and take about three quarters of a token's time; what is left went to some 300
Python-level calls a layer (element-wise numpy operations on 768 numbers, and 14 launches
of the product kernel), about 3 ms of a 15 ms bf16 token on the 0.1B shape. In a batch of
16 the same numpy operations on [16, 768] arrays took a quarter of the step. Here a layer
is one call: its 14 matrix products are the product kernels' parallel loops launched from
inside it, the WKV recurrence runs (row, head) by (row, head) in parallel, and the
element-wise work runs in between on one core, in loops LLVM vectorises (`exp` is
intrinsics.py's, divisions follow numpy's error model). bf16 0.1B batch 16: 34.2 → 28.7
ms a step; batch 4: 17.0 → 13.9 ms.

Each product goes to the kernels of its matrix's weight form (forms.py), as ops.linear picks
them, called from inside the layer. At one row, products that need nothing from each
other share a launch where their matrices are dense (r, k and v; the LoRAs' first
products; their second ones), since starting and ending a launch costs microseconds: 8
launches a layer instead of 14. The layer takes its weights as named tuples (`BlockWeights`
and the mixes' inside it), filled here from a built Block. Without numba there is no fused
layer (`DecodeLayers.of` gives None).
"""

from __future__ import annotations

from typing import Any, NamedTuple

import numpy as np

from . import intrinsics
from .blocks import HeadWeights, TimeMix7
from .forms import form_of
from .jit import LAUNCH

if intrinsics.build() is not None:
    from .fused7_layer import layer as _layer
else:
    _layer = None


class TimeMixWeights(NamedTuple):
    """blocks.TimeMix7's weights: the token mix [6, C] for r, w, k, v, a, g in fp32, its
    vectors after the products (blocks.HeadWeights), and the matrices as their forms'
    `compiled` gives them (v1, v2 empty in the first layer, which has no value residual)."""

    mix: np.ndarray
    heads: HeadWeights
    Wr: Any
    Wk: Any
    Wv: Any
    Wo: Any
    w1: Any
    w2: Any
    a1: Any
    a2: Any
    g1: Any
    g2: Any
    v1: Any
    v2: Any


class ChannelMixWeights(NamedTuple):
    """blocks.ChannelMix7's: mix [1, C], and its key and value matrices."""

    mix: np.ndarray
    Wk: Any
    Wv: Any


class BlockWeights(NamedTuple):
    ln1_w: np.ndarray
    ln1_b: np.ndarray
    ln2_w: np.ndarray
    ln2_b: np.ndarray
    time_mix: TimeMixWeights
    channel_mix: ChannelMixWeights


class SlotState(NamedTuple):
    """The step's slots (row m's in slots[m]) and this layer's state of every slot."""

    slots: np.ndarray
    att_shift: np.ndarray
    wkv: np.ndarray
    ffn_shift: np.ndarray


class DecodeLayers:
    """Every layer of a v7 CpuModel for a decoding step (each row the next token of its own
    slot), a compiled call per layer."""

    def __init__(self, blocks):
        self.weights = [block_weights(block) for block in blocks]
        self._entries = [None] * len(blocks)

    @staticmethod
    def of(blocks) -> DecodeLayers | None:
        """The fused layers of a v7 model, or None (no numba, another version, or a matrix
        in a form without compiled kernels)."""
        if _layer is None or not blocks or not isinstance(blocks[0].time_mix, TimeMix7):
            return None
        layers = DecodeLayers(blocks)
        return layers if all(w is not None for w in layers.weights) else None

    def __call__(self, x: np.ndarray, layers, plan) -> np.ndarray:
        """x [M, C] through every layer, plan's segments in order (a decoding step: a token a
        slot, or a few of one slot's); `layers` are the pool's LayerSlots per layer."""
        if len(plan.single_slots) == len(x):
            slots = np.ascontiguousarray(plan.slots, dtype=np.int64)
        else:
            slots = np.repeat(plan.slots, plan.stops - plan.starts).astype(np.int64)
        rows = np.array(x, dtype=np.float32)
        v_first = np.empty_like(rows)
        for i, (weights, parts) in enumerate(zip(self.weights, layers)):
            args = (rows, SlotState(slots, parts.att_shift, parts.wkv, parts.ffn_shift), v_first, i == 0, weights)
            if self._entries[i] is None:
                # Compiled (or loaded from the cache) before taking LAUNCH: a compile takes
                # ~35 s cold, and a model serving beside this one would wait that long.
                _layer.compile(tuple(_layer.typeof_pyval(a) for a in args))
            with LAUNCH:
                self._run(i, args)
        return rows

    def _run(self, i: int, args) -> None:
        """Layer i on `args`. numba's dispatcher works out the type of every argument at
        every call, and named tuples it types in Python: 20 µs a layer for these, a quarter
        of a millisecond a token. Their types never change between steps (the rows, slots
        and v_first are made above, the state's arrays are the pool's), so after the first
        call layer i goes straight to the compiled function of that call's types."""
        entry = self._entries[i]
        if entry is not None:
            entry(*args)
            return
        _layer(*args)  # compiles it, or loads it from numba's cache
        compiled = _layer.overloads.get(tuple(_layer.typeof_pyval(a) for a in args))
        self._entries[i] = compiled.entry_point if compiled is not None else _layer


def _unused_like(matrix):
    """A matrix of `matrix`'s type with no rows: the first layer's value LoRA, never multiplied."""
    if isinstance(matrix, np.ndarray):
        return matrix[:0]
    return type(matrix)(matrix.q[:0], matrix.scales[:0], 0)  # bf16 panels (the LoRAs' only other form)


def block_weights(block) -> BlockWeights | None:
    """A built Block's weights as `layer` takes them; None if a matrix is in a form without
    compiled kernels."""
    tm, cm = block.time_mix, block.channel_mix
    lora = tm.lora
    values = [lora["v1"], lora["v2"]] if "v1" in lora else [_unused_like(lora["w1"]), _unused_like(lora["w2"])]
    matrices = [tm.W["receptance"], tm.W["key"], tm.W["value"], tm.W["output"], lora["w1"], lora["w2"],
                lora["a1"], lora["a2"], lora["g1"], lora["g2"], *values, cm.W["key"], cm.W["value"]]
    if any(form_of(m).direct_kernel is None for m in matrices):
        return None
    Wr, Wk, Wv, Wo, w1, w2, a1, a2, g1, g2, v1, v2, Fk, Fv = (form_of(m).compiled(m) for m in matrices)
    own = lambda v: np.array(v, dtype=np.float32)  # own copies: one compiled type
    time_mix = TimeMixWeights(own(tm.mix[:, 0, :]), tm.heads, Wr, Wk, Wv, Wo, w1, w2, a1, a2, g1, g2, v1, v2)
    channel_mix = ChannelMixWeights(own(cm.mix).reshape(1, -1), Fk, Fv)
    return BlockWeights(own(block.ln1[0]), own(block.ln1[1]), own(block.ln2[0]), own(block.ln2[1]), time_mix,
                        channel_mix)
