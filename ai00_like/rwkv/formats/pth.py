"""Official PyTorch `.pth` checkpoints, read and written without torch (rwkv-spec §1.1, §9.2).

A `.pth` is a zip archive: `<root>/data.pkl` pickles the state dict, and every tensor's
storage is a raw little-endian member `<root>/data/<key>`. torch writes the archive
uncompressed with each member's data aligned to 64 bytes, so a storage is a contiguous
run of the file that can be mapped instead of read.

Pickle runs code by design: any global the stream names gets imported and called. The
unpickler below therefore resolves only an allow-list of names to our own harmless
stand-ins, and refuses the file at the first other name, before anything is called.
"""

from __future__ import annotations

import collections
import io
import pickle
import struct
import zipfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import ModelFileError
from . import BF16, STORAGE_DTYPES, as_float, cast_for_storage, map_file, view_of

# Storage classes torch names in the pickle, and the element type of their raw bytes.
# The integer and double ones are plain data too; allowing them lets a training checkpoint
# that carries e.g. a step counter load, while the state dict check below still refuses
# them as weights with a clear message.
_STORAGE_DTYPES: dict[str, np.dtype] = {
    "BFloat16Storage": BF16,
    "HalfStorage": np.dtype("<f2"),
    "FloatStorage": np.dtype("<f4"),
    "DoubleStorage": np.dtype("<f8"),
    "LongStorage": np.dtype("<i8"),
    "IntStorage": np.dtype("<i4"),
    "ShortStorage": np.dtype("<i2"),
    "CharStorage": np.dtype("i1"),
    "ByteStorage": np.dtype("u1"),
    "BoolStorage": np.dtype("?"),
}
_WRITE_STORAGE = {"bf16": "BFloat16Storage", "fp16": "HalfStorage", "fp32": "FloatStorage"}
_WEIGHT_DTYPES = (np.dtype("<f4"), np.dtype("<f2"), BF16)

# What zipfile raises for damaged archives: bad structures, unsupported versions or
# compression methods (NotImplementedError), encrypted members (RuntimeError), short reads.
_ZIP_ERRORS = (zipfile.BadZipFile, NotImplementedError, RuntimeError, OSError, EOFError, ValueError)

_LOCAL_HEADER = b"PK\x03\x04"
_LOCAL_HEADER_SIZE = 30
_ALIGNMENT = 64  # what torch uses; lets readers map fp32/fp16 storages in place


class _StorageType:
    """Stands in for `torch.<Name>Storage` in the pickle: only says the element type."""

    def __init__(self, name: str):
        self.name = name
        self.dtype = _STORAGE_DTYPES[name]


class _Storage:
    """One storage of the archive: a flat array over its bytes (mapped when possible)."""

    def __init__(self, data: np.ndarray):
        self.data = data


class _TensorShape:
    """What `_rebuild_tensor_v2` returns when only shapes are wanted: no data is touched."""

    def __init__(self, shape: tuple[int, ...], dtype: np.dtype):
        self.shape = shape
        self.dtype = dtype


# --------------------------------------------------------------------------- reading


def read_pth(path: str | Path, *, keep_bf16: bool = False) -> dict[str, np.ndarray]:
    """The state dict of an official `.pth` checkpoint, as numpy arrays.

    fp32 and fp16 tensors are read-only views of the mapped file (no copy). bf16 tensors
    are widened to fp32, or with `keep_bf16=True` stay mapped as `formats.BF16` patterns.
    A training checkpoint's `{"state_dict": ...}` wrapper is unwrapped. Entries that
    are not tensors are skipped; a tensor that is not float is refused (ModelFileError).
    """
    with _PthArchive(path) as archive:
        state = archive.load(shapes_only=False)
    for name, arr in state.items():
        _check_weight_dtype(path, name, arr.dtype)
    return state if keep_bf16 else {name: as_float(arr) for name, arr in state.items()}


def read_pth_shapes(path: str | Path) -> dict[str, tuple[int, ...]]:
    """Tensor names and shapes of a `.pth` without touching any weight data."""
    with _PthArchive(path) as archive:
        state = archive.load(shapes_only=True)
    for name, tensor in state.items():
        _check_weight_dtype(path, name, tensor.dtype)
    return {name: tensor.shape for name, tensor in state.items()}


def _check_weight_dtype(path, name: str, dtype: np.dtype) -> None:
    if dtype not in _WEIGHT_DTYPES:
        problem = f"tensor '{name}' has dtype {dtype}; only float32, float16 and bfloat16 are supported"
        raise ModelFileError(path, problem)


