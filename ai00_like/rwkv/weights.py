"""Which weights a layer of each RWKV version has (rwkv-spec §2), and reading them as float32.

Both backends build their layers from these lists, so a version's projections and LoRAs are
named once: the numpy blocks (cpu/blocks.py) keep them as arrays, the GPU blocks
(gpu/blocks.py) upload them; quantisation and LoRA merging pick the projections by the same
pattern.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import numpy as np

from .formats import as_float, release_pages

# The att/ffn projections: what quantisation applies to and LoRAs blend into with the user's
# alpha (Ai00 does the same; not the mix LoRAs, not the head).
PROJECTION = re.compile(r"^blocks\.([0-9]+)\.(att|ffn)\.(key|value|receptance|gate|output)\.weight$")


def att_projections(version: str) -> tuple[str, ...]:
    """The time mix's projections: 5.1 onwards gate the output, v7 with a LoRA instead."""
    gated = version in ("5.1", "5.2", "6")
    return ("receptance", "key", "value", "output") + (("gate",) if gated else ())


def ffn_projections(version: str) -> tuple[str, ...]:
    """The channel mix's projections: v7 has no receptance gate."""
    return ("key", "value") if version == "7" else ("receptance", "key", "value")


def v7_loras(layer: int) -> tuple[str, ...]:
    """v7's low-rank pairs (stored [in, out]); block 0's value-residual pair exists in files but
    is unused, its values being the residual itself."""
    return ("w1", "w2", "a1", "a2", "g1", "g2") + (("v1", "v2") if layer else ())


def as_float32(weights: np.ndarray) -> np.ndarray:
    """Weights as C-contiguous float32: an fp32 file is used in place, fp16 and bf16 ones are
    converted once (numpy converts fp16 far slower than it reads fp32) and their mapped
    pages dropped, tensor by tensor, so a load never holds two copies of the model."""
    converted = np.ascontiguousarray(as_float(weights), dtype=np.float32)
    if converted is not weights and converted.base is not weights:
        release_pages(weights)
    return converted


class LayerWeights:
    """One layer's tensors as float32 (a memory-mapped fp32 file is used in place)."""

    def __init__(self, tensors: Mapping[str, np.ndarray], layer: int):
        self.tensors, self.prefix, self.layer = tensors, f"blocks.{layer}.", layer

    def matrix(self, name: str) -> np.ndarray:
        return as_float32(self.tensors[self.prefix + name])

    def vector(self, name: str) -> np.ndarray:
        return self.matrix(name).reshape(-1)

    def has(self, name: str) -> bool:
        return self.prefix + name in self.tensors

