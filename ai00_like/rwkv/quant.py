"""Block quantisation of the projection matrices (rwkv-spec §6), shared by both backends.

Int8: blocks of 128 consecutive weights (of the row-major [out, in] matrix), per block
(min, max) as two f16 in one u32, each weight q = round(255·(w − min)/(max − min)), four per
u32 (WGSL unpack4x8unorm order). NF4: blocks of 64, per block absmax as f16 (two per u32),
each w/absmax as the index of the nearest of 16 NormalFloat levels (ties to the higher),
eight per u32, low nibble first.

A quantised matrix travels through the program as a `QuantisedMatrix` in the model's tensor
dict: the GPU backend uploads its packed words as they are, the numpy backend keeps both
packed for its kernels (cpu/int8.py, cpu/nf4.py), and saving writes the packed words
(formats/prefab.py), so a saved model loads back without quantising again.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from .formats import as_float, release_pages
from .weights import PRECISIONS, PROJECTION

QUANT_TYPES = ("int8", "nf4")
BLOCK = {"int8": 128, "nf4": 64}
ALIGN = 128  # elements: a chunk of this many starts a new block and a new u32 of scales in both formats
CHUNK = 1 << 20  # elements quantised at a time (bounds the temporaries)
NF4_LEVELS = np.array([
    -1.0, -0.6961928, -0.5250731, -0.3949175, -0.2844414, -0.1847734, -0.0910500, 0.0,
    0.0795803, 0.1609302, 0.2461123, 0.3379152, 0.4407098, 0.5626170, 0.7229568, 1.0,
], dtype=np.float32)
_NF4_MIDPOINTS = (NF4_LEVELS[1:] + NF4_LEVELS[:-1]) / 2


def quant_options(precision: str, quant: int, quant_type: str) -> tuple[str, int, str]:
    """Ai00's spellings ("Fp16", "Int8", "NF4", "None") as ours ("fp16", 8, "nf4"); quant 0
    or quant_type "none" means no quantisation. Raises ValueError naming the bad value."""
    precision, kind = str(precision).lower(), str(quant_type).lower()
    if precision not in PRECISIONS:
        raise ValueError(f"unknown precision {precision!r}; expected auto, fp32, fp16 or bf16")
    if not isinstance(quant, int) or quant < 0:
        raise ValueError(f"quant must be a number of layers >= 0, got {quant!r}")
    if kind in ("none", ""):
        return precision, 0, "int8"
    if kind not in QUANT_TYPES:
        hint = " (Ai00's SF4 is not implemented)" if kind == "sf4" else ""
        raise ValueError(f"unknown quant_type {quant_type!r}; expected Int8, NF4 or None{hint}")
    return precision, quant, kind


def _f16_pairs(values: np.ndarray) -> np.ndarray:
    halves = values.astype(np.float16).reshape(-1)
    return np.pad(halves, (0, len(halves) % 2)).view(np.uint32)


def _blocks(flat: np.ndarray, size: int) -> np.ndarray:
    return np.pad(flat, (0, -len(flat) % size)).reshape(-1, size)


def _int8(flat: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    blocks = _blocks(flat, BLOCK["int8"])
    # the kernels dequantise with the f16-rounded bounds, so quantise against those
    low = blocks.min(axis=1).astype(np.float16).astype(np.float32)[:, None]
    high = blocks.max(axis=1).astype(np.float16).astype(np.float32)[:, None]
    span = np.where(high > low, high - low, 1.0)
    q = np.floor(0.5 + 255.0 * np.clip((blocks - low) / span, 0.0, 1.0)).astype(np.uint8)
    return q.reshape(-1).view(np.uint32), _f16_pairs(np.concatenate([low, high], axis=1))


def _nf4(flat: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    blocks = _blocks(flat, BLOCK["nf4"])
    absmax = np.abs(blocks).max(axis=1).astype(np.float16).astype(np.float32)[:, None]
    scaled = blocks / np.where(absmax > 0, absmax, 1.0)
    q = np.searchsorted(_NF4_MIDPOINTS, scaled, side="right").astype(np.uint32)  # ties → the higher level
    words = np.zeros(q.size // 8, dtype=np.uint32)
    for e, nibbles in enumerate(q.reshape(-1, 8).T):
        words |= nibbles << np.uint32(4 * e)
    return words, _f16_pairs(absmax)


def quantise(kind: str, weights: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(packed weights, packed block scales) as uint32 arrays, CHUNK elements at a time."""
    flat = np.asarray(weights).reshape(-1)
    step = {"int8": _int8, "nf4": _nf4}[kind]
    parts = []
    for i in range(0, len(flat), CHUNK):
        # bf16 arrives as its bit patterns (formats.BF16): widened a chunk at a time like the rest
        chunk = flat[i : i + CHUNK]
        parts.append(step(np.asarray(as_float(chunk), dtype=np.float32)))
        release_pages(chunk)  # a mapped file's pages, done with (an fp32 file's stayed resident)
    return np.concatenate([p[0] for p in parts]), np.concatenate([p[1] for p in parts])


