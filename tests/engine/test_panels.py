"""Int8 and NF4 weights in panels and their exact products (cpu/panels.py,
cpu/panel_int8.py, cpu/panel_nf4.py).

Where the host has AVX-512 a model keeps its Int8 and NF4 matrices in panels and
multiplies them with fp32 activations through one kernel for every row count; elsewhere
it keeps them in rows (int8.py, nf4.py), which a subprocess checks with numba compiling
for an AVX2 CPU.
"""

from __future__ import annotations

import os

import numpy as np
import pytest

from ai00_like.rwkv.cpu import forms, int8, nf4, panel_int8, panel_nf4, panels
from ai00_like.rwkv.cpu.model import CpuModel
from ai00_like.rwkv.info import detect
from ai00_like.rwkv.quant import BLOCK, QuantisedMatrix, quantise_tensors
from ai00_like.rwkv.synthetic import make_checkpoint
from test_packed_weights import AVX2_ONLY, run_compiled_for

needs_avx512 = pytest.mark.skipif(not panels.available(), reason="the host has no AVX-512")
# Each kind: the rows' form, the panels' form and its product.
KINDS = {"int8": (int8.PackedInt8, panel_int8.PanelInt8, panel_int8.panel_int8_matmul),
         "nf4": (nf4.PackedNF4, panel_nf4.PanelNF4, panel_nf4.panel_nf4_matmul)}


def int8_matrix(rows: int, cols: int, seed: int = 0) -> int8.PackedInt8:
    return packed_matrix("int8", rows, cols, seed)


def packed_matrix(kind: str, rows: int, cols: int, seed: int = 0):
    weights = np.random.default_rng(seed).standard_normal((rows, cols)).astype(np.float32) * 0.05
    return KINDS[kind][0].of(QuantisedMatrix.of(kind, weights))


def dequantised(w: int8.PackedInt8) -> np.ndarray:
    """w = low + step · q in float64, each block's (low, step) as the kernels widen them."""
    bounds = w.bounds.view(np.float16).astype(np.float32)
    low, step = bounds[:, 0::2], (bounds[:, 1::2] - bounds[:, 0::2]) / np.float32(255)
    q = w.q.reshape(w.shape[0], -1, panels.INT8_BLOCK).astype(np.float64)
    return (low[:, :, None] + step[:, :, None].astype(np.float64) * q).reshape(w.shape)


def nf4_dequantised(w: nf4.PackedNF4) -> np.ndarray:
    """w = L[code] · absmax in float64."""
    codes = np.stack([w.q & 15, w.q >> 4], axis=-1).reshape(w.shape[0], -1)
    absmax = np.repeat(w.absmax.view(np.float16).astype(np.float64), BLOCK["nf4"], axis=1)
    return w.levels.astype(np.float64)[codes] * absmax


@pytest.mark.parametrize("kind", KINDS)
def test_panels_keep_the_rows_numbers(kind):
    """Panels of a matrix and back (what saving a model writes) give the rows' bytes and
    scales, for a matrix whose last panel is not full."""
    assert panels.INT8_BLOCK == BLOCK["int8"]  # a copy of quant.py's
    rows_form, panel_form, _ = KINDS[kind]
    packed = packed_matrix(kind, 101, 384, seed=4)
    kept = panel_form.of(packed)
    row_bytes = 2 if kind == "int8" else 1
    assert kept.shape == (101, 384) and kept.q.shape == (3, 192, row_bytes * panels.PANEL)
    q, scales = kept.packed()
    np.testing.assert_array_equal(q, packed.q)
    np.testing.assert_array_equal(scales, packed[1])
    assert not kept.q[-1, :, row_bytes * 5:].any()  # rows 101 … 143 of the last panel are zero
    if kind == "int8":
        assert kept.nbytes == 3 * panels.PANEL * (384 + 2 * 2 * 3)


@needs_avx512
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 7, 15, 16, 37, 61, 130, 300])
def test_the_exact_product_equals_the_dequantised_one(kind, rows):
    """Sums made in the calling thread and on the cores (Int8, from PARALLEL_SUM_ROWS), a
    panel not filled (202 = 4 × 48 + 10), more rows of x than a group (GROUP_ROWS), and row
    counts that leave every register block's tail."""
    _, panel_form, product = KINDS[kind]
    packed = packed_matrix(kind, 202, 384)
    x = np.random.default_rng(rows).standard_normal((rows, 384)).astype(np.float32)
    got = product(x, panel_form.of(packed))
    want = x.astype(np.float64) @ (dequantised(packed) if kind == "int8" else nf4_dequantised(packed)).T
    assert got.shape == want.shape and np.abs(got - want).max() < 2e-6 * np.abs(want).max()
    in_rows = (int8.int8_matmul if kind == "int8" else nf4.nf4_matmul)(x, packed)  # the rows' kernels: fp32 too
    assert np.abs(got - in_rows).max() < 2e-6 * np.abs(want).max()


@needs_avx512
@pytest.mark.parametrize("kind", KINDS)
def test_a_row_gets_the_same_bits_whatever_shares_its_call(kind):
    """One kernel, the same fold for every register block of rows: a row's result does not
    depend on the batch or the prompt's chunks around it."""
    _, panel_form, product = KINDS[kind]
    w = panel_form.of(packed_matrix(kind, 101, 256, seed=1))
    assert_rows_keep_their_bits(product, w, panel_int8.PARALLEL_SUM_ROWS + 13)  # Int8's sums on the cores, then here


