"""Block quantisation of weight matrices for the GPU kernels (rwkv-spec §6).

Int8: blocks of 128 consecutive weights, per block (min, max) as two f16 in one u32, each
weight q = round(255·(w − min)/(max − min)), four per u32 (WGSL unpack4x8unorm order).
NF4: blocks of 64, per block absmax as f16 (two per u32), each w/absmax as the index of the
nearest of 16 NormalFloat levels (ties to the higher), eight per u32, low nibble first.
Both return (packed weights, packed block scales) as uint32 arrays.
"""

from __future__ import annotations

import numpy as np

QUANT_TYPES = ("int8", "nf4")
INT8_BLOCK, NF4_BLOCK = 128, 64
NF4_LEVELS = np.array([
    -1.0, -0.6961928, -0.5250731, -0.3949175, -0.2844414, -0.1847734, -0.0910500, 0.0,
    0.0795803, 0.1609302, 0.2461123, 0.3379152, 0.4407098, 0.5626170, 0.7229568, 1.0,
], dtype=np.float32)


def _blocks(weights: np.ndarray, size: int) -> np.ndarray:
    flat = np.asarray(weights, dtype=np.float32).reshape(-1)
    return np.pad(flat, (0, -len(flat) % size)).reshape(-1, size)


def _f16_pairs(values: np.ndarray) -> np.ndarray:
    halves = values.astype(np.float16).reshape(-1)
    return np.pad(halves, (0, len(halves) % 2)).view(np.uint32)


def quantise_int8(weights: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    blocks = _blocks(weights, INT8_BLOCK)
    # the kernel dequantises with the f16-rounded bounds, so quantise against those
    low = blocks.min(axis=1).astype(np.float16).astype(np.float32)[:, None]
    high = blocks.max(axis=1).astype(np.float16).astype(np.float32)[:, None]
    span = np.where(high > low, high - low, 1.0)
    q = np.floor(0.5 + 255.0 * np.clip((blocks - low) / span, 0.0, 1.0)).astype(np.uint8)
    return q.reshape(-1).view(np.uint32), _f16_pairs(np.concatenate([low, high], axis=1))


def quantise_nf4(weights: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    blocks = _blocks(weights, NF4_BLOCK)
    absmax = np.abs(blocks).max(axis=1).astype(np.float16).astype(np.float32)[:, None]
    scaled = blocks / np.where(absmax > 0, absmax, 1.0)
    distance = np.abs(scaled[..., None] - NF4_LEVELS)  # [blocks, 64, 16]
    q = (15 - np.argmin(distance[..., ::-1], axis=-1)).astype(np.uint32)  # ties → the higher level
    words = np.zeros(q.size // 8, dtype=np.uint32)
    for e, nibbles in enumerate(q.reshape(-1, 8).T):
        words |= nibbles << np.uint32(4 * e)
    return words, _f16_pairs(absmax)


def dequantise(kind: str, packed: np.ndarray, scales: np.ndarray, n: int) -> np.ndarray:
    """The weights the kernels see (for tests and error reports)."""
    if kind == "int8":
        q = packed.view(np.uint8).astype(np.float32).reshape(-1, INT8_BLOCK)
        low, high = scales.view(np.float16).astype(np.float32).reshape(-1, 2)[: len(q)].T
        return (low[:, None] + (high - low)[:, None] * q / 255.0).reshape(-1)[:n]
    nibbles = (packed[:, None] >> (4 * np.arange(8, dtype=np.uint32))) & 15
    absmax = scales.view(np.float16).astype(np.float32)[: nibbles.size // NF4_BLOCK]
    return (NF4_LEVELS[nibbles.reshape(-1, NF4_BLOCK)] * absmax[:, None]).reshape(-1)[:n]
