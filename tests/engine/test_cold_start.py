"""A model loaded with warm_up="background" on a cold kernel cache (issue 37) answers at
once on numpy and BLAS, while a thread compiles the kernels, and switches to them between
two steps. Nothing here is timed: the warm-up thread is held at a gate, so the test
decides when the kernels are "compiled"."""

from __future__ import annotations

import threading

import numpy as np
import pytest

from ai00_like.rwkv import load_model
from ai00_like.rwkv.accuracy import rel_err
from ai00_like.rwkv.batch import StepInput
from ai00_like.rwkv.cpu import model as cpu_model
from ai00_like.rwkv.cpu.skinny import skinny_matmul
from ai00_like.rwkv.formats.pth import write_pth
from ai00_like.rwkv.synthetic import make_checkpoint

pytestmark = pytest.mark.skipif(skinny_matmul is None, reason="the compiled kernels need numba")

SHAPE = dict(n_layer=2, n_embd=128, head_size=32, vocab=1000, seed=3)
PROMPT = [5, 17, 300, 42, 999, 1, 64, 128]
TOLERANCE = 1e-3  # the engine's conformance bar: max |Δlogits| / std(logits)


def _decode(model, steps=6):
    model.reset(0)
    (logits,) = model.step([StepInput(0, PROMPT)])
    rows, tokens = [logits], []
    for _ in range(steps):
        tokens.append(int(np.argmax(rows[-1])))
        (logits,) = model.step([StepInput(0, [tokens[-1]])])
        rows.append(logits)
    return np.stack(rows), tokens


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_serves_on_numpy_until_the_kernels_are_compiled(tmp_path, monkeypatch, dtype):
    path = tmp_path / f"m-{dtype}.pth"
    write_pth(make_checkpoint("7", **SHAPE), path, dtype)
    compiled_rows, compiled_tokens = _decode(load_model(path, "cpu"))

    gate = threading.Event()
    warm_up = cpu_model.CpuModel._warm_up

    def held(self):
        gate.wait(60)
        warm_up(self)

    monkeypatch.setattr(cpu_model.CpuModel, "_warm_up", held)
    monkeypatch.setattr(cpu_model, "warmed_marker", lambda kind: tmp_path / f"warmed-{kind}")  # a cold cache
    model = load_model(path, "cpu", warm_up="background")
    assert not model.kernels_ready
    numpy_rows, numpy_tokens = _decode(model)
    assert not model.kernels_ready and model.numpy_steps == 7
    assert numpy_tokens == compiled_tokens
    assert rel_err(numpy_rows, compiled_rows) < TOLERANCE

    gate.set()
    assert model.wait_for_kernels(60)
    assert (tmp_path / f"warmed-v7-{model.precision}").exists()  # the next start warms up before it returns
    after_rows, after_tokens = _decode(model)
    assert model.numpy_steps == 7  # no more numpy steps
    assert after_tokens == compiled_tokens
    assert rel_err(after_rows, compiled_rows) < TOLERANCE


def test_a_warm_cache_warms_up_before_returning(tmp_path, monkeypatch):
    path = tmp_path / "m.pth"
    write_pth(make_checkpoint("7", **SHAPE), path, "fp32")
    (tmp_path / "warmed-v7-fp32").touch()
    monkeypatch.setattr(cpu_model, "warmed_marker", lambda kind: tmp_path / f"warmed-{kind}")
    model = load_model(path, "cpu", warm_up="background")
    assert model.kernels_ready