class _PthArchive:
    """A torch zip archive opened for reading; `load()` runs the restricted unpickler once."""

    def __init__(self, path: str | Path):
        self.path = path
        self.mapped = map_file(path)
        try:
            # zipfile gets its own file handle for the small members (directory, data.pkl);
            # the storages are taken from the mapping.
            self.zip = zipfile.ZipFile(path)
        except _ZIP_ERRORS as e:
            raise ModelFileError(path, f"corrupt or truncated PyTorch zip archive ({e})") from None
        self.storages: dict[str, _Storage] = {}
        try:
            self.root = self._find_root()
        except BaseException:
            self.zip.close()
            raise

    def __enter__(self) -> _PthArchive:
        return self

    def __exit__(self, *exc) -> None:
        self.zip.close()

    def _find_root(self) -> str:
        pickles = [n for n in self.zip.namelist() if n.endswith("/data.pkl") and n.count("/") == 1]
        if len(pickles) != 1:
            raise ModelFileError(self.path, "not a PyTorch checkpoint: the zip has no '<name>/data.pkl'")
        root = pickles[0][: -len("/data.pkl")]
        byteorder = f"{root}/byteorder"
        if byteorder in self.zip.namelist() and self._read_member(byteorder).strip() != b"little":
            raise ModelFileError(self.path, "big-endian checkpoints are not supported")
        return root

    def _read_member(self, name: str) -> bytes:
        try:
            return self.zip.read(name)
        except _ZIP_ERRORS as e:
            raise ModelFileError(self.path, f"corrupt PyTorch archive: cannot read {name} ({e})") from None

    def load(self, *, shapes_only: bool) -> dict[str, Any]:
        pickled = self._read_member(f"{self.root}/data.pkl")
        unpickler = _RestrictedUnpickler(self, pickled, shapes_only)
        try:
            obj = unpickler.load()
        except ModelFileError:
            raise
        except Exception as e:  # noqa: BLE001 - an untrusted pickle can fail in any way
            raise ModelFileError(self.path, f"corrupt checkpoint pickle ({type(e).__name__}: {e})") from None
        return self._state_dict(obj, shapes_only)

    def _state_dict(self, obj: Any, shapes_only: bool) -> dict[str, Any]:
        if isinstance(obj, Mapping) and "state_dict" in obj and isinstance(obj["state_dict"], Mapping):
            obj = obj["state_dict"]  # a training checkpoint
        if not isinstance(obj, Mapping):
            raise ModelFileError(self.path, f"not a state dict: the pickle holds a {type(obj).__name__}")
        kind = _TensorShape if shapes_only else np.ndarray
        tensors = {str(k): v for k, v in obj.items() if isinstance(v, kind)}
        if not tensors:
            raise ModelFileError(self.path, "the checkpoint holds no tensors")
        return tensors

    def storage(self, key: str, dtype: np.dtype, numel: int) -> _Storage:
        if key not in self.storages:
            self.storages[key] = _Storage(self._storage_array(key, dtype, numel))
        return self.storages[key]

    def _storage_array(self, key: str, dtype: np.dtype, numel: int) -> np.ndarray:
        member = f"{self.root}/data/{key}"
        try:
            info = self.zip.getinfo(member)
        except KeyError:
            problem = f"corrupt checkpoint: storage '{key}' is missing from the archive"
            raise ModelFileError(self.path, problem) from None
        need = numel * dtype.itemsize
        if info.file_size < need:
            raise ModelFileError(
                self.path, f"corrupt checkpoint: storage '{key}' has {info.file_size} bytes, the tensor needs {need}"
            )
        if info.compress_type == zipfile.ZIP_STORED:
            start = self._data_offset(info)
            if start + need > len(self.mapped):
                problem = f"truncated: storage '{key}' ends at byte {start + need}, the file has {len(self.mapped)}"
                raise ModelFileError(self.path, problem)
            return view_of(self.mapped, start, dtype, numel)
        # A re-zipped (compressed) archive cannot be mapped; read it into memory instead.
        return np.frombuffer(self._read_member(member), dtype=dtype, count=numel)

    def _data_offset(self, info: zipfile.ZipInfo) -> int:
        # The local header's name and extra field lengths can differ from the central
        # directory's (torch pads the local one), so read them where the data starts.
        header = self.mapped[info.header_offset : info.header_offset + _LOCAL_HEADER_SIZE]
        if len(header) < _LOCAL_HEADER_SIZE or header[:4] != _LOCAL_HEADER:
            raise ModelFileError(self.path, f"corrupt zip: bad local header for '{info.filename}'")
        name_len, extra_len = struct.unpack("<HH", header[26:30])
        return info.header_offset + _LOCAL_HEADER_SIZE + name_len + extra_len

    def rebuild_tensor(self, storage, offset, size, stride, *_unused) -> np.ndarray:
        shape, strides = _checked_geometry(self.path, storage, offset, size, stride)
        flat = storage.data
        count = int(np.prod(shape, dtype=np.int64))
        if strides == _contiguous_strides(shape):
            return flat[offset : offset + count].reshape(shape)
        itemsize = flat.dtype.itemsize
        return np.lib.stride_tricks.as_strided(
            flat[offset:], shape=shape, strides=[s * itemsize for s in strides], writeable=False
        )


