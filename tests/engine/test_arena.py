"""The matrices a CPU model streams live in huge pages where the system offers them
(rwkv/cpu/arena.py): copied out of the file's mapping as the layers are built, the file's
pages dropped, the numbers unchanged."""

from __future__ import annotations

import numpy as np
import pytest

from ai00_like.rwkv import load_model
from ai00_like.rwkv.cpu import arena
from ai00_like.rwkv.formats import map_file, mapped_from_file, release_pages
from ai00_like.rwkv.formats.pth import write_pth
from ai00_like.rwkv.formats.safetensors import write_safetensors
from ai00_like.rwkv.synthetic import make_checkpoint
from memory_helpers import HAS_SMAPS, mapped_bytes, resident_bytes_of

pytestmark = pytest.mark.skipif(not arena.huge_pages_offered() or not HAS_SMAPS,
                                reason="needs Linux with transparent huge pages")

SHAPE = dict(n_layer=2, n_embd=256, head_size=64, vocab=4096, seed=9)
PROMPT = [5, 17, 300, 42, 1000, 7]


def _advised_for_huge_pages(array: np.ndarray) -> bool:
    """Whether the mapping holding `array` carries madvise's huge-page flag (smaps' "hg")."""
    address, inside = array.__array_interface__["data"][0], False
    for line in open("/proc/self/smaps"):
        fields = line.split()
        if "-" in fields[0] and not fields[0].endswith(":"):
            start, end = (int(a, 16) for a in fields[0].split("-"))
            inside = start <= address < end
        elif inside and fields[0] == "VmFlags:":
            return "hg" in fields[1:]
    return False


def _matrices(model):
    """Matrices each step streams as the file holds them (a LoRA factor is transposed at load)."""
    tm, cm = model.blocks[0].time_mix, model.blocks[0].channel_mix
    return [tm.W["receptance"], tm.W["output"], cm.W["key"], model.blocks[1].channel_mix.W["value"], model.head]


@pytest.mark.parametrize("form", ["bf16.pth", "fp16.st", "fp32.pth"])
def test_streamed_matrices_move_to_huge_pages_with_the_same_numbers(tmp_path, form, monkeypatch):
    dtype, fmt = form.split(".")
    path = tmp_path / f"model.{fmt}"
    tensors = make_checkpoint("7", **SHAPE)
    write_pth(tensors, path, dtype) if fmt == "pth" else write_safetensors(tensors, path, dtype=dtype)
    model = load_model(path, device="cpu")
    for matrix in _matrices(model):
        assert not mapped_from_file(matrix) and _advised_for_huge_pages(matrix)
        assert not matrix.flags.writeable  # as a mapped one: the kernels are compiled for one type
    assert resident_bytes_of(path) < 0.1 * path.stat().st_size  # the file's pages went
    logits, _ = model.forward(PROMPT)

    monkeypatch.setattr(arena, "huge_pages_offered", lambda: False)  # as on a system without them
    in_place = load_model(path, device="cpu")
    assert mapped_from_file(in_place.blocks[0].time_mix.W["receptance"])
    np.testing.assert_array_equal(in_place.forward(PROMPT)[0], logits)


def test_a_matrix_converted_at_load_is_written_into_huge_pages(tmp_path, monkeypatch):
    """A bf16 file kept as fp16 is converted straight into the arena, tensor by tensor (no
    second copy of a converted matrix), to the numbers a conversion into numpy's memory gives."""
    path = tmp_path / "model.pth"
    write_pth(make_checkpoint("7", **SHAPE), path, "bf16")
    model = load_model(path, device="cpu", precision="fp16")
    for matrix in _matrices(model) + [model.blocks[0].time_mix.lora["w1"]]:
        assert matrix.dtype == np.float16 and not mapped_from_file(matrix)
        assert not matrix.flags.owndata and _advised_for_huge_pages(matrix)
    logits, _ = model.forward(PROMPT)

    monkeypatch.setattr(arena, "huge_pages_offered", lambda: False)
    elsewhere = load_model(path, device="cpu", precision="fp16")
    assert elsewhere.head.flags.owndata
    np.testing.assert_array_equal(elsewhere.head, model.head)
    np.testing.assert_array_equal(elsewhere.forward(PROMPT)[0], logits)


def test_dropping_a_files_pages_never_touches_the_arena(tmp_path):
    """release_pages drops a file mapping's pages (they read back from the file); the arena's
    are the only copy. Copied a part at a time, with each part's file pages dropped."""
    path = tmp_path / "raw"
    np.arange(512 * 1024, dtype=np.float32).tofile(path)
    mapped = np.frombuffer(map_file(path), dtype=np.float32).reshape(512, 1024)
    room = arena.Arena(8 << 20)
    held = room.hold(mapped)
    assert mapped_bytes(mapped) == 0  # the file's pages went as they were copied
    assert held is not mapped and not mapped_from_file(held)
    release_pages(held)
    np.testing.assert_array_equal(held.reshape(-1), np.arange(512 * 1024, dtype=np.float32))
