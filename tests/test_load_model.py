"""load_model: the library entry point, from real files."""

from __future__ import annotations

import numpy as np
import pytest

from ai00_like.rwkv import load_model
from ai00_like.rwkv.cpu.model import CpuModel
from ai00_like.rwkv.formats.pth import write_pth
from ai00_like.rwkv.formats.safetensors import write_safetensors
from ai00_like.rwkv.loader import read_checkpoint
from ai00_like.rwkv.synthetic import make_checkpoint


@pytest.mark.parametrize("fmt,dtype", [("pth", "bf16"), ("st", "fp16"), ("st", "fp32")])
def test_any_storage_gives_the_model_of_its_widened_weights(tmp_path, fmt, dtype):
    tensors = make_checkpoint("7", n_layer=3, n_embd=64, head_size=32, vocab=300, seed=2)
    path = tmp_path / f"m.{fmt}"
    (write_pth(tensors, path, dtype=dtype) if fmt == "pth" else write_safetensors(tensors, path, dtype=dtype))
    calls = []
    model = load_model(path, progress=lambda done, total: calls.append((done, total)))
    eager = read_checkpoint(path)  # every tensor widened to float32 up front
    reference = CpuModel({k: np.array(v, dtype=np.float32) for k, v in eager.tensors.items()}, eager.info)
    tokens = [5, 17, 250, 3, 99]
    np.testing.assert_array_equal(model.forward(tokens)[0], reference.forward(tokens)[0])
    assert calls[-1] == (4, 4) and [d for d, _ in calls] == sorted(d for d, _ in calls)