def _contiguous_strides(shape: tuple[int, ...]) -> tuple[int, ...]:
    strides, step = [], 1
    for dim in reversed(shape):
        strides.append(step)
        step *= max(dim, 1)
    return tuple(reversed(strides))


def _checked_geometry(path, storage, offset, size, stride) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """Validate a tensor's view of its storage: a bad one would read outside the file."""

    def ints(x) -> bool:
        return isinstance(x, tuple) and all(isinstance(v, int) and v >= 0 for v in x)

    if not isinstance(storage, _Storage) or not isinstance(offset, int) or offset < 0:
        raise ModelFileError(path, "corrupt checkpoint: a tensor does not refer to a storage")
    if not ints(size) or not ints(stride) or len(size) != len(stride):
        raise ModelFileError(path, f"corrupt checkpoint: bad tensor shape {size!r} / stride {stride!r}")
    if all(size):
        last = offset + sum((n - 1) * s for n, s in zip(size, stride))
        if last >= storage.data.size:
            raise ModelFileError(
                path, f"corrupt checkpoint: a tensor of shape {size} reaches past its storage of {storage.data.size}"
            )
    return size, stride


class _RestrictedUnpickler(pickle.Unpickler):
    """Resolves only the names a plain torch state dict needs; refuses every other import."""

    def __init__(self, archive: _PthArchive, data: bytes, shapes_only: bool):
        super().__init__(io.BytesIO(data))
        self.archive = archive
        self.shapes_only = shapes_only

    def find_class(self, module: str, name: str) -> Any:
        if module == "collections" and name == "OrderedDict":
            return collections.OrderedDict
        if module == "torch._utils" and name in ("_rebuild_tensor_v2", "_rebuild_parameter"):
            return self._rebuild_tensor if name == "_rebuild_tensor_v2" else _rebuild_parameter
        if module == "torch" and name in _STORAGE_DTYPES:
            return _StorageType(name)
        raise ModelFileError(self.archive.path, f"refuses to load: the pickle imports {module}.{name}")

    def persistent_load(self, pid: Any) -> Any:
        if not (isinstance(pid, tuple) and len(pid) == 5 and pid[0] == "storage"):
            raise ModelFileError(self.archive.path, "corrupt checkpoint: unknown persistent id in the pickle")
        _, storage_type, key, _location, numel = pid
        if not isinstance(storage_type, _StorageType) or not isinstance(numel, int) or numel < 0:
            raise ModelFileError(self.archive.path, "corrupt checkpoint: bad storage reference in the pickle")
        if self.shapes_only:
            return _Storage(np.broadcast_to(np.zeros((), storage_type.dtype), (numel,)))
        return self.archive.storage(str(key), storage_type.dtype, numel)

    def _rebuild_tensor(self, storage, offset, size, stride, *rest):
        if self.shapes_only:
            shape, _ = _checked_geometry(self.archive.path, storage, offset, size, stride)
            return _TensorShape(shape, storage.data.dtype)
        return self.archive.rebuild_tensor(storage, offset, size, stride, *rest)


def _rebuild_parameter(data, _requires_grad=False, _hooks=None):
    # nn.Parameter wraps a tensor; the tensor is all a checkpoint reader needs.
    return data


# --------------------------------------------------------------------------- writing


def write_pth(tensors: Mapping[str, np.ndarray], path: str | Path, dtype: str = "bf16") -> None:
    """Write a flat state dict as a `.pth` that `torch.load` accepts (no torch needed).

    `dtype` is the storage type: "bf16" (what official releases use), "fp16" or "fp32".
    Tensors are written in the order given; shapes are kept (`[1,1,C]` stays 3-D).
    """
    if dtype not in STORAGE_DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; expected one of {STORAGE_DTYPES}")
    storage_name = _WRITE_STORAGE[dtype]
    root = "archive"  # torch.load takes whatever single top-level folder the zip has
    try:
        with zipfile.ZipFile(path, "w", compression=zipfile.ZIP_STORED) as zf:
            records = [(name, np.shape(arr)) for name, arr in tensors.items()]
            _write_member(zf, f"{root}/data.pkl", _state_dict_pickle(records, storage_name))
            _write_member(zf, f"{root}/byteorder", b"little")
            for key, (name, arr) in enumerate(tensors.items()):
                data = cast_for_storage(arr, dtype, name, path)
                _write_member(zf, f"{root}/data/{key}", data.reshape(-1).view(np.uint8))
            _write_member(zf, f"{root}/version", b"3\n")
    except BaseException:
        Path(path).unlink(missing_ok=True)  # a half-written file would only fail later
        raise