def dequantise(kind: str, packed: np.ndarray, scales: np.ndarray, n: int) -> np.ndarray:
    """The n weights the kernels see, as float32."""
    if kind == "int8":
        q = packed.view(np.uint8).astype(np.float32).reshape(-1, BLOCK["int8"])
        low, high = scales.view(np.float16).astype(np.float32).reshape(-1, 2)[: len(q)].T
        return (low[:, None] + (high - low)[:, None] * q / 255.0).reshape(-1)[:n]
    nibbles = (packed[:, None] >> (4 * np.arange(8, dtype=np.uint32))) & 15
    absmax = scales.view(np.float16).astype(np.float32)[: nibbles.size // BLOCK["nf4"]]
    return (NF4_LEVELS[nibbles.reshape(-1, BLOCK["nf4"])] * absmax[:, None]).reshape(-1)[:n]


def words_for(kind: str, elements: int) -> tuple[int, int]:
    """How many u32 of packed weights and of scales hold `elements` (a multiple of ALIGN)."""
    blocks = elements // BLOCK[kind]
    return elements // (4 if kind == "int8" else 8), blocks if kind == "int8" else blocks // 2


class QuantisedMatrix:
    """A [rows, cols] matrix as quantised blocks. numpy sees the dequantised float32 matrix
    (`np.asarray(m)`), so code written for plain arrays runs on it unchanged."""

    ndim = 2
    dtype = np.dtype(np.float32)

    def __init__(self, kind: str, packed: np.ndarray, scales: np.ndarray, shape: tuple[int, int]):
        self.kind, self.packed, self.scales, self.shape = kind, packed, scales, tuple(shape)

    @classmethod
    def of(cls, kind: str, weights) -> QuantisedMatrix:
        return cls(kind, *quantise(kind, weights), np.shape(weights))

    @property
    def size(self) -> int:
        return self.shape[0] * self.shape[1]

    @property
    def nbytes(self) -> int:
        return self.packed.nbytes + self.scales.nbytes

    def __array__(self, dtype=None, copy=None):
        return dequantise(self.kind, self.packed, self.scales, self.size).reshape(self.shape).astype(
            dtype or np.float32, copy=False)

    def rows(self, first: int, count: int) -> tuple[np.ndarray, np.ndarray]:
        """The packed words and scales of rows [first, first + count); `first · cols` must be a
        multiple of ALIGN (count may run to the end)."""
        start, stop = first * self.shape[1], min(self.size, (first + count) * self.shape[1])
        assert start % ALIGN == 0, "parts of a quantised matrix start at a block boundary"
        w0, s0 = words_for(self.kind, start)
        w1, s1 = words_for(self.kind, -(-stop // ALIGN) * ALIGN)
        return self.packed[w0:w1], self.scales[s0:s1]


HEAD = "head.weight"
HEAD_KIND = "int8"  # the head's blocks whatever the layers' type (see quantise_tensors)


def quantise_tensors(tensors: Mapping[str, np.ndarray], layers: int, kind: str, *, head: bool = False) -> dict:
    """`tensors` with the projections of the first `layers` layers as QuantisedMatrix (those
    that already are stay as they are), and with `head` the head as Int8 blocks.

    The head (vocabulary × embedding, the largest matrix) turns the last layer into logits,
    where a 4-bit error moves every token's score: it is Int8 even in an NF4 model, as
    llama.cpp keeps its 4-bit models' output matrix at 6 bits."""
    out = dict(tensors)
    for name, weights in tensors.items():
        match = PROJECTION.match(name)
        if match and int(match.group(1)) < layers and not isinstance(weights, QuantisedMatrix):
            out[name] = QuantisedMatrix.of(kind, weights)
    if head and not isinstance(tensors[HEAD], QuantisedMatrix):
        out[HEAD] = QuantisedMatrix.of(HEAD_KIND, tensors[HEAD])
    return out


def head_quantised(tensors: Mapping[str, object]) -> bool:
    return isinstance(tensors.get(HEAD), QuantisedMatrix)


def quantisation_of(tensors: Mapping[str, object]) -> tuple[int, str]:
    """(how many leading layers are quantised, their type) of a model's tensors; (0, "none")."""
    found = [(int(m.group(1)), a.kind) for name, a in tensors.items()
             if isinstance(a, QuantisedMatrix) and (m := PROJECTION.match(name))]
    return (max(layer for layer, _ in found) + 1, found[0][1]) if found else (0, "none")
