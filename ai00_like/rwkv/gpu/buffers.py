"""Weights as GPU buffers: small vectors as float32, matrices in a storage format (fp32, fp16,
or the Int8/NF4 blocks of quant.py) and split by rows where one binding cannot hold them."""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import wgpu

from ..quant import ALIGN, QuantisedMatrix
from .device import Device

STORAGE = wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_DST | wgpu.BufferUsage.COPY_SRC
BYTES_PER_WEIGHT = {"fp32": 4, "fp16": 2, "int8": 1.04, "nf4": 0.54}  # with the block scales


@dataclass(frozen=True)
class Part:
    """Consecutive rows of a matrix in one buffer (with their own quantisation blocks)."""

    buffer: object
    first: int
    rows: int
    scales: object = None  # the block scales of int8 / nf4


@dataclass(frozen=True)
class Matrix:
    """A [rows, cols] weight matrix on the GPU in one of the storage formats, split by rows
    into parts when it is larger than the adapter lets one binding be."""

    parts: tuple[Part, ...]
    rows: int
    cols: int
    format: str  # fp32, fp16, int8, nf4: how the kernels read it (recorder.WEIGHT_ACCESS)

    @property
    def nbytes(self) -> int:
        return sum(p.buffer.size + (p.scales.size if p.scales is not None else 0) for p in self.parts)


class Uploader:
    """Puts weights on one device: matrices in `precision` unless they come quantised."""

    def __init__(self, gpu: Device, precision: str = "fp32", max_binding: int | None = None):
        self.device, self.precision = gpu.device, precision
        self.binding = gpu.limits["max-storage-buffer-binding-size"]
        if max_binding:
            self.binding = min(self.binding, max_binding)

    def buffer(self, floats: int):
        """An empty buffer of `floats` float32 values."""
        return self.device.create_buffer(size=max(4, 4 * floats), usage=STORAGE)

    def vector(self, array: np.ndarray):
        """float32 values, padded with zeros to 16 bytes (the kernels read some as vec4)."""
        data = np.ascontiguousarray(array, dtype=np.float32).reshape(-1)
        data = np.pad(data, (0, -len(data) % 4))
        return self.device.create_buffer_with_data(data=data, usage=STORAGE)

    def matrix(self, weights: np.ndarray | QuantisedMatrix) -> Matrix:
        """A [M, K] matrix ([out, in], as the checkpoints store projections) in the uploader's
        precision, or in its quantised format."""
        fmt = weights.kind if isinstance(weights, QuantisedMatrix) else self.precision
        rows, cols = weights.shape
        row_bytes = cols * BYTES_PER_WEIGHT[fmt]
        per_part = max(1, int(self.binding // row_bytes) - 1)  # one row of slack for padding and scales
        if fmt in ("int8", "nf4"):  # parts begin at a block boundary
            step = ALIGN // math.gcd(cols, ALIGN)
            per_part = max(step, per_part // step * step)
        parts = tuple(self._part(weights, first, min(per_part, rows - first))
                      for first in range(0, rows, per_part))
        return Matrix(parts, rows, cols, fmt)

    def _part(self, weights: np.ndarray | QuantisedMatrix, first: int, rows: int) -> Part:
        if isinstance(weights, QuantisedMatrix):
            packed, scales = weights.rows(first, rows)
            return Part(self._words(packed), first, rows, self._words(scales))
        weights = weights[first : first + rows]
        if self.precision == "fp32":
            return Part(self.vector(weights), first, rows)
        halves = np.ascontiguousarray(weights, dtype=np.float16).reshape(-1)  # f16 pairs, eight per 16 bytes
        halves = np.pad(halves, (0, -len(halves) % 8))
        return Part(self._words(halves.view(np.uint32)), first, rows)

    def _words(self, array: np.ndarray):
        return self.device.create_buffer_with_data(data=np.ascontiguousarray(array), usage=STORAGE)