def _write_member(zf: zipfile.ZipFile, name: str, data: bytes | np.ndarray) -> None:
    """Store one uncompressed member whose data starts on a 64-byte boundary."""
    size = len(data) if isinstance(data, bytes) else data.nbytes
    info = zipfile.ZipInfo(name, date_time=(1980, 1, 1, 0, 0, 0))
    info.compress_type = zipfile.ZIP_STORED
    info.file_size = size
    zip64_extra = 20 if size * 1.05 > zipfile.ZIP64_LIMIT else 0  # zipfile adds this itself
    start = zf.fp.tell() + _LOCAL_HEADER_SIZE + len(name.encode()) + zip64_extra
    info.extra = _padding_extra(-start % _ALIGNMENT)
    with zf.open(info, "w", force_zip64=zip64_extra > 0) as out:
        out.write(data if isinstance(data, bytes) else memoryview(data))


def _padding_extra(gap: int) -> bytes:
    # An extra field is a 4-byte header plus payload, so gaps of 1–3 bytes need one more block.
    if gap == 0:
        return b""
    if gap < 4:
        gap += _ALIGNMENT
    return struct.pack("<HH", 0x5061, gap - 4) + b"\0" * (gap - 4)  # id "aP": padding only


def _state_dict_pickle(records: list[tuple[str, tuple[int, ...]]], storage_name: str) -> bytes:
    """The data.pkl torch writes for an OrderedDict of tensors, one storage per tensor.

    Emitted opcode by opcode because the standard Pickler would import torch to check
    the globals it names.
    """
    p = _PickleWriter()
    p.global_("collections", "OrderedDict")
    p.op(pickle.EMPTY_TUPLE + pickle.REDUCE)
    p.op(pickle.MARK)
    for key, (name, shape) in enumerate(records):
        numel = int(np.prod(shape, dtype=np.int64))
        p.string(name)
        p.global_("torch._utils", "_rebuild_tensor_v2")
        p.op(pickle.MARK)
        p.op(pickle.MARK)  # persistent id: ("storage", type, key, location, numel)
        p.string("storage")
        p.global_("torch", storage_name)
        p.string(str(key))
        p.string("cpu")
        p.integer(numel)
        p.op(pickle.TUPLE + pickle.BINPERSID)
        p.integer(0)  # storage offset
        p.int_tuple(shape)
        p.int_tuple(_contiguous_strides(tuple(shape)))
        p.op(pickle.NEWFALSE)  # requires_grad
        p.global_("collections", "OrderedDict")  # backward hooks
        p.op(pickle.EMPTY_TUPLE + pickle.REDUCE)
        p.op(pickle.TUPLE + pickle.REDUCE)
    p.op(pickle.SETITEMS + pickle.STOP)
    return p.getvalue()


class _PickleWriter:
    """Just enough of pickle protocol 2 to spell a torch state dict."""

    def __init__(self):
        self.buf = bytearray(pickle.PROTO + b"\x02")

    def op(self, opcodes: bytes) -> None:
        self.buf += opcodes

    def global_(self, module: str, name: str) -> None:
        self.buf += pickle.GLOBAL + f"{module}\n{name}\n".encode()

    def string(self, s: str) -> None:
        raw = s.encode("utf-8")
        self.buf += pickle.BINUNICODE + struct.pack("<I", len(raw)) + raw

    def integer(self, v: int) -> None:
        if -(2**31) <= v < 2**31:
            self.buf += pickle.BININT + struct.pack("<i", v)
        else:
            raw = v.to_bytes((v.bit_length() + 8) // 8, "little", signed=True)
            self.buf += pickle.LONG1 + bytes([len(raw)]) + raw

    def int_tuple(self, values: tuple[int, ...]) -> None:
        if not values:
            self.buf += pickle.EMPTY_TUPLE
            return
        self.buf += pickle.MARK
        for v in values:
            self.integer(int(v))
        self.buf += pickle.TUPLE

    def getvalue(self) -> bytes:
        return bytes(self.buf)


__all__ = ["read_pth", "read_pth_shapes", "write_pth"]
