"""Which weights a layer of each RWKV version has (rwkv-spec §2), and reading them as float32
or in the format they are stored in.

Both backends build their layers from these lists, so a version's projections and LoRAs are
named once: the numpy blocks (cpu/blocks.py) keep them as arrays, the GPU blocks
(gpu/blocks.py) upload them; quantisation and LoRA merging pick the projections by the same
pattern.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import numpy as np

from .formats import as_float, cast_for_storage, gather_rows, is_bf16, release_pages

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


# How a model keeps its matrices: "auto" keeps each file's own format.
PRECISIONS = ("auto", "fp32", "fp16", "bf16")


def precision_of(weights) -> str:
    """"bf16", "fp16" or "fp32": how a matrix is stored (a quantised one counts as fp32, the
    format its numpy form has)."""
    if isinstance(weights, np.ndarray) and is_bf16(weights):
        return "bf16"
    return "fp16" if getattr(weights, "dtype", None) == np.float16 else "fp32"


def file_precision(tensors: Mapping[str, np.ndarray]) -> str:
    """The format a checkpoint stores its large matrices in: that of its head, or of its
    embedding where the head is quantised (quant_head)."""
    head = tensors["head.weight"]
    return precision_of(head if isinstance(head, np.ndarray) else tensors["emb.weight"])


def stored(weights, precision: str, name: str = "", source: str = "the model", arena=None) -> np.ndarray:
    """A matrix as C-contiguous `precision` ("fp32", "fp16" or "bf16"): a view of the file
    when it is stored so, else converted once with its mapped pages dropped, tensor by
    tensor, so a load never holds two copies of the model. With an `arena` (cpu/arena.py)
    the matrix ends up in it: moved there from the file, or converted straight into it to
    16 bits. A quantised matrix stays as it is: each backend decides what form it
    multiplies."""
    if not isinstance(weights, np.ndarray):
        return weights
    if precision == "fp32":
        converted = as_float32(weights)
    else:
        converted = cast_for_storage(weights, precision, name, source, arena.room if arena is not None else None)
        if converted is not weights and converted.base is not weights:
            release_pages(weights)
    return arena.hold(converted) if arena is not None else converted


def embedding_rows(emb: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """The embedding's rows for `ids` as float32, whatever the table is stored as; only the
    rows read stay mapped (formats.gather_rows)."""
    return np.ascontiguousarray(as_float(gather_rows(emb, ids)), dtype=np.float32)


def as_float32(weights: np.ndarray) -> np.ndarray:
    """Weights as C-contiguous float32: an fp32 file is used in place, fp16 and bf16 ones are
    converted once (numpy converts fp16 far slower than it reads fp32) and their mapped
    pages dropped, tensor by tensor, so a load never holds two copies of the model."""
    converted = np.ascontiguousarray(as_float(weights), dtype=np.float32)
    if converted is not weights and converted.base is not weights:
        release_pages(weights)
    return converted


class LayerWeights:
    """One layer's tensors: vectors and small matrices as float32, the projections in
    `precision` (a memory-mapped file is used in place where it is stored so)."""

    def __init__(self, tensors: Mapping[str, np.ndarray], layer: int, precision: str = "fp32", arena=None):
        """`arena`: where the kept matrices are to live (the CPU's huge pages, cpu/arena.py);
        by default where `stored` leaves them."""
        self.tensors, self.prefix, self.layer, self.precision = tensors, f"blocks.{layer}.", layer, precision
        self.arena = arena

    def matrix(self, name: str) -> np.ndarray:
        return as_float32(self.tensors[self.prefix + name])

    def projection(self, name: str) -> np.ndarray:
        """An att/ffn projection, kept in the model's precision (or as its quantised blocks)."""
        return stored(self.tensors[self.prefix + name], self.precision, self.prefix + name, arena=self.arena)

    def low_rank(self, name: str) -> np.ndarray:
        """A LoRA factor (stored [in, out]) as [out, in] in the model's precision: the form
        `linear` reads, so a decode step streams it as it streams the projections."""
        return stored(np.ascontiguousarray(self.tensors[self.prefix + name].T), self.precision, self.prefix + name,
                      arena=self.arena)

    def vector(self, name: str) -> np.ndarray:
        return self.matrix(name).reshape(-1)

    def has(self, name: str) -> bool:
        return self.prefix + name in self.tensors

