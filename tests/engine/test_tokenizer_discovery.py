"""A model finds its own vocabulary (beside it, or named in its safetensors metadata), and a
model whose vocabulary a tokenizer does not fit is refused at load in one line."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ai00_like.loaded import build
from ai00_like.messages import ModelSpec
from ai00_like.rwkv.formats.safetensors import read_safetensors_metadata, write_safetensors
from ai00_like.rwkv.synthetic import make_checkpoint
from ai00_like.rwkv.tokenizer import (
    check_vocabulary,
    default_tokenizer_path,
    find_tokenizer,
    load_tokenizer,
)
from ai00_like.rwkv.tokenizer.discovery import NAMED_AFTER_MODEL

MODELS = Path(__file__).resolve().parents[2] / "assets" / "models"
DEMO, DEMO_VOCAB = MODELS / "demo.st", MODELS / "demo_vocab.txt"
TEXT = "In the beginning God created the heaven and the earth."


@pytest.fixture
def demo_alone(tmp_path) -> Path:
    folder = tmp_path / "alone"
    folder.mkdir()
    return Path(shutil.copy(DEMO, folder / "demo.st"))


@pytest.fixture
def demo_with_vocab(tmp_path) -> Path:
    folder = tmp_path / "with_vocab"
    folder.mkdir()
    shutil.copy(DEMO_VOCAB, folder / "demo_vocab.txt")
    return Path(shutil.copy(DEMO, folder / "demo.st"))


def synthetic(path: Path, **metadata: str) -> Path:
    """A tiny v7 model of the demo vocabulary's size, with `metadata` in its header."""
    tensors = make_checkpoint("7", n_layer=1, n_embd=32, head_size=16, vocab=4096, seed=1)
    write_safetensors(tensors, path, metadata=metadata or None)
    return path


# ------------------------------------------------------------------------------ finding


def test_a_vocabulary_named_after_the_model_is_found(demo_with_vocab, demo_alone):
    assert find_tokenizer(demo_with_vocab) == demo_with_vocab.parent / "demo_vocab.txt"
    assert find_tokenizer(demo_alone) is None


def test_the_names_are_tried_in_the_documented_order(tmp_path):
    model = tmp_path / "m.st"
    model.write_bytes(b"not read")
    names = [pattern.format(stem="m") for pattern in NAMED_AFTER_MODEL]
    for name in reversed(names):  # each newly written name comes earlier in the order
        (tmp_path / name).write_text("x")
        assert find_tokenizer(model) == tmp_path / name
    assert names[0] == "m_vocab.txt"


def test_a_folder_or_the_model_itself_is_never_taken(tmp_path):
    (tmp_path / "m_vocab.txt").mkdir()
    model = tmp_path / "m.json"  # a model named like one of the candidates
    model.write_bytes(b"{}")
    assert find_tokenizer(model) is None


def test_safetensors_metadata_names_a_vocabulary_beside_the_model(tmp_path):
    model = synthetic(tmp_path / "model.st", tokenizer="my_vocab.txt")
    assert read_safetensors_metadata(model)["tokenizer"] == "my_vocab.txt"
    assert find_tokenizer(model) is None  # named, but not there
    shutil.copy(DEMO_VOCAB, tmp_path / "my_vocab.txt")
    assert find_tokenizer(model) == tmp_path / "my_vocab.txt"


def test_the_writer_keeps_its_own_metadata_keys(tmp_path):
    model = synthetic(tmp_path / "model.st", rwkv_layout="web-rwkv", tokenizer="v.txt")
    assert read_safetensors_metadata(model) == {"rwkv_layout": "official", "tokenizer": "v.txt"}


@pytest.mark.parametrize("name", ["../outside.txt", "/etc/passwd", "sub/inner.txt", "..", "", "model.st",
                                  "..\\outside.txt"])
def test_metadata_that_leaves_the_models_folder_is_ignored(tmp_path, name):
    folder = tmp_path / "models"
    (folder / "sub").mkdir(parents=True)
    for target in (tmp_path / "outside.txt", folder / "sub" / "inner.txt"):
        shutil.copy(DEMO_VOCAB, target)
    model = synthetic(folder / "model.st", tokenizer=name)
    assert find_tokenizer(model) is None


