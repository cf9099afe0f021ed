"""Int8 products on activations rounded to 16-bit integers (cpu/vnni.py, `[model] exact = false`).

The kernels need AVX-512 VNNI: where the host lacks it, the tests that run them skip, the
kernels are still compiled for such a CPU, and a model asked for them keeps fp32 products.
"""

from __future__ import annotations

import numpy as np
import pytest

from ai00_like.rwkv.cpu import forms, int8, panels, vector_dots, vnni
from ai00_like.rwkv.cpu.model import CpuModel
from test_panels import assert_rows_keep_their_bits, assert_saves_the_same, dequantised, int8_matrix, quantised_v7, saved_words
from test_packed_weights import AVX512, run_compiled_for

VNNI = AVX512 + ",+avx512vnni"

needs_vnni = pytest.mark.skipif(not vnni.available(), reason="the host has no AVX-512 VNNI")


def rounded_reference(x: np.ndarray, w: int8.PackedInt8) -> np.ndarray:
    """x̂ · Wᵀ in float64, x̂ as round_rows rounds x: what the kernels must compute."""
    rows, cols = x.shape
    blocks = cols // vnni.INT8_BLOCK
    xq = np.empty((blocks, rows, vnni.INT8_BLOCK), np.int16)
    x_scale = np.empty((rows, blocks), np.float32)
    vnni.round_rows(x, xq, x_scale, np.empty_like(x_scale))
    x_hat = (xq.astype(np.float64) * x_scale.T[:, :, None]).transpose(1, 0, 2).reshape(rows, cols)
    return x_hat @ dequantised(w).T


