"""An RNN state as one compact blob that names the model it belongs to.

A shared store hands states to every replica, and a state read by other weights than the
ones that made it gives wrong answers without any error. So the blob carries the model's
fingerprint (identity.fingerprint) in its header, and reading it back for another
fingerprint gives nothing. Layout: MAGIC, the header's length (u32, little-endian), the
header (msgpack: fingerprint, then dtype and shape of each part), then each part's raw
bytes, C order: no compression (RNN states are dense floats) and no pickling.
"""

from __future__ import annotations

import struct

import msgspec
import numpy as np

from ..rwkv.state import State

MAGIC = b"ai00st1\n"
_LENGTH = struct.Struct("<I")


class _Part(msgspec.Struct, array_like=True):
    dtype: str  # numpy's spelling with byte order, e.g. "<f4"
    shape: tuple[int, ...]


class _Header(msgspec.Struct, array_like=True):
    fingerprint: str
    parts: list[_Part]  # att_shift, wkv, ffn_shift


_encode_header = msgspec.msgpack.Encoder().encode
_decode_header = msgspec.msgpack.Decoder(_Header).decode


def encode_state(state: State, fingerprint: str) -> bytes:
    arrays = [np.ascontiguousarray(a) for a in state.parts()]
    header = _encode_header(_Header(fingerprint, [_Part(a.dtype.str, a.shape) for a in arrays]))
    return b"".join([MAGIC, _LENGTH.pack(len(header)), header, *(a.tobytes() for a in arrays)])


def decode_state(blob: bytes, fingerprint: str) -> State | None:
    """The state in `blob`, or None when it belongs to another model than `fingerprint`.
    ValueError when `blob` is not a state blob (or a damaged one)."""
    if not blob.startswith(MAGIC) or len(blob) < len(MAGIC) + _LENGTH.size:
        raise ValueError("not a state blob")
    start = len(MAGIC) + _LENGTH.size
    (length,) = _LENGTH.unpack_from(blob, len(MAGIC))
    try:
        header = _decode_header(blob[start:start + length])
    except msgspec.DecodeError as e:
        raise ValueError(f"a state blob with a damaged header: {e}") from None
    if header.fingerprint != fingerprint:
        return None
    # One writable copy of the payload (the engine may write into a state it is given),
    # which the parts then view without copying again.
    payload, offset, arrays = bytearray(memoryview(blob)[start + length:]), 0, []
    for part in header.parts:
        try:
            dtype = np.dtype(part.dtype)
        except TypeError:
            dtype = None
        if dtype is None or dtype.kind != "f":
            raise ValueError(f"a state blob with parts of type {part.dtype!r}")
        count = int(np.prod(part.shape, dtype=np.int64))
        if offset + count * dtype.itemsize > len(payload):
            raise ValueError("a truncated state blob")
        arrays.append(np.frombuffer(payload, dtype, count, offset).reshape(part.shape))
        offset += count * dtype.itemsize
    if len(arrays) != 3 or offset != len(payload):
        raise ValueError("a state blob whose parts do not match its header")
    return State(*arrays)
