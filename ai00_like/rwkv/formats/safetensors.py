"""safetensors files (`.st`, `.safetensors`, Ai00's `.state`/`.lora`), mapped, and the
web-rwkv layout (rwkv-spec §1.1).

File format: an 8-byte little-endian header length, a JSON header
`{name: {dtype, shape, data_offsets: [begin, end]}, "__metadata__": {str: str}}`, then the
raw tensor bytes, offsets counted from the end of the header. We parse the header
ourselves (safetensors_header.py) and give every tensor as a read-only view of the mapped file: the `safetensors`
package's numpy API copies each tensor out of the file, which would hold the weights twice.

Layouts. "official" is what BlinkDL's `.pth` releases hold. "web-rwkv" is what Ai00's
converter (`convert_safetensors.py`) writes: keys lower-cased (official keys already
are), `time_faaaa` renamed `time_first`, v6 `time_maa*` renamed `time_mix*`, the last two
axes of the small LoRA-style matrices and of `time_state` swapped, and v5.1's per-head
`time_decay`/`time_faaaa` repeated from [H] to [H, N]. Readers undo all of it, so the rest
of the program only ever sees official names and layout.

`time_first` is the one rename that loses information. Officially v4 `time_first` is its
own quantity, v5 `time_first` (legacy) means u = exp(time_first) and `time_faaaa` means u
as it is; web-rwkv calls both `time_first` and uses the value as u. Going back we decide
from version and shape, the way the converter produces them:

* v4: `time_first` stays `time_first` (v4 has no time_faaaa).
* v5: a `time_first` of shape [H, N] was a `time_faaaa` (the converter repeats 5.1's
  per-head ones to [H, N], 5.2's already are) and becomes `time_faaaa` again; a 1-D [H]
  `time_first` is the legacy official tensor, which the converter leaves untouched, and
  stays `time_first`. (The converter would turn a v5.0 `time_faaaa` [H] into an
  identical-looking tensor; no such v5.0 release is known, and our writer avoids it.)
* v6: always `time_faaaa`.

A 5.1 repeat is undone when every head's row is constant in every layer's `time_decay`
(and in `time_faaaa` when that is 2-D). A 5.2 model whose decays happened to be constant
within each head would be read as the 5.1 it is equivalent to: the math is the same.
Our writer also repeats a v5.0 `time_faaaa` (the converter would leave it [H], where it
would read back as a legacy `time_first`), and the reader collapses it the same way.

When names and shapes cannot tell the layouts apart (only v7 models whose LoRA ranks all
equal C, and files holding nothing but `time_state`), the `rwkv_layout` metadata our
writer records decides; failing that, Ai00's own extensions (`.st`, `.state`, `.lora`)
mean web-rwkv and anything else means official.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from pathlib import Path

import msgspec
import numpy as np

from . import (
    LAYOUTS,
    STORAGE_DTYPES,
    as_float,
    cast_for_storage,
    map_file,
    view_of,
)
from .prefab import join_quantised, split_quantised
from .safetensors_header import DTYPES, parse_header, read_safetensors_metadata

LAYOUT_METADATA_KEY = "rwkv_layout"

_WRITE_DTYPES = {"fp32": "F32", "fp16": "F16", "bf16": "BF16"}
_AI00_SUFFIXES = (".st", ".state", ".lora")

# Official tensors whose last two axes web-rwkv swaps, per model family.
_TRANSPOSED = {
    "6": ("att.time_maa_w1", "att.time_maa_w2", "att.time_decay_w1", "att.time_decay_w2"),
    "7": ("att.w1", "att.w2", "att.a1", "att.a2", "att.g1", "att.g2", "att.v1", "att.v2"),
}
_ALWAYS_TRANSPOSED = ("att.time_state",)
_V7_LORA = ("att.w1", "att.a1", "att.g1", "att.v1")


class SafetensorsFile(msgspec.Struct):
    """A file's tensors exactly as stored (names and layout untouched) and its metadata."""

    tensors: dict[str, np.ndarray]
    metadata: dict[str, str]


# --------------------------------------------------------------------------- reading


def read_safetensors_raw(path: str | Path) -> SafetensorsFile:
    """Every tensor of the file as a read-only view of the mapped file (BF16 kept raw)."""
    mapped = map_file(path)
    entries, metadata, data_start = parse_header(path, mapped)
    tensors = {}
    for name, entry in entries.items():
        dtype = DTYPES[entry.dtype]
        count = int(np.prod(entry.shape, dtype=np.int64))
        tensors[name] = view_of(mapped, data_start + entry.data_offsets[0], dtype, count).reshape(entry.shape)
    return SafetensorsFile(tensors=tensors, metadata=metadata)


def read_safetensors(path: str | Path, *, keep_bf16: bool = False) -> tuple[dict[str, np.ndarray], str]:
    """A model file's tensors under official names and layout, and the layout it was in."""
    raw = read_safetensors_raw(path)
    stored = join_quantised(raw.tensors, raw.metadata, path)
    family = model_family(stored)
    layout = detect_layout(stored, raw.metadata, path, family=family)
    tensors = to_official(stored, layout, family)
    if not keep_bf16:
        tensors = {name: as_float(arr) for name, arr in tensors.items()}
    return tensors, layout


