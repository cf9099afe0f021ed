"""Reading checkpoints, LoRAs and state files into official names and layout.

`read_checkpoint` tells the format from the file's first bytes (a zip archive is a
PyTorch `.pth`, anything else must be safetensors) rather than from its extension, so a
renamed file still loads and a wrong one fails with a message about its content.
Every failure a user can cause is a `ModelFileError` naming the file and the problem.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from pathlib import Path

import msgspec
import numpy as np

from .errors import ModelFileError
from .formats import as_float, map_file, shapes_of
from .formats.pth import read_pth, read_pth_shapes
from .formats.safetensors import (
    detect_layout,
    model_family,
    read_safetensors,
    read_safetensors_raw,
    to_official,
)
from .info import ModelInfo, detect
from .weights import PROJECTION

_ZIP_MAGIC = b"PK\x03\x04"
_EMPTY_ZIP_MAGIC = b"PK\x05\x06"
_LEGACY_TORCH_MAGIC = b"\x80\x02\x8a\x0a\x6c\xfc\x9c\x46\xf9\x20\x6a\xa8"  # pickled torch magic number
_BLOCK = re.compile(r"^blocks\.(\d+)\.(.+)$")


class Checkpoint(msgspec.Struct):
    """A model file read into memory-mapped arrays under official names and layout."""

    path: str
    tensors: dict[str, np.ndarray]
    info: ModelInfo
    layout: str  # the layout the file was stored in: "official" or "web-rwkv"


def file_format(path: str | Path) -> str:
    """"pth" or "safetensors", from the file's first bytes."""
    mapped = map_file(path)
    head = mapped[:16]
    mapped.close()
    if head.startswith((_ZIP_MAGIC, _EMPTY_ZIP_MAGIC)):
        return "pth"
    if head.startswith(_LEGACY_TORCH_MAGIC):
        raise ModelFileError(path, "legacy (pre-1.6) PyTorch format is not supported; re-save it with a recent torch")
    return "safetensors"


def read_tensors(path: str | Path, *, keep_bf16: bool = False) -> tuple[dict[str, np.ndarray], str]:
    """Any model file's tensors under official names and layout, and the file's layout."""
    if file_format(path) == "pth":
        return read_pth(path, keep_bf16=keep_bf16), "official"
    return read_safetensors(path, keep_bf16=keep_bf16)


def read_checkpoint(
    path: str | Path,
    *,
    loras: Iterable[tuple[str | Path, float]] = (),
    keep_bf16: bool = False,
) -> Checkpoint:
    """Read a model file (`.pth` or safetensors in either layout), optionally merging LoRAs.

    fp32/fp16 weights are read-only views of the mapped file; bf16 ones are widened to
    fp32 unless `keep_bf16` (then they stay mapped as `formats.BF16` bit patterns, for
    converters that stream). Version and sizes come from `info.detect`.
    """
    tensors, layout = read_tensors(path, keep_bf16=keep_bf16)
    info = detect(shapes_of(tensors), str(path))
    _check_complete(tensors, info, path)
    for lora_path, alpha in loras:
        tensors = apply_lora(tensors, lora_path, alpha)
    return Checkpoint(path=str(path), tensors=tensors, info=info, layout=layout)


def read_model_info(path: str | Path) -> ModelInfo:
    """Version and sizes of a model file without loading (or widening) its weights."""
    if file_format(path) == "pth":
        shapes = read_pth_shapes(path)
    else:
        tensors, _ = read_safetensors(path, keep_bf16=True)  # mapped views: only headers are read
        shapes = shapes_of(tensors)
    return detect(shapes, str(path))


def _check_complete(tensors: Mapping[str, np.ndarray], info: ModelInfo, path) -> None:
    """Every layer must hold what layer 0 holds (minus ln0): catches cut-down files early."""
    suffixes = {m.group(2) for name in tensors if (m := _BLOCK.match(name)) and m.group(1) == "0"}
    suffixes -= {"ln0.weight", "ln0.bias"}
    for i in range(1, info.n_layer):
        for suffix in sorted(suffixes):
            if f"blocks.{i}.{suffix}" not in tensors:
                raise ModelFileError(path, f"incomplete checkpoint: tensor 'blocks.{i}.{suffix}' is missing")


