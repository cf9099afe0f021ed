"""Checkpoint reading and writing: .pth, safetensors in both layouts, LoRA, state files, CLI."""

from __future__ import annotations

import json
import mmap
import os
import pickle
import struct
import subprocess
import sys
import zipfile
from pathlib import Path

import numpy as np
import pytest

from ai00_like.rwkv.errors import ModelFileError
from ai00_like.rwkv.formats import BF16, bf16_to_f32, f32_to_bf16
from ai00_like.rwkv.formats import pth as pth_format
from ai00_like.rwkv.formats.pth import read_pth, write_pth
from ai00_like.rwkv.formats.safetensors import read_safetensors_raw, write_safetensors
from ai00_like.rwkv.info import VERSIONS
from ai00_like.rwkv.loader import (
    apply_lora,
    read_checkpoint,
    read_model_info,
    read_state_file,
)
from ai00_like.rwkv.synthetic import make_checkpoint, make_state

REPO = Path(__file__).resolve().parents[2]

# Relative rounding of each storage type (half an ulp) and fp16's subnormal spacing.
TOLERANCE = {"fp32": (0.0, 0.0), "fp16": (2.0**-11, 6e-8), "bf16": (2.0**-8, 0.0)}


def checkpoint(version: str, **kwargs) -> dict[str, np.ndarray]:
    return make_checkpoint(version, n_layer=2, n_embd=64, head_size=32, vocab=300, **kwargs)