def assert_rounded_int8_product(rows: int):
    """The rounded product of a seeded 202 × 384 matrix, a panel not filled (4 × 48 + 10),
    is that of the rounded activations, on whichever kernel this process has."""
    packed = int8_matrix(202, 384)
    w = vnni.RoundedInt8.of(packed)
    assert w.shape == packed.shape and w.q.shape == (5, 384 // w.GROUP, w.GROUP * panels.PANEL)
    x = np.random.default_rng(rows).standard_normal((rows, 384)).astype(np.float32)
    got = vnni.rounded_int8_matmul(x, w)
    want = rounded_reference(x, packed)
    assert np.abs(got - want).max() < 1e-5 * np.abs(want).max()
    exact = int8.int8_matmul(x, packed)  # fp32 activations: 16-bit rounding is far below the weights' own
    assert np.abs(got - exact).max() < 2e-4 * np.abs(exact).max()


@needs_vnni
@pytest.mark.parametrize("rows", [1, 3, 4, 15, 16, 17, 37, 61, 130, 300])
def test_the_product_is_exact_for_the_rounded_activations(rows):
    """Rows rounded in the calling thread and on the cores (from PARALLEL_ROUNDING_ROWS),
    more rows of x than a group (GROUP_ROWS), and row counts that leave every register
    block's tail, or a tile's."""
    assert_rounded_int8_product(rows)


@pytest.mark.skipif(not vnni.ON_TILES, reason="the host has no AMX tiles")
@pytest.mark.parametrize("rows", [1, 16, 37, 130])
def test_on_amx_tiles_a_product_has_vpdpwssds_bits(rows):
    """On AMX's tiles x's 16-bit integers are multiplied as their high and low bytes; the
    block sums are the same integers, folded the same way: the same bits as vpdpwssd's
    kernel on the weights in pairs."""
    packed = int8_matrix(202, 384, seed=2)
    x = np.random.default_rng(rows).standard_normal((rows, 384)).astype(np.float32)
    xq = np.empty((3, rows, vnni.INT8_BLOCK), np.int16)
    x_scale, x_sum = np.empty((rows, 3), np.float32), np.empty((rows, 3), np.float32)
    vnni.round_rows(x, xq, x_scale, x_sum)
    pairs, want = panels.Int8Panels.of(packed), np.empty((rows, 202), np.float32)
    panels.panel_product(pairs.q, pairs.bounds, (xq.view(np.int32), x_scale, x_sum), want)
    np.testing.assert_array_equal(vnni.rounded_int8_matmul(x, vnni.RoundedInt8.of(packed)), want)


@needs_vnni
def test_a_row_gets_the_same_bits_whatever_shares_its_call():
    """Rounded per row, each block's sum exact, the fold the same in every kernel: a row's
    result does not depend on the batch or the prompt's chunks around it."""
    w = vnni.RoundedInt8.of(int8_matrix(101, 256, seed=1))
    # Rounded on the cores, then in parts in this thread.
    assert_rows_keep_their_bits(vnni.rounded_int8_matmul, w, vnni.PARALLEL_ROUNDING_ROWS + 13)


@needs_vnni
def test_rounding_keeps_each_blocks_largest_value_and_zero_blocks():
    x = np.random.default_rng(3).standard_normal((2, 256)).astype(np.float32)
    x[1, 128:] = 0.0
    xq = np.empty((2, 2, 128), np.int16)
    x_scale, x_sum = np.empty((2, 2), np.float32), np.empty((2, 2), np.float32)
    vnni.round_rows(x, xq, x_scale, x_sum)
    assert np.abs(xq).max() == 32767 and x_scale[1, 1] == 0 and not xq[1, 1].any() and x_sum[1, 1] == 0
    x_hat = xq.astype(np.float64) * x_scale.T[:, :, None]
    assert np.abs(x_hat.transpose(1, 0, 2).reshape(2, 256) - x).max() <= x_scale.max() / 2
    np.testing.assert_allclose(x_sum, x_hat.sum(axis=2).T, rtol=1e-6)


@needs_vnni
def test_a_model_rounds_its_int8_products_only_when_not_exact():
    """The rounding model holds its Int8 matrices once, in panels, in its tensors (saving
    writes them in rows again); a model built after it from the same dict multiplies the
    same panels exactly."""
    tensors, info = quantised_v7()
    words = saved_words(tensors)
    exact, rounded = CpuModel(tensors, info), CpuModel(tensors, info, exact=False)
    assert not exact.rounds_activations and rounded.rounds_activations
    assert isinstance(rounded.head, vnni.RoundedInt8) and not isinstance(exact.head, vnni.RoundedInt8)
    assert rounded.tensors["head.weight"].panels.q is rounded.head.q
    assert_saves_the_same(rounded.tensors, words)
    again = CpuModel(tensors, info)  # the panels back in the exact form's layout (AMX's tiles take another)
    assert not again.rounds_activations
    assert not any(type(m.panels) is vnni.RoundedInt8 for m in tensors.values() if isinstance(m, forms.Panelled))
    prompt = np.random.default_rng(0).integers(1, info.vocab, 200).tolist()
    want, _ = exact.forward(prompt, full_output=True)
    np.testing.assert_array_equal(again.forward(prompt[:40])[0], exact.forward(prompt[:40])[0])
    got, _ = rounded.forward(prompt, full_output=True)
    error = np.abs(got - want).max(axis=1) / want.std(axis=1)
    assert np.median(error) < 2e-3 and np.mean(got.argmax(axis=1) == want.argmax(axis=1)) >= 0.99
    # Decoding (the fused layers' products) rounds as the prompt's chunk does; the two
    # differ only by the WKV's order of sums (1e-5 exact), which can move a rounded value.
    logits, state = rounded.forward(prompt[:-1])
    stepped, _ = rounded.forward(prompt[-1:], state)
    assert np.abs(stepped - got[-1]).max() < 1e-3 * got[-1].std()


def test_without_vnni_a_model_keeps_fp32_products(tmp_path):
    """NUMBA_CPU_FEATURES without VNNI (an older CPU, or a release built for one): the
    rounded form is not offered, and a model asked for it keeps the exact products."""
    from llvmlite import binding

    features = binding.get_host_cpu_features()
    features["avx512vnni"] = False
    printed = run_compiled_for(tmp_path, binding.get_host_cpu_name(), features.flatten(),
        "import numpy as np\n"
        "from ai00_like.rwkv.cpu import vnni\n"
        "from ai00_like.rwkv.cpu.model import CpuModel\n"
        "from ai00_like.rwkv.info import detect\n"
        "from ai00_like.rwkv.quant import quantise_tensors\n"
        "from ai00_like.rwkv.synthetic import make_checkpoint\n"
        "assert not vnni.available()\n"
        "t = make_checkpoint('7', n_layer=1, n_embd=128, head_size=64, vocab=300, seed=1)\n"
        "info = detect({k: a.shape for k, a in t.items()})\n"
        "model = CpuModel(quantise_tensors(t, 1, 'int8', head=True), info, exact=False)\n"
        "assert not model.rounds_activations\n"
        "assert np.isfinite(model.forward([1, 2, 3])[0]).all()\n"
        "print('exact')\n")
    assert "exact" in printed


def test_the_vnni_kernels_compile_where_the_host_cannot_run_them(tmp_path):
    """On a host without VNNI the kernels are at least compiled for a CPU that has it (not
    run: the host would fault), so a change cannot leave them unbuildable unnoticed."""
    if vnni.available():
        pytest.skip("the host has AVX-512 VNNI: the other tests run these kernels")
    printed = run_compiled_for(tmp_path, "cascadelake", VNNI,
        "import numpy as np\n"
        "from numba import typeof\n"
        "from ai00_like.rwkv.cpu import int8, vnni\n"
        "assert vnni.available()\n"
        "w = vnni.RoundedInt8.of(int8.PackedInt8(np.zeros((8, 256), np.uint8), np.zeros((8, 4), np.uint16)))\n"
        "x, out = np.zeros((3, 256), np.float32), np.zeros((3, 8), np.float32)\n"
        "vnni._entry.compile(tuple(typeof(v) for v in (w, x, out)))\n"
        "print('compiled')\n")
    assert "compiled" in printed


def test_the_cpu_features_follow_numbas_setting(monkeypatch):
    from numba.core import config

    monkeypatch.setattr(config, "CPU_FEATURES", "+avx2,+fma,-avx512f,-avx512vnni")
    assert vector_dots.cpu_features() == {"avx2": True, "fma": True, "avx512f": False, "avx512vnni": False}
    assert vector_dots.vector_width() == 8


@needs_vnni
def test_the_demo_models_greedy_replies_do_not_change():
    """The issue's third bar: the trained demo model, Int8, answers the test prompts with
    the same tokens whether its products round the activations or not."""
    from ai00_like.rwkv import load_model
    from ai00_like.rwkv.accuracy import greedy
    from ai00_like.rwkv.tokenizer import load_tokenizer
    from test_demo_model import CHAT_QUESTIONS, HELD_OUT_PROMPTS, MODEL, VOCAB, chat_prompt

    tokenizer = load_tokenizer(VOCAB)
    exact, rounded = (load_model(MODEL, device="cpu", quant=99, quant_type="int8", exact=e) for e in (True, False))
    assert rounded.rounds_activations and not exact.rounds_activations
    for text in [*HELD_OUT_PROMPTS, *(chat_prompt(q) for q in CHAT_QUESTIONS)]:
        prompt = tokenizer.encode(text)
        assert greedy(rounded, prompt, 48)[1] == greedy(exact, prompt, 48)[1], text