# --------------------------------------------------------------------------- LoRA


def apply_lora(tensors: Mapping[str, np.ndarray], lora_path: str | Path, alpha: float = 1.0) -> dict[str, np.ndarray]:
    """Merge one Ai00-format LoRA into official-layout `tensors`; returns a new dict.

    The blend is Ai00's `LoraBlend::full(alpha)` (ai00-reference §6):
    * a pair `<name>.lora.0` ([in, r], i.e. A transposed) / `<name>.lora.1` ([out, r], B)
      adds `alpha / r · B · A` to `<name>.weight` when that is an att/ffn
      key/value/receptance/gate/output matrix (factor 1 instead of alpha for any other
      matrix). RWKV-LM's own names `<name>.lora_A` ([r, in]) / `lora_B` ([out, r]) are
      accepted too;
    * every other tensor of the file *replaces* the model tensor of the same name (blend
      factor 1). web-rwkv's loader does that for vectors; it adds full matrices instead,
      which would double e.g. a fully-trained `time_maa_w1` - we replace them as well.
    Ai00 LoRA files are in web-rwkv layout (lower-cased, renamed, transposed); that is
    undone first. Call again to stack several LoRAs. Merged matrices keep the model's
    dtype (fp32 for bf16 models); untouched tensors stay memory-mapped.
    """
    raw, metadata = _read_as_stored(lora_path)
    info = detect(shapes_of(tensors), None)
    pairs, plain = _split_low_rank(raw, lora_path)
    family = _family(info)
    layout = _lora_layout(raw, plain, metadata, lora_path, family, info.n_embd)
    plain = to_official(plain, layout, family)

    merged = dict(tensors)
    used = 0
    for name, value in plain.items():
        if name in merged:
            merged[name] = _replacement(merged[name], value, name, lora_path)
            used += 1
    for target, (a, b) in pairs.items():
        if target not in merged:
            continue
        # the projections blend with the user's alpha (Ai00's LoraBlend::full), any other matrix with 1
        factor = alpha if PROJECTION.match(target) else 1.0
        merged[target] = _add_low_rank(merged[target], a, b, factor, target, lora_path)
        used += 1
    if not used:
        raise ModelFileError(lora_path, "LoRA matches no tensor of the model")
    return merged


def _read_as_stored(path: str | Path) -> tuple[dict[str, np.ndarray], dict[str, str] | None]:
    """Tensors with names and layout as stored, and the safetensors metadata (None for .pth)."""
    if file_format(path) == "pth":
        return read_pth(path), None
    stored = read_safetensors_raw(path)
    return stored.tensors, stored.metadata


def _family(info: ModelInfo) -> str:
    return "5" if info.version.startswith("5") else info.version


def _split_low_rank(raw: Mapping[str, np.ndarray], path) -> tuple[dict[str, tuple[np.ndarray, np.ndarray]], dict]:
    """Low-rank pairs as {target weight: (A [r, in], B [out, r])}, and all other tensors."""
    pairs: dict[str, tuple[np.ndarray, np.ndarray]] = {}
    plain = {}
    for name, arr in raw.items():
        if name.endswith(".lora.0"):
            base, partner, a_transposed = name[: -len(".lora.0")], ".lora.1", True
        elif name.endswith(".lora_A"):
            base, partner, a_transposed = name[: -len(".lora_A")], ".lora_B", False
        elif name.endswith((".lora.1", ".lora_B")):
            continue  # taken with its partner
        else:
            plain[name] = arr
            continue
        b = raw.get(base + partner)
        if b is None:
            raise ModelFileError(path, f"LoRA tensor '{name}' has no partner '{base + partner}'")
        a = as_float(arr).astype(np.float32)
        pairs[base + ".weight"] = (a.T if a_transposed else a, as_float(b).astype(np.float32))
    return pairs, plain


def _lora_layout(raw, plain, metadata, path, family: str, n_embd: int) -> str:
    if metadata is None or any(n.endswith((".lora_A", ".lora_B")) for n in raw):
        return "official"  # a .pth, or RWKV-LM's own names
    if any(n.endswith((".lora.0", ".lora.1")) for n in raw):
        return "web-rwkv"  # Ai00's converter made it
    return detect_layout(plain, metadata, path, family=family, n_embd=n_embd)


