"""Quantised models (issue 6): Int8/NF4 projections on both backends, saved as a "prefab"
that loads back without quantising again (POST /admin/models/save)."""

from __future__ import annotations

import numpy as np
import pytest
from api_helpers import ServerThread, config_for, write_model
from engine_helpers import NEEDS_GPU

from ai00_like.rwkv import load_model, quant
from ai00_like.rwkv.formats.safetensors import write_safetensors
from ai00_like.rwkv.cpu.int8 import PackedInt8
from ai00_like.rwkv.cpu.panels import Int8Panels
from ai00_like.rwkv.quant import QuantisedMatrix, quantisation_of
from ai00_like.rwkv.synthetic import make_checkpoint

DEVICES = ["cpu", pytest.param("gpu", marks=NEEDS_GPU)]
PROMPT = [5, 300, 7000, 42, 42, 9]


@pytest.mark.parametrize("kind", ["int8", "nf4"])
@pytest.mark.parametrize("device", DEVICES)
def test_saved_quantised_model_loads_back_without_quantising(tmp_path, device, kind, monkeypatch):
    path = write_model(tmp_path / "tiny.st")
    model = load_model(path, device, quant=2, quant_type=kind.upper(), precision="fp32")
    assert quantisation_of(model.tensors) == (2, kind)
    want = model.forward(PROMPT)[0]
    plain = load_model(path, device, precision="fp32").forward(PROMPT)[0]
    assert np.abs(want - plain).max() > 0  # the quantisation is really in use

    write_safetensors(model.tensors, tmp_path / "q.st")
    write_safetensors(load_model(path, "cpu").tensors, tmp_path / "f16.st")
    assert (tmp_path / "q.st").stat().st_size < (tmp_path / "f16.st").stat().st_size

    def no_quantising(*args):
        raise AssertionError("a saved quantised model was quantised again")

    monkeypatch.setattr(quant, "quantise", no_quantising)
    again = load_model(tmp_path / "q.st", device, precision="fp32")
    assert quantisation_of(again.tensors) == (2, kind)
    np.testing.assert_array_equal(again.forward(PROMPT)[0], want)


@pytest.mark.parametrize("kind, ratio", [("int8", 0.52), ("nf4", 0.27)])
def test_quantised_bytes_against_fp16(kind, ratio):
    weights = np.random.default_rng(0).standard_normal((256, 512)).astype(np.float32)
    stored = QuantisedMatrix.of(kind, weights)
    assert stored.nbytes / (weights.size * 2) == pytest.approx(ratio, abs=0.01)
    # each weight within half a quantisation step of its block (plus the f16 rounding of the scales)
    step = 1 / 255 * np.ptp(weights) if kind == "int8" else np.diff(quant.NF4_LEVELS).max() * np.abs(weights).max()
    assert np.abs(np.asarray(stored) - weights).max() <= 0.5 * step * 1.01


def test_server_loads_quantised_and_saves_a_prefab(tmp_path):
    write_model(tmp_path / "tiny.st")
    greedy = {"prompt": "The cat", "max_tokens": 8, "temperature": 0}
    config = config_for(tmp_path, 'quant = 1\nquant_type = "NF4"\ndevice = "cpu"')
    with ServerThread(config) as server:
        info = server.get("/api/models/info").json()["reload"]
        assert (info["quant"], info["quant_type"]) == (1, "nf4")
        want = server.post("/v1/completions", greedy).json()["choices"][0]["text"]
        saved = server.post("/admin/models/save", {"path": "tiny-nf4.st"})
        assert saved.status == 200, saved
        # loaded without quantisation asked for, it is still the NF4 model
        r = server.post("/admin/models/load", {"model_path": "tiny-nf4.st", "quant": 0})
        assert r.status == 200, r
        assert server.post("/v1/completions", greedy).json()["choices"][0]["text"] == want
        info = server.get("/api/models/info").json()["reload"]
        assert (info["quant"], info["quant_type"]) == (1, "nf4")  # what is loaded, not what was asked