def assert_rows_keep_their_bits(product, w, rows: int) -> None:
    """`product(x, w)` gives each of `rows` rows of x the same bits in calls of any size."""
    x = np.random.default_rng(2).standard_normal((rows, w.shape[1])).astype(np.float32)
    whole = product(x, w)
    for size in (1, 2, 3, 5, 8, 16, 17, rows - 1):
        parts = [product(x[i : i + size], w) for i in range(0, rows, size)]
        np.testing.assert_array_equal(np.concatenate(parts), whole, err_msg=f"in calls of {size} rows")


def quantised_v7(seed: int = 5, kind: str = "int8"):
    tensors = make_checkpoint("7", n_layer=2, n_embd=256, head_size=64, vocab=500, seed=seed)
    info = detect({name: a.shape for name, a in tensors.items()})
    return quantise_tensors(tensors, info.n_layer, kind, head=True), info


def saved_words(tensors) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """The packed words and scales of each quantised matrix, as saving the model writes them."""
    return {name: (m.packed.copy(), m.scales.copy()) for name, m in tensors.items() if hasattr(m, "packed")}


def assert_saves_the_same(tensors, words: dict[str, tuple[np.ndarray, np.ndarray]]) -> None:
    for name, (packed, scales) in words.items():
        np.testing.assert_array_equal(tensors[name].packed, packed, err_msg=name)
        np.testing.assert_array_equal(tensors[name].scales, scales, err_msg=name)


@needs_avx512
@pytest.mark.parametrize("kind", KINDS)
def test_a_model_holds_its_matrices_once_in_panels(monkeypatch, kind):
    """The exact model's tensors hold the panels its products read (saving writes the rows'
    words again); its logits are those of a model that keeps the rows, to fp32's order of
    sums, and a decoding step gives the bits its prompt's chunk gave. The head is Int8."""
    tensors, info = quantised_v7(kind=kind)
    words = saved_words(tensors)
    model = CpuModel(tensors, info)
    assert isinstance(model.head, panel_int8.PanelInt8) and not model.rounds_activations
    assert model.tensors["head.weight"].panels.q is model.head.q
    assert isinstance(model.blocks[0].channel_mix.W["key"], KINDS[kind][1])
    assert all(isinstance(tensors[name], forms.Panelled) for name in words)
    assert_saves_the_same(tensors, words)
    monkeypatch.setattr(forms, "panels_available", lambda: False)
    in_rows = CpuModel(quantised_v7(kind=kind)[0], info)
    assert isinstance(in_rows.head, int8.PackedInt8)
    assert isinstance(in_rows.blocks[0].channel_mix.W["key"], KINDS[kind][0])
    assert_answers_as_in_rows(model, in_rows, info.vocab)


def assert_answers_as_in_rows(model, in_rows, vocab: int) -> tuple[list[int], np.ndarray]:
    """A model in panels gives the logits of one in rows to fp32's order of sums, and its
    decoding step what its prompt's chunk gave; the prompt and those logits."""
    prompt = np.random.default_rng(0).integers(1, vocab, 200).tolist()
    want, _ = in_rows.forward(prompt, full_output=True)
    got, _ = model.forward(prompt, full_output=True)
    error = np.abs(got - want).max(axis=1) / want.std(axis=1)
    assert np.median(error) < 1e-4 and np.mean(got.argmax(axis=1) == want.argmax(axis=1)) >= 0.99
    _, state = model.forward(prompt[:-1])
    stepped, _ = model.forward(prompt[-1:], state)
    assert np.abs(stepped - got[-1]).max() < 1e-4 * got[-1].std()
    return prompt, got


def test_without_avx512_a_model_keeps_its_matrices_in_rows(tmp_path):
    """numba compiling for an AVX2 CPU: no panels; a dict another model put in panels goes
    back to rows, and the model answers; a bf16 model keeps its matrices in rows."""
    printed = run_compiled_for(tmp_path, "haswell", AVX2_ONLY,
        "import sys\n"
        f"sys.path.insert(0, {os.path.dirname(__file__)!r})\n"
        "import numpy as np\n"
        "from ai00_like.rwkv.cpu import forms, int8, nf4, panel_int8, panels\n"
        "from ai00_like.rwkv.cpu.model import CpuModel\n"
        "from test_panels import quantised_v7\n"
        "assert not panels.available()\n"
        "tensors, info = quantised_v7(kind='nf4')\n"
        "tensors['head.weight'] = forms.Panelled('int8', panel_int8.PanelInt8.of(int8.PackedInt8.of(tensors['head.weight'])))\n"
        "model = CpuModel(tensors, info)\n"
        "assert isinstance(model.head, int8.PackedInt8) and not any(isinstance(m, forms.Panelled) for m in tensors.values())\n"
        "assert isinstance(model.blocks[0].channel_mix.W['key'], nf4.PackedNF4)\n"
        "assert np.isfinite(model.forward([1, 2, 3])[0]).all()\n"
        "from ai00_like.rwkv.cpu import panel_bf16\n"
        "from test_bf16_panels import bf16_v7\n"
        "panel_bf16.PANEL_WIDTH = 0\n"
        "assert isinstance(CpuModel(*bf16_v7()).head, np.ndarray)\n"
        "print('rows')\n")
    assert "rows" in printed