# --------------------------------------------------------------------------- layouts


def model_family(tensors: Mapping[str, object]) -> str | None:
    """"4", "5", "6" or "7" from names in either layout; None for files that are not a model."""

    def has(suffix: str) -> bool:
        return any(name.endswith(suffix) for name in tensors)

    if has("att.r_k") or has("att.x_r") or has("att.k_k"):
        return "7"
    if has("att.time_maa_x") or has("att.time_mix_x") or has("att.time_mix_w1"):
        return "6"
    if has("att.ln_x.weight"):
        return "5"
    if has("att.time_mix_k") and has("att.time_first"):
        return "4"
    return None


def detect_layout(
    tensors: Mapping[str, np.ndarray],
    metadata: Mapping[str, str],
    path: str | Path | None,
    *,
    family: str | None,
    n_embd: int | None = None,
) -> str:
    """Which layout `tensors` (names as stored) are in; see the module docstring."""
    evidence = _layout_evidence(tensors, family, n_embd)
    if evidence:
        return evidence
    if metadata.get(LAYOUT_METADATA_KEY) in LAYOUTS:
        return metadata[LAYOUT_METADATA_KEY]
    if not any(name.endswith(_ALWAYS_TRANSPOSED) for name in tensors) and family in ("4", "5"):
        return "official"  # the two layouts of these files are identical
    return "web-rwkv" if path is not None and Path(path).suffix.lower() in _AI00_SUFFIXES else "official"


def _layout_evidence(tensors: Mapping[str, np.ndarray], family: str | None, n_embd: int | None) -> str | None:
    names = list(tensors)
    if any(".time_maa" in n or n.endswith(".time_faaaa") for n in names):
        return "official"
    if any(n.endswith((".time_mix_x", ".time_mix_w1")) for n in names):
        return "web-rwkv"
    if family == "5":
        return _v5_layout_evidence(tensors)
    if family == "7":
        return _v7_layout_evidence(tensors, n_embd)
    return None


def _v5_layout_evidence(tensors: Mapping[str, np.ndarray]) -> str | None:
    for name, arr in tensors.items():
        if name.endswith("att.time_first") and arr.ndim == 2 and arr.shape[1] > 1:
            return "web-rwkv"  # a renamed, per-channel time_faaaa
        if name.endswith("att.time_decay") and arr.ndim == 2 and arr.shape[1] > 1:
            # Per-channel decays with the legacy per-head bonus: a converted 5.1.
            bonus = tensors.get(name[: -len("time_decay")] + "time_first")
            if bonus is not None and bonus.ndim == 1:
                return "web-rwkv"
    return None


def _v7_layout_evidence(tensors: Mapping[str, np.ndarray], n_embd: int | None) -> str | None:
    if n_embd is None:
        emb = tensors.get("emb.weight")
        if emb is None or emb.ndim != 2:
            return None
        n_embd = emb.shape[1]
    for name, arr in tensors.items():
        if name.endswith(_V7_LORA) and arr.ndim == 2 and arr.shape[0] != arr.shape[1]:
            return "official" if arr.shape[0] == n_embd else "web-rwkv"
    return None


def to_official(tensors: Mapping[str, np.ndarray], layout: str, family: str | None) -> dict[str, np.ndarray]:
    """Undo web-rwkv's renames, transposes and 5.1 repeats (views, no copies)."""
    if layout == "official":
        return dict(tensors)
    out: dict[str, np.ndarray] = {}
    for name, arr in tensors.items():
        official = _official_name(name, family, arr)
        if _is_transposed(official, family):
            arr = arr.swapaxes(-1, -2)
        out[official] = arr
    if family == "5":
        _undo_per_head_repeat(out)
    return out


def to_web_rwkv(tensors: Mapping[str, np.ndarray], family: str | None = None) -> dict[str, np.ndarray]:
    """What Ai00's converter would make of official `tensors` (dtype untouched)."""
    family = family or model_family(tensors)
    repeats = _per_head_repeats(tensors) if family == "5" else ((), 0)
    out: dict[str, np.ndarray] = {}
    for name, arr in tensors.items():
        if name.endswith(repeats[0]):
            arr = np.repeat(arr[:, None], repeats[1], axis=1)
        if _is_transposed(name, family):
            arr = arr.swapaxes(-1, -2)
        web = name.replace(".time_faaaa", ".time_first")
        if family == "6":
            web = web.replace(".time_maa", ".time_mix")
        out[web.lower()] = arr
    return out


def _official_name(name: str, family: str | None, arr: np.ndarray) -> str:
    if family == "6":
        name = name.replace(".time_mix", ".time_maa")
        if name.endswith(".time_first"):
            name = name[: -len("time_first")] + "time_faaaa"
    elif family == "5" and name.endswith(".time_first") and arr.ndim == 2 and arr.shape[1] > 1:
        name = name[: -len("time_first")] + "time_faaaa"
    return name