def test_convert_writes_a_quantised_model(tmp_path):
    from ai00_like.cli import main

    path = write_model(tmp_path / "tiny.st")
    assert main(["convert", str(path), str(tmp_path / "q.st"), "--quant", "1", "--quant-type", "int8"]) == 0
    saved = load_model(tmp_path / "q.st", "cpu")
    assert quantisation_of(saved.tensors) == (1, "int8")
    want = load_model(path, "cpu", quant=1, quant_type="int8").forward(PROMPT)[0]
    np.testing.assert_array_equal(saved.forward(PROMPT)[0], want)
    assert main(["convert", str(path), str(tmp_path / "w.st"), "--quant", "1", "--layout", "web-rwkv"]) == 2


def test_the_head_quantised_is_kept_through_config_save_and_convert(tmp_path):
    """[model] quant_head: the head as Int8 blocks; the server reports it, a saved prefab keeps
    it (loaded back with nothing asked), and `convert --quant-head` writes the same model."""
    from ai00_like.cli import main
    from ai00_like.rwkv.quant import head_quantised

    path = write_model(tmp_path / "tiny.st")
    greedy = {"prompt": "The cat", "max_tokens": 8, "temperature": 0}
    with ServerThread(config_for(tmp_path, 'quant = 1\nquant_type = "NF4"\nquant_head = true\ndevice = "cpu"')) as server:
        info = server.get("/api/models/info").json()["reload"]
        assert (info["quant"], info["quant_type"], info["quant_head"]) == (1, "nf4", True)
        want = server.post("/v1/completions", greedy).json()["choices"][0]["text"]
        assert server.post("/admin/models/save", {"path": "tiny-head.st"}).status == 200
        r = server.post("/admin/models/load", {"model_path": "tiny.st", "quant": 1, "quant_type": "nf4",
                                               "quant_head": False})
        assert r.status == 200 and r.json()["reload"]["quant_head"] is False
        r = server.post("/admin/models/load", {"model_path": "tiny-head.st", "quant": 0, "quant_head": False})
        assert r.status == 200 and r.json()["reload"]["quant_head"] is True  # what is loaded
        assert server.post("/v1/completions", greedy).json()["choices"][0]["text"] == want
    saved = load_model(tmp_path / "tiny-head.st", "cpu")
    assert head_quantised(saved.tensors) and quantisation_of(saved.tensors) == (1, "nf4")
    assert main(["convert", str(path), str(tmp_path / "c.st"), "--quant", "1", "--quant-type", "nf4",
                 "--quant-head"]) == 0
    converted = load_model(tmp_path / "c.st", "cpu")
    assert head_quantised(converted.tensors)
    np.testing.assert_array_equal(converted.forward(PROMPT)[0], saved.forward(PROMPT)[0])
    plain = load_model(path, "cpu", quant=1, quant_type="nf4").forward(PROMPT)[0]
    assert np.abs(plain - saved.forward(PROMPT)[0]).max() > 0  # the head's blocks are really in use


@NEEDS_GPU
@pytest.mark.parametrize("kind", ["int8", "nf4"])
def test_quantised_logits_agree_between_the_backends(tmp_path, kind):
    # The same packed blocks, read by the CPU's byte kernel (Int8) or as dequantised fp32
    # (NF4) and by the GPU's kernels; 128 channels so that Int8 rows are whole blocks.
    tensors = make_checkpoint("7", n_layer=2, n_embd=128, head_size=64, vocab=1000, seed=9)
    write_safetensors(quant.quantise_tensors(tensors, 2, kind), tmp_path / "q.st", dtype="fp32")
    cpu, gpu = load_model(tmp_path / "q.st", "cpu"), load_model(tmp_path / "q.st", "gpu")
    if kind == "int8":
        assert isinstance(cpu.blocks[1].time_mix.W["key"], (PackedInt8, Int8Panels))  # rows, or panels (AVX-512)
    prompt = np.random.default_rng(1).integers(1, 1000, 40).tolist()
    want, state = cpu.forward(prompt)
    got, gpu_state = gpu.forward(prompt)
    assert np.abs(got - want).max() < 1e-4 * want.std()
    want, got = cpu.forward([7], state)[0], gpu.forward([7], gpu_state)[0]  # a decode step: the byte kernel
    assert np.abs(got - want).max() < 1e-4 * want.std()