def test_a_corrupt_or_foreign_file_finds_nothing(tmp_path):
    (tmp_path / "broken.st").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{not json")
    (tmp_path / "model.pth").write_bytes(b"PK")
    assert find_tokenizer(tmp_path / "broken.st") is None
    assert find_tokenizer(tmp_path / "model.pth") is None
    assert find_tokenizer(tmp_path / "missing.st") is None


# ------------------------------------------------------------------------------ the check


def test_a_smaller_tokenizer_fits_and_a_larger_one_is_one_line():
    world = load_tokenizer(default_tokenizer_path())
    check_vocabulary(world, 65536, "padded.st", default_tokenizer_path())  # 65530 ids in 65536 rows
    check_vocabulary(world, world.vocab_size, "exact.st", default_tokenizer_path())
    with pytest.raises(ValueError) as refused:
        check_vocabulary(world, world.vocab_size - 1, "/models/short.st", default_tokenizer_path())
    message = str(refused.value)
    assert "\n" not in message and "short.st" in message and "short_vocab.txt" in message
    assert str(world.vocab_size - 1) in message and "World vocabulary" in message


# ------------------------------------------------------------------------------ loading


def test_the_demo_model_loads_with_the_vocabulary_beside_it(demo_with_vocab):
    loaded = build(ModelSpec(path=str(demo_with_vocab), device="cpu", max_batch=1))
    try:
        vocab = demo_with_vocab.parent / "demo_vocab.txt"
        assert loaded.spec.tokenizer == str(vocab)  # what /api/models/info reports
        assert loaded.tokenizer.source == str(vocab)
        tokens = loaded.encode(TEXT)
        assert max(tokens) < 4096 and tokens == tuple(load_tokenizer(DEMO_VOCAB).encode(TEXT))
        assert loaded.tokenizer.decode(tokens) == TEXT
    finally:
        loaded.backend.stop("test")


def test_the_demo_model_alone_is_refused_in_one_line(demo_alone):
    with pytest.raises(ValueError) as refused:
        build(ModelSpec(path=str(demo_alone), device="cpu", max_batch=1))
    message = str(refused.value)
    assert "\n" not in message
    assert str(demo_alone) in message and "4096" in message and "65530" in message
    assert default_tokenizer_path().name in message and "demo_vocab.txt" in message


def test_a_tokenizer_named_in_the_metadata_is_loaded_and_checked(tmp_path):
    shutil.copy(DEMO_VOCAB, tmp_path / "my_vocab.txt")
    model = synthetic(tmp_path / "model.st", tokenizer="my_vocab.txt")
    loaded = build(ModelSpec(path=str(model), device="cpu", max_batch=1))
    try:
        assert loaded.spec.tokenizer == str(tmp_path / "my_vocab.txt")
    finally:
        loaded.backend.stop("test")
    shutil.copy(default_tokenizer_path(), tmp_path / "world.txt")
    other = synthetic(tmp_path / "other.st", tokenizer="world.txt")
    with pytest.raises(ValueError, match="world.txt"):
        build(ModelSpec(path=str(other), device="cpu", max_batch=1))


# ------------------------------------------------------------------------------ the command line


def generate(model: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "ai00_like", "generate", "--model", str(model), "--max-tokens", "3",
                           "--seed", "1", "In the beginning"], capture_output=True, text=True, timeout=120, check=False)


def test_generate_refuses_the_demo_model_alone_in_one_line(demo_alone):
    result = generate(demo_alone)
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1, result.stderr
    assert "demo.st" in lines[0] and "4096" in lines[0] and "does not belong to this model" in lines[0]
    assert "--tokenizer" in lines[0] and "Traceback" not in result.stderr


def test_generate_finds_the_vocabulary_beside_the_model(demo_with_vocab):
    result = generate(demo_with_vocab)
    assert result.returncode == 0 and result.stdout.strip(), result.stderr