def _is_transposed(official_name: str, family: str | None) -> bool:
    return official_name.endswith(_ALWAYS_TRANSPOSED + _TRANSPOSED.get(family or "", ()))


def _per_head_repeats(tensors: Mapping[str, np.ndarray]) -> tuple[tuple[str, ...], int]:
    """Which per-head v5 vectors to repeat to [H, N] when writing web-rwkv, and N.

    The converter repeats 5.1's (gated) `time_decay` and `time_faaaa`. A 5.0 `time_faaaa`
    it would leave per head, where it would look exactly like a legacy `time_first` and
    be read back with the wrong meaning, so we repeat that one too.
    """
    decay = tensors.get("blocks.0.att.time_decay")
    key = tensors.get("blocks.0.att.key.weight")
    if decay is None or key is None or decay.ndim != 1:
        return (), 0
    head_size = key.shape[0] // decay.shape[0]
    if "blocks.0.att.gate.weight" in tensors:
        return ("att.time_decay", "att.time_faaaa"), head_size
    return ("att.time_faaaa",), head_size


def _undo_per_head_repeat(tensors: dict[str, np.ndarray]) -> None:
    """Collapse [H, N] per-head repeats back to [H] (see the module docstring)."""
    decays = [n for n, a in tensors.items() if n.endswith("att.time_decay") and a.ndim == 2]
    bonuses = [n for n, a in tensors.items() if n.endswith("att.time_faaaa") and a.ndim == 2]
    gated = any(name.endswith("att.gate.weight") for name in tensors)
    if decays and not gated:
        return  # only a gated (5.1) model's decays are ever repeated
    repeated = decays + bonuses
    # All layers or none: per-channel values anywhere mean a 5.2 model.
    if repeated and all(_rows_constant(tensors[name]) for name in repeated):
        for name in repeated:
            tensors[name] = tensors[name][:, 0]


def _rows_constant(arr: np.ndarray) -> bool:
    return bool(np.all(arr == arr[:, :1]))


# --------------------------------------------------------------------------- writing


def write_safetensors(
    tensors: Mapping[str, np.ndarray],
    path: str | Path,
    *,
    layout: str = "official",
    dtype: str = "fp16",
    on_tensor: Callable[[str, int], None] | None = None,
    metadata: Mapping[str, str] | None = None,
) -> None:
    """Write official-layout `tensors` as safetensors in `layout` and storage `dtype`.

    layout "web-rwkv" produces what Ai00's converter writes (Ai00 itself only loads it
    with dtype "fp16"). The layout is also recorded in the metadata, which readers use
    when names and shapes leave it open. Tensors are cast and written one at a time;
    `on_tensor(name, nbytes)` is called after each (for progress bars). Quantised matrices
    are written as they are (prefab.py), in the official layout only. `metadata` adds
    string entries to `__metadata__` (e.g. "tokenizer": the vocabulary file beside the
    model, which tokenizer.find_tokenizer reads); the writer's own keys take precedence.
    """
    if layout not in LAYOUTS:
        raise ValueError(f"unknown layout {layout!r}; expected one of {LAYOUTS}")
    if dtype not in STORAGE_DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; expected one of {STORAGE_DTYPES}")
    stored, quantised = split_quantised(tensors)
    if quantised and layout != "official":
        raise ValueError("a quantised model is written in the official layout only")
    stored = to_web_rwkv(stored) if layout == "web-rwkv" else stored
    itemsize = np.dtype(np.float32 if dtype == "fp32" else np.float16).itemsize
    extra = {str(key): str(value) for key, value in (metadata or {}).items()}
    header: dict[str, object] = {"__metadata__": {**extra, LAYOUT_METADATA_KEY: layout, **quantised}}
    offset = 0
    for name, arr in stored.items():
        packed = arr.dtype == np.uint32
        nbytes = int(np.prod(arr.shape, dtype=np.int64)) * (4 if packed else itemsize)
        header[name] = {
            "dtype": "U32" if packed else _WRITE_DTYPES[dtype],
            "shape": list(arr.shape),
            "data_offsets": [offset, offset + nbytes],
        }
        offset += nbytes
    raw_header = json.dumps(header, separators=(",", ":")).encode()
    raw_header += b" " * (-len(raw_header) % 8)  # keeps the data 8-byte aligned
    try:
        with open(path, "wb") as f:
            f.write(len(raw_header).to_bytes(8, "little"))
            f.write(raw_header)
            for name, arr in stored.items():
                data = np.ascontiguousarray(arr) if arr.dtype == np.uint32 else cast_for_storage(arr, dtype, name, path)
                f.write(memoryview(data.reshape(-1).view(np.uint8)))
                if on_tensor:
                    on_tensor(name, data.nbytes)
    except BaseException:
        Path(path).unlink(missing_ok=True)  # a half-written file would only fail later
        raise


__all__ = [
    "LAYOUT_METADATA_KEY",
    "SafetensorsFile",
    "detect_layout",
    "model_family",
    "read_safetensors",
    "read_safetensors_metadata",
    "read_safetensors_raw",
    "to_official",
    "to_web_rwkv",
    "write_safetensors",
]