def with_time_faaaa(sd: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """A v5.0/5.1 checkpoint that names its bonus `time_faaaa` (u as is) instead of legacy `time_first`."""
    return {k.replace(".time_first", ".time_faaaa"): v for k, v in sd.items()}


def assert_same_tensors(got: dict, want: dict, dtype: str) -> None:
    assert list(got) == list(want) or sorted(got) == sorted(want)
    rtol, atol = TOLERANCE[dtype]
    for name, arr in want.items():
        assert got[name].shape == arr.shape, name
        assert got[name].dtype in (np.float32, np.float16), name
        np.testing.assert_allclose(got[name].astype(np.float32), arr, rtol=rtol, atol=atol, err_msg=name)


def mapped_from_file(arr: np.ndarray) -> bool:
    """True when the array's memory is a view of an mmap of the file, not a heap copy."""
    base = arr
    while base is not None:
        if isinstance(base, (mmap.mmap, np.memmap)):
            return True
        if isinstance(base, memoryview):
            return isinstance(base.obj, mmap.mmap)
        base = getattr(base, "base", None)
    return False


def one_line_error(excinfo, path) -> str:
    message = str(excinfo.value)
    assert str(path) in message
    assert "\n" not in message
    return message


# --------------------------------------------------------------------------- .pth


@pytest.mark.parametrize("dtype", ["bf16", "fp16", "fp32"])
@pytest.mark.parametrize("version", VERSIONS)
def test_pth_round_trip(tmp_path, version, dtype):
    sd = checkpoint(version)
    path = tmp_path / "model.pth"
    write_pth(sd, path, dtype=dtype)
    ckpt = read_checkpoint(path)
    assert_same_tensors(ckpt.tensors, sd, dtype)
    assert list(ckpt.tensors) == list(sd)
    assert ckpt.info.version == version
    assert ckpt.info.n_layer == 2 and ckpt.info.n_embd == 64 and ckpt.info.vocab == 300
    assert ckpt.layout == "official"
    assert read_model_info(path) == ckpt.info


def test_pth_storages_are_mapped_not_copied(tmp_path):
    sd = checkpoint("7")
    for dtype in ("fp32", "fp16"):
        path = tmp_path / f"model-{dtype}.pth"
        write_pth(sd, path, dtype=dtype)
        tensors = read_pth(path)
        assert all(mapped_from_file(a) for a in tensors.values())
        assert not any(a.flags.writeable for a in tensors.values())
    # bf16 has to be widened, so it cannot be a view; kept raw it stays mapped.
    write_pth(sd, tmp_path / "bf16.pth", dtype="bf16")
    assert not mapped_from_file(read_pth(tmp_path / "bf16.pth")["head.weight"])
    raw = read_pth(tmp_path / "bf16.pth", keep_bf16=True)["head.weight"]
    assert raw.dtype == BF16 and mapped_from_file(raw)


def test_pth_storage_data_is_64_byte_aligned(tmp_path):
    path = tmp_path / "model.pth"
    write_pth(checkpoint("5.2"), path, dtype="fp16")
    with zipfile.ZipFile(path) as zf, open(path, "rb") as f:
        for info in zf.infolist():
            f.seek(info.header_offset)
            header = f.read(30)
            name_len, extra_len = struct.unpack("<HH", header[26:30])
            assert (info.header_offset + 30 + name_len + extra_len) % 64 == 0, info.filename


# --------------------------------------------------------------------------- safetensors


@pytest.mark.parametrize("dtype", ["fp16", "fp32"])
@pytest.mark.parametrize("layout", ["official", "web-rwkv"])
@pytest.mark.parametrize("version", VERSIONS)
def test_safetensors_round_trip(tmp_path, version, layout, dtype):
    sd = checkpoint(version)
    path = tmp_path / "model.st"
    write_safetensors(sd, path, layout=layout, dtype=dtype)
    ckpt = read_checkpoint(path)
    assert_same_tensors(ckpt.tensors, sd, dtype)
    assert ckpt.info.version == version
    assert read_model_info(path) == ckpt.info
    if version != "4":  # v4's two layouts are identical
        assert ckpt.layout == layout


@pytest.mark.parametrize("version", ["5.0", "5.1"])
@pytest.mark.parametrize("layout", ["official", "web-rwkv"])
def test_round_trip_of_per_head_time_faaaa(tmp_path, version, layout):
    sd = with_time_faaaa(checkpoint(version))
    path = tmp_path / "model.st"
    write_safetensors(sd, path, layout=layout, dtype="fp32")
    ckpt = read_checkpoint(path)
    assert_same_tensors(ckpt.tensors, sd, "fp32")
    assert ckpt.info.version == version


def test_bf16_safetensors_round_trip_is_exact_from_bf16(tmp_path):
    sd = checkpoint("6")
    write_pth(sd, tmp_path / "model.pth", dtype="bf16")
    bf16 = read_checkpoint(tmp_path / "model.pth", keep_bf16=True)
    write_safetensors(bf16.tensors, tmp_path / "model.st", layout="web-rwkv", dtype="bf16")
    again = read_checkpoint(tmp_path / "model.st")
    for name, arr in read_pth(tmp_path / "model.pth").items():
        np.testing.assert_array_equal(again.tensors[name], arr, err_msg=name)


def converter_like(sd: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """What Ai00's convert_safetensors.py writes, re-stated from its description
    (rwkv-spec §1.1, ai00-reference §6), without the fp16 cast."""
    names = list(sd)
    version = 4.0
    for k in names:
        if "ln_x" in k:
            version = max(5.0, version)
        if "gate.weight" in k:
            version = max(5.1, version)
        if int(version) == 5 and "att.time_decay" in k and sd[k].ndim > 1 and sd[k].shape[1] > 1:
            version = max(5.2, version)
        if "time_maa" in k:
            version = max(6.0, version)
    n_embd = sd["emb.weight"].shape[1]
    renames = {"time_faaaa": "time_first", "time_maa": "time_mix", "lora_A": "lora.0", "lora_B": "lora.1"}
    transposed = ["time_mix_w1", "time_mix_w2", "time_decay_w1", "time_decay_w2", "w1", "w2", "a1", "a2",
                  "g1", "g2", "v1", "v2", "time_state", "lora.0"]  # fmt: skip
    out = {}
    for k in names:
        v = sd[k]
        if version == 5.1 and ("time_decay" in k or "time_faaaa" in k):
            v = np.repeat(v[:, None], n_embd // v.shape[0], axis=1)
        new = k
        for old, repl in renames.items():
            new = new.replace(old, repl)
        new = new.lower()
        if any(t in new for t in transposed):
            v = np.swapaxes(v, -1, -2)
        out[new] = np.ascontiguousarray(v)  # safetensors.numpy would write a view's buffer as is
    return out


@pytest.mark.parametrize(
    "sd",
    [checkpoint(v) for v in VERSIONS] + [with_time_faaaa(checkpoint("5.1"))],
    ids=list(VERSIONS) + ["5.1-faaaa"],
)
def test_web_rwkv_layout_is_what_ai00_converter_writes(tmp_path, sd):
    path = tmp_path / "model.st"
    write_safetensors(sd, path, layout="web-rwkv", dtype="fp32")
    stored = read_safetensors_raw(path).tensors
    want = converter_like(sd)
    assert sorted(stored) == sorted(want)
    for name, arr in want.items():
        np.testing.assert_array_equal(stored[name], arr, err_msg=name)


def test_web_rwkv_time_first_means_u_as_is(tmp_path):
    # web-rwkv uses a renamed `time_first` as the bonus u directly: the 5.2 file must carry
    # time_faaaa's values there, and reading it back must give time_faaaa, not time_first.
    sd = checkpoint("5.2")
    path = tmp_path / "model.st"
    write_safetensors(sd, path, layout="web-rwkv", dtype="fp32")
    stored = read_safetensors_raw(path).tensors
    np.testing.assert_array_equal(stored["blocks.1.att.time_first"], sd["blocks.1.att.time_faaaa"])
    tensors = read_checkpoint(path).tensors
    assert "blocks.1.att.time_faaaa" in tensors and "blocks.1.att.time_first" not in tensors


def test_layout_of_files_without_our_metadata(tmp_path):
    from safetensors.numpy import save_file

    sd = checkpoint("6")
    save_file(converter_like(sd), str(tmp_path / "a.safetensors"))  # names decide, not the suffix
    assert read_checkpoint(tmp_path / "a.safetensors").layout == "web-rwkv"
    # v7 whose LoRA ranks all equal C: shapes cannot tell; Ai00's suffix means web-rwkv.
    square = make_checkpoint("7", n_embd=32, head_size=16, vocab=50,
                             lora={"decay": 32, "a": 32, "value": 32, "gate": 32})  # fmt: skip
    save_file(converter_like(square), str(tmp_path / "square.st"))
    assert_same_tensors(read_checkpoint(tmp_path / "square.st").tensors, square, "fp32")
    save_file(square, str(tmp_path / "square.safetensors"))
    assert_same_tensors(read_checkpoint(tmp_path / "square.safetensors").tensors, square, "fp32")


def test_safetensors_interoperates_with_the_safetensors_package(tmp_path):
    from safetensors.numpy import load_file, save_file

    sd = checkpoint("7")
    write_safetensors(sd, tmp_path / "ours.safetensors", dtype="fp16")
    theirs = load_file(str(tmp_path / "ours.safetensors"))
    assert_same_tensors({k: v.astype(np.float32) for k, v in theirs.items()}, sd, "fp16")
    save_file(sd, str(tmp_path / "theirs.safetensors"))
    ckpt = read_checkpoint(tmp_path / "theirs.safetensors")
    assert_same_tensors(ckpt.tensors, sd, "fp32")
    assert all(mapped_from_file(a) for a in ckpt.tensors.values())


def test_safetensors_weights_are_mapped_not_copied(tmp_path):
    path = tmp_path / "model.st"
    write_safetensors(checkpoint("6"), path, layout="web-rwkv", dtype="fp32")
    ckpt = read_checkpoint(path)
    # Transposed web-rwkv matrices are views too: nothing is copied at all.
    assert all(mapped_from_file(a) for a in ckpt.tensors.values())
    assert not any(a.flags.writeable for a in ckpt.tensors.values())


def test_bf16_conversion_rounds_to_nearest_even():
    # 1 + 2^-8 is half-way between 1 and 1 + 2^-7: ties go to the even pattern (1.0);
    # 1 + 3·2^-8 is half-way between 1 + 2^-7 and 1 + 2^-6: even is 1 + 2^-6.
    x = np.array([1.0, 1.0 + 2**-8, 1.0 + 3 * 2**-8, -2.5, np.inf, -np.inf, 0.0, 65504.0], np.float32)
    want = np.array([1.0, 1.0, 1.0 + 2**-6, -2.5, np.inf, -np.inf, 0.0, 65536.0], np.float32)
    np.testing.assert_array_equal(bf16_to_f32(f32_to_bf16(x)), want)
    assert np.isnan(bf16_to_f32(f32_to_bf16(np.array([np.nan], np.float32))))[0]


def test_fp16_overflow_is_refused(tmp_path):
    sd = checkpoint("7")
    sd["blocks.0.att.w0"] = sd["blocks.0.att.w0"] * 1e6
    with pytest.raises(ModelFileError, match="does not fit in fp16") as excinfo:
        write_safetensors(sd, tmp_path / "big.st", dtype="fp16")
    one_line_error(excinfo, tmp_path / "big.st")


# --------------------------------------------------------------------------- errors


def write_garbage(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


def safetensors_bytes(header: dict, data: bytes = b"") -> bytes:
    raw = json.dumps(header).encode()
    return len(raw).to_bytes(8, "little") + raw + data


def test_missing_file(tmp_path):
    with pytest.raises(ModelFileError, match="file not found") as excinfo:
        read_checkpoint(tmp_path / "nope.pth")
    one_line_error(excinfo, tmp_path / "nope.pth")


def test_empty_file(tmp_path):
    path = write_garbage(tmp_path / "empty.st", b"")
    with pytest.raises(ModelFileError, match="empty file") as excinfo:
        read_checkpoint(path)
    one_line_error(excinfo, path)


def test_directory(tmp_path):
    with pytest.raises(ModelFileError, match="directory") as excinfo:
        read_checkpoint(tmp_path)
    one_line_error(excinfo, tmp_path)


def test_unknown_format(tmp_path):
    path = write_garbage(tmp_path / "notes.st", b"hello, this is not a model at all")
    with pytest.raises(ModelFileError, match="unknown format") as excinfo:
        read_checkpoint(path)
    one_line_error(excinfo, path)


def test_truncated_safetensors_data(tmp_path):
    path = tmp_path / "model.st"
    write_safetensors(checkpoint("7"), path, dtype="fp16")
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])
    with pytest.raises(ModelFileError, match="truncated: tensor '.*' ends at") as excinfo:
        read_checkpoint(path)
    one_line_error(excinfo, path)


def test_truncated_safetensors_header(tmp_path):
    path = tmp_path / "model.st"
    write_safetensors(checkpoint("7"), path, dtype="fp16")
    path.write_bytes(path.read_bytes()[:100])
    with pytest.raises(ModelFileError, match="truncated: the header says") as excinfo:
        read_checkpoint(path)
    one_line_error(excinfo, path)


def test_corrupt_json_header(tmp_path):
    raw = b'{"emb.weight": {"dtype": "F32", "shape": [2, 2], "data_offsets": [0, 16]'  # no closing brace
    path = write_garbage(tmp_path / "bad.st", len(raw).to_bytes(8, "little") + raw + bytes(16))
    with pytest.raises(ModelFileError, match="corrupt safetensors header") as excinfo:
        read_checkpoint(path)
    one_line_error(excinfo, path)


def test_header_with_wrong_entry_types(tmp_path):
    header = {"emb.weight": {"dtype": "F32", "shape": "2x2", "data_offsets": [0, 16]}}
    path = write_garbage(tmp_path / "bad.st", safetensors_bytes(header, bytes(16)))
    with pytest.raises(ModelFileError, match="corrupt safetensors header: tensor 'emb.weight'") as excinfo:
        read_checkpoint(path)
    one_line_error(excinfo, path)


def test_header_size_that_disagrees_with_shape(tmp_path):
    header = {"emb.weight": {"dtype": "F32", "shape": [4, 4], "data_offsets": [0, 16]}}
    path = write_garbage(tmp_path / "bad.st", safetensors_bytes(header, bytes(16)))
    with pytest.raises(ModelFileError, match="spans 16 bytes") as excinfo:
        read_checkpoint(path)
    one_line_error(excinfo, path)


def test_wrong_dtype_in_safetensors(tmp_path):
    header = {"emb.weight": {"dtype": "I64", "shape": [2], "data_offsets": [0, 16]}}
    path = write_garbage(tmp_path / "ints.st", safetensors_bytes(header, bytes(16)))
    with pytest.raises(ModelFileError, match="tensor 'emb.weight' has dtype I64") as excinfo:
        read_checkpoint(path)
    one_line_error(excinfo, path)


def pth_with_pickle(path: Path, pickled: bytes, storages: dict[str, bytes] | None = None) -> Path:
    with zipfile.ZipFile(path, "w") as zf:
        zf.writestr("archive/data.pkl", pickled)
        for key, data in (storages or {}).items():
            zf.writestr(f"archive/data/{key}", data)
        zf.writestr("archive/version", "3\n")
    return path


def test_wrong_dtype_in_pth(tmp_path):
    pickled = pth_format._state_dict_pickle([("emb.weight", (2,))], "LongStorage")
    path = pth_with_pickle(tmp_path / "ints.pth", pickled, {"0": bytes(16)})
    with pytest.raises(ModelFileError, match="tensor 'emb.weight' has dtype int64") as excinfo:
        read_checkpoint(path)
    one_line_error(excinfo, path)


def test_tensor_reaching_past_its_storage_is_refused(tmp_path):
    pickled = pth_format._state_dict_pickle([("emb.weight", (1000, 1000))], "FloatStorage")
    path = pth_with_pickle(tmp_path / "evil.pth", pickled, {"0": bytes(4_000_000)})
    # The storage member is shorter than the numel the pickle claims.
    path2 = pth_with_pickle(tmp_path / "short.pth", pickled, {"0": bytes(16)})
    with pytest.raises(ModelFileError, match="storage '0' has 16 bytes") as excinfo:
        read_checkpoint(path2)
    one_line_error(excinfo, path2)
    # A shape larger than the storage it views (numel patched down in the pickle).
    patched = pickled.replace(struct.pack("<i", 1_000_000), struct.pack("<i", 10), 1)
    path3 = pth_with_pickle(tmp_path / "past.pth", patched, {"0": bytes(40)})
    with pytest.raises(ModelFileError, match="reaches past its storage") as excinfo:
        read_checkpoint(path3)
    one_line_error(excinfo, path3)
    assert read_pth(path)["emb.weight"].shape == (1000, 1000)


def test_truncated_pth(tmp_path):
    path = tmp_path / "model.pth"
    write_pth(checkpoint("6"), path)
    path.write_bytes(path.read_bytes()[:5000])
    with pytest.raises(ModelFileError, match="corrupt or truncated PyTorch zip") as excinfo:
        read_checkpoint(path)
    one_line_error(excinfo, path)


def test_legacy_torch_format(tmp_path):
    path = write_garbage(tmp_path / "old.pth", b"\x80\x02\x8a\x0a\x6c\xfc\x9c\x46\xf9\x20\x6a\xa8\x50\x19.")
    with pytest.raises(ModelFileError, match="legacy") as excinfo:
        read_checkpoint(path)
    one_line_error(excinfo, path)


class _RunsShell:
    def __init__(self, command: str):
        self.command = command

    def __reduce__(self):
        return (os.system, (self.command,))


class _RunsExec:
    def __init__(self, code: str):
        self.code = code

    def __reduce__(self):
        return (exec, (self.code,))


@pytest.mark.parametrize("protocol", [2, 4])
def test_malicious_pickle_is_refused_and_never_run(tmp_path, protocol):
    marker = tmp_path / "pwned"
    payloads = {
        "system.pth": pickle.dumps({"emb.weight": _RunsShell(f"touch {marker}")}, protocol=protocol),
        "exec.pth": pickle.dumps(_RunsExec(f"open({str(marker)!r}, 'w').close()"), protocol=protocol),
    }
    for name, pickled in payloads.items():
        path = pth_with_pickle(tmp_path / name, pickled)
        with pytest.raises(ModelFileError, match="refuses to load: the pickle imports") as excinfo:
            read_checkpoint(path)
        message = one_line_error(excinfo, path)
        assert ("system" in message) or ("exec" in message)
    assert not marker.exists()


def test_torch_load_from_bytes_is_refused(tmp_path):
    pickled = b"\x80\x02ctorch.storage\n_load_from_bytes\nq\x00C\x00\x85R."
    path = pth_with_pickle(tmp_path / "legacy-storage.pth", pickled)
    with pytest.raises(ModelFileError, match="imports torch.storage._load_from_bytes"):
        read_checkpoint(path)


def test_unsupported_deepembed_model(tmp_path):
    sd = checkpoint("7")
    sd["blocks.0.ffn.s_emb.weight"] = np.zeros((300, 32), np.float32)
    path = tmp_path / "deepembed.pth"
    write_pth(sd, path, dtype="fp16")
    with pytest.raises(ModelFileError, match="DeepEmbed") as excinfo:
        read_checkpoint(path)
    one_line_error(excinfo, path)


def test_incomplete_checkpoint(tmp_path):
    sd = checkpoint("6")
    del sd["blocks.1.att.gate.weight"]
    path = tmp_path / "cut.st"
    write_safetensors(sd, path)
    with pytest.raises(ModelFileError, match="'blocks.1.att.gate.weight' is missing") as excinfo:
        read_checkpoint(path)
    one_line_error(excinfo, path)


def test_not_an_rwkv_checkpoint(tmp_path):
    path = tmp_path / "other.pth"
    write_pth({"encoder.weight": np.zeros((2, 2), np.float32)}, path)
    with pytest.raises(ModelFileError, match="not an RWKV checkpoint") as excinfo:
        read_checkpoint(path)
    one_line_error(excinfo, path)


@pytest.mark.parametrize("suffix", [".pth", ".st"])
def test_damaged_files_fail_only_with_model_file_error(tmp_path, suffix):
    """Cut or scribbled-over files either still load or give the one-line error, never another exception."""
    sd = make_checkpoint("6", n_embd=32, head_size=16, vocab=50)
    good = tmp_path / f"good{suffix}"
    if suffix == ".pth":
        write_pth(sd, good)
    else:
        write_safetensors(sd, good, layout="web-rwkv")
    data = good.read_bytes()
    rng = np.random.default_rng(0)
    damaged = tmp_path / f"damaged{suffix}"
    for trial in range(120):
        d = bytearray(data)
        if trial % 3 == 0:
            d = d[: rng.integers(0, len(d))]
        else:  # mostly the header / pickle, where damage changes structure
            for _ in range(rng.integers(1, 5)):
                d[rng.integers(0, min(len(d), 3000))] = rng.integers(0, 256)
        damaged.write_bytes(bytes(d))
        for read in (read_checkpoint, read_model_info):
            try:
                read(damaged)
            except ModelFileError as e:
                assert "\n" not in str(e) and str(damaged) in str(e)


# --------------------------------------------------------------------------- torch itself


@pytest.mark.reference
@pytest.mark.parametrize("dtype", ["bf16", "fp16", "fp32"])
def test_torch_loads_what_we_write(tmp_path, dtype):
    torch = pytest.importorskip("torch")
    sd = checkpoint("7")
    path = tmp_path / "model.pth"
    write_pth(sd, path, dtype=dtype)
    loaded = torch.load(path)  # weights_only=True: the strict loader accepts it
    want_dtype = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32}[dtype]
    assert list(loaded) == list(sd)
    for name, arr in sd.items():
        assert loaded[name].dtype == want_dtype and tuple(loaded[name].shape) == arr.shape
    assert_same_tensors({k: v.float().numpy() for k, v in loaded.items()}, sd, dtype)
    mapped = torch.load(path, mmap=True)  # needs the aligned, uncompressed members
    assert torch.equal(mapped["head.weight"], loaded["head.weight"])


@pytest.mark.reference
def test_we_read_what_torch_saves(tmp_path):
    torch = pytest.importorskip("torch")
    sd = checkpoint("6")
    tensors = {k: torch.from_numpy(v).to(torch.bfloat16) for k, v in sd.items()}
    tensors["blocks.0.att.key.weight"] = tensors["blocks.0.att.key.weight"].float()
    tensors["blocks.0.att.value.weight"] = torch.from_numpy(sd["blocks.0.att.value.weight"]).half()
    # A transposed view: saved with its strides, read back without a copy of the storage.
    tensors["blocks.1.att.key.weight"] = torch.from_numpy(sd["blocks.1.att.key.weight"].T.copy()).t()
    torch.save({"state_dict": tensors, "epoch": 3}, tmp_path / "train.pth")  # a training checkpoint
    ckpt = read_checkpoint(tmp_path / "train.pth")
    assert ckpt.info.version == "6"
    for name, t in tensors.items():
        np.testing.assert_array_equal(ckpt.tensors[name], t.float().numpy(), err_msg=name)
    assert ckpt.tensors["blocks.0.att.value.weight"].dtype == np.float16
    assert mapped_from_file(ckpt.tensors["blocks.0.att.key.weight"])
    assert mapped_from_file(ckpt.tensors["blocks.1.att.key.weight"])


@pytest.mark.reference
def test_bf16_rounding_matches_torch():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(1)
    bits = rng.integers(0, 2**32, size=100_000, dtype=np.uint64).astype(np.uint32)
    x = bits.view(np.float32)
    x = x[np.isfinite(x)]
    ours = f32_to_bf16(x)["bf16"]
    theirs = torch.from_numpy(x).to(torch.bfloat16).view(torch.int16).numpy().view(np.uint16)
    np.testing.assert_array_equal(ours, theirs)


# --------------------------------------------------------------------------- LoRA


def save_as_is(tensors: dict[str, np.ndarray], path: Path) -> Path:
    """Write names and arrays untouched and without our metadata, as Ai00's converter would."""
    from safetensors.numpy import save_file

    save_file({k: np.ascontiguousarray(v) for k, v in tensors.items()}, str(path))
    return path


def lora_pair(a: np.ndarray, b: np.ndarray, base: str) -> dict[str, np.ndarray]:
    """Ai00's names: lora.0 is A transposed ([in, r]), lora.1 is B ([out, r])."""
    return {f"{base}.lora.0": np.ascontiguousarray(a.T), f"{base}.lora.1": b}


def sparse_lora(C: int) -> tuple[np.ndarray, np.ndarray]:
    a = np.zeros((2, C), np.float32)  # [r, in]
    b = np.zeros((C, 2), np.float32)  # [out, r]
    a[0, 3], a[1, 5] = 1.0, 2.0
    b[7, 0], b[9, 1] = 3.0, -1.0
    return a, b  # B @ A has exactly two non-zeros: (7, 3) = 3 and (9, 5) = -2


def test_lora_merge_hand_computed(tmp_path):
    sd = checkpoint("7")
    original_key = sd["blocks.0.att.key.weight"].copy()
    a, b = sparse_lora(64)
    new_ln = np.full(64, 0.5, np.float32)
    new_w1 = np.full((64, 16), 0.25, np.float32)  # official [C, Dw]
    lora = {
        **lora_pair(a, b, "blocks.0.att.key"),
        "blocks.1.ln1.weight": new_ln,
        "blocks.0.att.w1": np.ascontiguousarray(new_w1.T),  # web-rwkv layout: transposed
    }
    save_as_is(lora, tmp_path / "x.lora")
    merged = apply_lora(sd, tmp_path / "x.lora", alpha=4.0)  # alpha / rank = 2

    expected = sd["blocks.0.att.key.weight"].copy()
    expected[7, 3] += 2 * 3.0
    expected[9, 5] += 2 * -2.0
    np.testing.assert_allclose(merged["blocks.0.att.key.weight"], expected, rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(merged["blocks.1.ln1.weight"], new_ln)  # vectors are replaced
    np.testing.assert_array_equal(merged["blocks.0.att.w1"], new_w1)  # un-transposed, replaced
    for name in sd.keys() - {"blocks.0.att.key.weight", "blocks.1.ln1.weight", "blocks.0.att.w1"}:
        assert merged[name] is sd[name]
    np.testing.assert_array_equal(sd["blocks.0.att.key.weight"], original_key)  # the input is not modified


def test_loras_stack_and_load_with_the_checkpoint(tmp_path):
    sd = checkpoint("6")
    write_safetensors(sd, tmp_path / "model.st", layout="web-rwkv", dtype="fp32")
    a, b = sparse_lora(64)
    save_as_is(lora_pair(a, b, "blocks.1.ffn.receptance"), tmp_path / "one.lora")
    # RWKV-LM's own names in a .pth: lora_A [r, in], lora_B [out, r], untransposed.
    write_pth({"blocks.1.ffn.receptance.lora_A": a, "blocks.1.ffn.receptance.lora_B": b}, tmp_path / "two.pth",
              dtype="fp32")  # fmt: skip
    ckpt = read_checkpoint(tmp_path / "model.st", loras=[(tmp_path / "one.lora", 2.0), (tmp_path / "two.pth", 6.0)])
    expected = sd["blocks.1.ffn.receptance.weight"].copy()
    expected[7, 3] += (2.0 / 2 + 6.0 / 2) * 3.0
    expected[9, 5] += (2.0 / 2 + 6.0 / 2) * -2.0
    np.testing.assert_allclose(ckpt.tensors["blocks.1.ffn.receptance.weight"], expected, rtol=1e-6, atol=1e-6)


def test_lora_v6_vector_in_web_rwkv_names(tmp_path):
    sd = checkpoint("6")
    mix = np.linspace(0, 1, 64, dtype=np.float32).reshape(1, 1, 64)
    zeros = np.zeros((64, 4), np.float32)
    lora = {"blocks.0.att.time_mix_k": mix, "blocks.0.att.key.lora.0": zeros, "blocks.0.att.key.lora.1": zeros}
    save_as_is(lora, tmp_path / "v6.lora")
    merged = apply_lora(sd, tmp_path / "v6.lora", alpha=1.0)
    np.testing.assert_array_equal(merged["blocks.0.att.time_maa_k"], mix)


def test_lora_errors(tmp_path):
    sd = checkpoint("7")
    a, b = sparse_lora(32)  # built for C = 32, the model has C = 64
    save_as_is(lora_pair(a, b, "blocks.0.att.key"), tmp_path / "wrong.lora")
    with pytest.raises(ModelFileError, match="do not fit") as excinfo:
        apply_lora(sd, tmp_path / "wrong.lora", 1.0)
    one_line_error(excinfo, tmp_path / "wrong.lora")
    save_as_is({"unrelated.weight": np.zeros(3, np.float32)}, tmp_path / "none.lora")
    with pytest.raises(ModelFileError, match="matches no tensor") as excinfo:
        apply_lora(sd, tmp_path / "none.lora", 1.0)
    one_line_error(excinfo, tmp_path / "none.lora")
    save_as_is({"blocks.0.att.key.lora.0": a.T}, tmp_path / "half.lora")
    with pytest.raises(ModelFileError, match="has no partner"):
        apply_lora(sd, tmp_path / "half.lora", 1.0)


# --------------------------------------------------------------------------- state files


@pytest.mark.parametrize("version", ["5.2", "6", "7"])
@pytest.mark.parametrize("layout", ["official", "web-rwkv"])
def test_state_file_round_trip(tmp_path, version, layout):
    info = read_checkpoint_info(tmp_path, version)
    state = make_state(info.n_layer, info.n_embd, info.head_size, seed=3)
    path = tmp_path / "tuned.state"
    write_safetensors(state, path, layout=layout, dtype="fp32")
    got = read_state_file(path, info)
    assert len(got) == info.n_layer
    for i, arr in enumerate(got):
        assert arr.dtype == np.float32 and arr.shape == (info.n_head, info.head_size, info.head_size)
        np.testing.assert_array_equal(arr, state[f"blocks.{i}.att.time_state"])


def read_checkpoint_info(tmp_path: Path, version: str):
    path = tmp_path / f"model-{version}.st"
    write_safetensors(checkpoint(version), path, dtype="fp16")
    return read_model_info(path)


def test_ai00_state_file_is_key_major(tmp_path):
    """An Ai00 .state (no metadata) stores [h, key, value]; we return [h, value, key]."""
    info = read_checkpoint_info(tmp_path, "7")
    state = make_state(info.n_layer, info.n_embd, info.head_size, seed=5)
    key_major = {k: np.swapaxes(v, 1, 2).astype(np.float16) for k, v in state.items()}
    got = read_state_file(save_as_is(key_major, tmp_path / "ai00.state"), info)
    for i, arr in enumerate(got):
        np.testing.assert_allclose(arr, state[f"blocks.{i}.att.time_state"], rtol=2**-11, atol=6e-8)


def test_pth_state_file_is_official(tmp_path):
    info = read_checkpoint_info(tmp_path, "6")
    state = make_state(info.n_layer, info.n_embd, info.head_size, seed=6)
    write_pth(state, tmp_path / "tuned.pth", dtype="fp32")
    for i, arr in enumerate(read_state_file(tmp_path / "tuned.pth", info)):
        np.testing.assert_array_equal(arr, state[f"blocks.{i}.att.time_state"])


def test_state_tuned_model_keeps_time_state(tmp_path):
    sd = {**checkpoint("6"), **make_state(2, 64, 32, seed=7)}
    write_safetensors(sd, tmp_path / "tuned.st", layout="web-rwkv", dtype="fp32")
    ckpt = read_checkpoint(tmp_path / "tuned.st")
    assert_same_tensors(ckpt.tensors, sd, "fp32")
    states = read_state_file(tmp_path / "tuned.st", ckpt.info)
    np.testing.assert_array_equal(states[1], sd["blocks.1.att.time_state"])


def test_state_file_mismatches_are_refused(tmp_path):
    info = read_checkpoint_info(tmp_path, "6")
    cases = {
        "heads.state": make_state(2, 64, 16),  # 4 heads of 16, the model has 2 of 32
        "short.state": make_state(1, 64, 32),
        "long.state": make_state(3, 64, 32),
        "empty.state": {"blocks.0.ln1.weight": np.ones(64, np.float32)},
    }
    messages = {
        "heads.state": "layer 0 state has shape (4, 16, 16) but the model needs (2, 32, 32)",
        "short.state": "has no state for layer 1",
        "long.state": "has state for 3 layers but the model has 2",
        "empty.state": "no 'blocks.N.att.time_state' tensors",
    }
    for name, tensors in cases.items():
        path = tmp_path / name
        write_safetensors(tensors, path, dtype="fp16")
        with pytest.raises(ModelFileError) as excinfo:
            read_state_file(path, info)
        assert messages[name] in one_line_error(excinfo, path)


def test_state_file_for_v4_is_refused(tmp_path):
    info = read_checkpoint_info(tmp_path, "4")
    path = tmp_path / "v4.state"
    write_safetensors(make_state(2, 64, 64), path)
    with pytest.raises(ModelFileError, match="v4 models do not support state files") as excinfo:
        read_state_file(path, info)
    one_line_error(excinfo, path)


# --------------------------------------------------------------------------- CLI


def run_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "ai00_like", *args], cwd=REPO, capture_output=True, text=True, timeout=120
    )


