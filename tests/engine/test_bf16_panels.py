"""bf16 weights in panels and their exact products (cpu/panel_bf16.py).

Where the host has AVX-512 a model at least panel_bf16.PANEL_WIDTH wide keeps its bf16
projections and head in panels and multiplies them with fp32 activations through one
kernel for every row count; its tensors (what saving writes) stay as loaded. Narrower
models, and hosts without AVX-512 (test_panels.py's subprocess), keep them in rows.
"""

from __future__ import annotations

import numpy as np
import pytest

from ai00_like.rwkv.cpu import panel_bf16, panels
from ai00_like.rwkv.cpu.model import CpuModel
from ai00_like.rwkv.formats import bf16_to_f32, f32_to_bf16, is_bf16
from ai00_like.rwkv.info import detect
from ai00_like.rwkv.synthetic import make_checkpoint
from test_panels import assert_answers_as_in_rows, assert_rows_keep_their_bits

needs_avx512 = pytest.mark.skipif(not panels.available(), reason="the host has no AVX-512")


def bf16_matrix(rows: int, cols: int, seed: int = 0) -> np.ndarray:
    return f32_to_bf16(np.random.default_rng(seed).standard_normal((rows, cols)).astype(np.float32) * 0.05)


def bf16_v7(seed: int = 5):
    """A small v7 checkpoint as a bf16 file holds it."""
    tensors = make_checkpoint("7", n_layer=2, n_embd=256, head_size=64, vocab=500, seed=seed)
    info = detect({name: a.shape for name, a in tensors.items()})
    return {name: f32_to_bf16(a) for name, a in tensors.items()}, info


def test_panels_keep_the_rows_bits():
    """A matrix whose last panel is not full, in panels and back: the same bit patterns,
    zero past its rows, starting on a cache line."""
    matrix = bf16_matrix(101, 384, seed=4)
    kept = panel_bf16.in_panels(matrix)
    assert isinstance(kept, panel_bf16.PanelBf16) and kept.shape == (101, 384)
    assert kept.q.shape == (3, 192, 2 * panels.PANEL) and kept.q.ctypes.data % 64 == 0
    np.testing.assert_array_equal(kept.packed(), matrix.view(np.uint16))
    assert not kept.q[-1, :, 2 * 5:].any()  # rows 101 … 143 of the last panel are zero
    assert kept.nbytes == matrix.nbytes * 144 // 101
    assert isinstance(panel_bf16.in_panels(bf16_matrix(4, 96)), np.ndarray)  # not whole blocks: in rows


@pytest.mark.parametrize("rows", [1, 2, 3, 4, 7, 15, 16, 37, 130, 300])
def test_the_product_equals_the_widened_one(rows):
    """The compiled kernel (on AVX-512) and numpy's product (a background warm-up's) against
    the widened weights in float64: a panel not filled (202 = 4 × 48 + 10), more rows of x
    than a group (GROUP_ROWS), every register block's tail."""
    matrix = bf16_matrix(202, 384)
    kept = panel_bf16.in_panels(matrix)
    x = np.random.default_rng(rows).standard_normal((rows, 384)).astype(np.float32)
    want = x.astype(np.float64) @ bf16_to_f32(matrix).astype(np.float64).T
    products = [panel_bf16.numpy_product] + ([panel_bf16.matmul] if panels.available() else [])
    for product in products:
        got = product(x, kept)
        assert got.shape == want.shape and np.abs(got - want).max() < 2e-6 * np.abs(want).max(), product


@needs_avx512
def test_a_row_gets_the_same_bits_whatever_shares_its_call():
    assert_rows_keep_their_bits(panel_bf16.matmul, panel_bf16.in_panels(bf16_matrix(101, 256, seed=1)), 61)


@needs_avx512
def test_a_wide_model_holds_its_bf16_matrices_in_panels(monkeypatch):
    """Its layers' projections and head in panels, its tensors as loaded (saving writes
    them); logits those of the model in rows to fp32's order of sums, also on numpy (a
    background warm-up); a decoding step gives what its prompt's chunk gave."""
    tensors, info = bf16_v7()
    loaded = {name: a.copy() for name, a in tensors.items()}
    monkeypatch.setattr(panel_bf16, "PANEL_WIDTH", 256)
    model = CpuModel(tensors, info)
    assert isinstance(model.head, panel_bf16.PanelBf16) and model.compiled_rows == 1 << 30
    assert all(isinstance(m, panel_bf16.PanelBf16) for m in model.blocks[1].time_mix.W.values())
    assert is_bf16(model.blocks[1].time_mix.lora["w1"])  # the LoRAs stay in rows
    for name, a in loaded.items():
        np.testing.assert_array_equal(model.tensors[name].view(np.uint16), a.view(np.uint16), err_msg=name)
    monkeypatch.setattr(panel_bf16, "PANEL_WIDTH", 512)
    in_rows = CpuModel(bf16_v7()[0], info)
    assert isinstance(in_rows.head, np.ndarray)
    prompt, got = assert_answers_as_in_rows(model, in_rows, info.vocab)
    model.kernels_ready = False  # as while a background warm-up compiles: numpy's products
    on_numpy, _ = model.forward(prompt[:40], full_output=True)
    assert np.abs(on_numpy - got[:40]).max() < 1e-3 * got.std()