def _replacement(current: np.ndarray, value: np.ndarray, name: str, path) -> np.ndarray:
    value = as_float(value)
    if value.shape != current.shape and current.ndim == 1 and value.ndim == 2 and value.shape[0] == current.shape[0]:
        value = value[:, 0] if np.all(value == value[:, :1]) else value  # a 5.1 per-head repeat
    if value.shape != current.shape:
        raise ModelFileError(path, f"LoRA tensor '{name}' has shape {value.shape} but the model's is {current.shape}")
    return value.astype(_merge_dtype(current))


def _add_low_rank(weight: np.ndarray, a: np.ndarray, b: np.ndarray, factor: float, name: str, path) -> np.ndarray:
    rank = a.shape[0]
    if a.ndim != 2 or b.ndim != 2 or b.shape[1] != rank or weight.shape != (b.shape[0], a.shape[1]):
        raise ModelFileError(
            path,
            f"LoRA for '{name}' has A {a.shape} and B {b.shape}, which do not fit the model's {weight.shape}",
        )
    merged = as_float(weight).astype(np.float32) + (np.float32(factor / rank) * (b @ a))
    return merged.astype(_merge_dtype(weight))


def _merge_dtype(current: np.ndarray) -> np.dtype:
    return np.dtype(np.float16) if current.dtype == np.float16 else np.dtype(np.float32)


# --------------------------------------------------------------------------- state files


def read_state_file(path: str | Path, info: ModelInfo) -> list[np.ndarray]:
    """A state-tuning file's initial WKV states, one float32 [H, N, N] array per layer.

    The arrays are value-major (`S[h, value, key]`), the layout of the official CUDA
    kernels and of `time_state` in official checkpoints. Ai00 `.state` files hold
    `blocks.{i}.att.time_state` in web-rwkv layout ([h, key, value], as its converter
    transposes them); that is detected and undone like any safetensors layout. A full
    state-tuned model file works too: its `time_state` tensors are taken.
    """
    if info.version == "4":
        raise ModelFileError(path, "v4 models do not support state files (they have no time_state)")
    states = {name: arr for name, arr in read_state_tensors(path, info).items() if name.endswith(".att.time_state")}
    if not states:
        raise ModelFileError(path, "not a state file: it has no 'blocks.N.att.time_state' tensors")
    return _per_layer_states(states, info, path)


def read_state_tensors(path: str | Path, info: ModelInfo) -> dict[str, np.ndarray]:
    """Every tensor of a state file under official names and layout (the `time_state`s and
    whatever else it holds, such as a saved conversation's shift vectors)."""
    raw, metadata = _read_as_stored(path)
    family = model_family(raw) or _family(info)
    if metadata is None:
        layout = "official"
    else:
        layout = detect_layout(raw, metadata, path, family=family, n_embd=info.n_embd)
    return to_official(raw, layout, family)


def _per_layer_states(states: Mapping[str, np.ndarray], info: ModelInfo, path) -> list[np.ndarray]:
    want = (info.n_head, info.head_size, info.head_size)
    layers = {}
    for name, arr in states.items():
        m = _BLOCK.match(name)
        if not m:
            raise ModelFileError(path, f"not a state file: unexpected tensor '{name}'")
        layers[int(m.group(1))] = arr
    if max(layers) >= info.n_layer:
        raise ModelFileError(path, f"has state for {max(layers) + 1} layers but the model has {info.n_layer}")
    out = []
    for i in range(info.n_layer):
        if i not in layers:
            raise ModelFileError(path, f"has no state for layer {i} (the model has {info.n_layer} layers)")
        if layers[i].shape != want:
            raise ModelFileError(
                path, f"layer {i} state has shape {tuple(layers[i].shape)} but the model needs {want} "
                f"(tensor 'blocks.{i}.att.time_state')"
            )
        out.append(np.ascontiguousarray(as_float(layers[i]), dtype=np.float32))
    return out


__all__ = [
    "Checkpoint",
    "apply_lora",
    "file_format",
    "read_checkpoint",
    "read_model_info",
    "read_state_file",
    "read_state_tensors",
    "read_tensors",
]