def test_cli_convert(tmp_path):
    sd = checkpoint("7")
    write_pth(sd, tmp_path / "model.pth", dtype="bf16")
    done = run_cli("convert", str(tmp_path / "model.pth"))
    assert done.returncode == 0, done.stderr
    ckpt = read_checkpoint(tmp_path / "model.st")  # the default output name
    assert ckpt.info.version == "7" and ckpt.layout == "official"
    assert ckpt.tensors["head.weight"].dtype == np.float16  # the default dtype
    assert_same_tensors(ckpt.tensors, read_pth(tmp_path / "model.pth"), "fp16")
    assert not list(tmp_path.glob("*.part"))


def test_cli_convert_options_in_process(tmp_path, capsys):
    from ai00_like.cli import main

    sd = checkpoint("6")
    write_pth(sd, tmp_path / "model.pth", dtype="fp32")
    out = tmp_path / "out.st"
    assert main(["convert", str(tmp_path / "model.pth"), str(out), "--layout", "web-rwkv", "--dtype", "fp32"]) == 0
    assert "blocks.0.att.time_mix_x" in read_safetensors_raw(out).tensors
    assert_same_tensors(read_checkpoint(out).tensors, sd, "fp32")
    assert main(["convert", str(tmp_path / "model.pth"), str(out)]) == 2  # exists, no --force
    assert capsys.readouterr().err.strip().splitlines()[-1] == (
        f"ai00-like: error: {out}: already exists (use --force to overwrite)"
    )
    assert main(["convert", str(tmp_path / "model.pth"), str(out), "--force"]) == 0


def test_cli_convert_bad_input_exits_2_with_one_line(tmp_path):
    bad = write_garbage(tmp_path / "bad.pth", b"PK\x03\x04 definitely not a zip")
    done = run_cli("convert", str(bad))
    assert done.returncode == 2
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1, done.stderr
    assert lines[0].startswith(f"ai00-like: error: {bad}: ")
    assert not (tmp_path / "bad.st").exists()
