"""A v7 decoding step (one row, or a batch of rows each the next token of its own slot)
runs each layer as one compiled call (cpu/fused7.py): it must give what blocks.py's layers
give, on every file form, with 16-bit, fp32 and packed matrices alike, and from any slot of
the pool. (Against the reference package, test_file_forms.py
covers it too: its greedy runs decode one row at a time.)"""

from __future__ import annotations

import numpy as np
import pytest

from ai00_like.rwkv import load_model
from ai00_like.rwkv.accuracy import greedy, rel_err
from ai00_like.rwkv.batch import StepInput
from ai00_like.rwkv.cpu import fused7, panels
from ai00_like.rwkv.formats.pth import write_pth
from ai00_like.rwkv.formats.safetensors import write_safetensors
from ai00_like.rwkv.quant import quantise_tensors
from ai00_like.rwkv.synthetic import make_checkpoint

pytestmark = pytest.mark.skipif(fused7._layer is None, reason="the fused layer needs numba")

SHAPE = dict(n_layer=3, n_embd=128, head_size=32, vocab=1000, seed=7)
PROMPT = [5, 17, 300, 42, 999, 1, 64, 128]
# Written as files users have; "quantised" marks what load_model quantises (layers) at load.
FORMS = {
    "bf16.pth": (lambda t, p: write_pth(t, p, "bf16"), {}),
    "fp16.pth": (lambda t, p: write_pth(t, p, "fp16"), {}),
    "fp32.pth": (lambda t, p: write_pth(t, p, "fp32"), {}),
    "fp16.st": (lambda t, p: write_safetensors(t, p, layout="official", dtype="fp16"), {}),
    "web-rwkv.st": (lambda t, p: write_safetensors(t, p, layout="web-rwkv", dtype="fp16"), {}),
    "bf16.pth at fp32, layer 0 Int8": (lambda t, p: write_pth(t, p, "bf16"),
                                       dict(precision="fp32", quant=1, quant_type="int8")),
    "int8 prefab of layer 0": (lambda t, p: write_safetensors(quantise_tensors(t, 1, "int8"), p), {}),
    "nf4 prefab of layers 0-1": (lambda t, p: write_safetensors(quantise_tensors(t, 2, "nf4"), p), {}),
    "bf16.pth, Int8 at load": (lambda t, p: write_pth(t, p, "bf16"), dict(quant=99, quant_type="int8")),
    "bf16.pth, NF4 at load": (lambda t, p: write_pth(t, p, "bf16"), dict(quant=99, quant_type="nf4")),
}


def _model(tmp_path, form, max_batch=4):
    write, options = FORMS[form]
    path = tmp_path / ("model.st" if ".st" in form or "prefab" in form else "model.pth")
    write(make_checkpoint("7", **SHAPE), path)
    return load_model(str(path), max_batch=max_batch, **options)


@pytest.mark.parametrize("form", list(FORMS))
def test_one_row_steps_equal_the_layer_by_layer_ones(tmp_path, form):
    model = _model(tmp_path, form)
    assert model.fused is not None, "this form's single rows should take the fused path"
    fused_logits, fused_tokens = greedy(model, PROMPT, 12)
    model.fused = None
    logits, tokens = greedy(model, PROMPT, 12)
    assert fused_tokens == tokens
    assert rel_err(fused_logits, logits) < 1e-4


def test_packed_layers_are_fused_with_their_own_kernels(tmp_path):
    model = _model(tmp_path, "nf4 prefab of layers 0-1")
    forms = [type(w.channel_mix.Wv).__name__ for w in model.fused.weights]  # the channel mix's value matrix
    nf4 = "PanelNF4" if panels.available() else "PackedNF4"  # in panels on AVX-512, else in rows
    assert forms == [nf4, nf4, "ndarray"]


def test_a_single_row_in_any_slot_leaves_the_other_slots_alone(tmp_path):
    model = _model(tmp_path, "bf16.pth")
    for slot in range(4):
        model.step([StepInput(slot, PROMPT[: slot + 2])])
    before = [model.read_state(slot) for slot in range(4)]
    fused = model.step([StepInput(2, [77])])[0]
    after = [model.read_state(slot) for slot in range(4)]
    for slot in (0, 1, 3):
        assert all(np.array_equal(a, b) for a, b in zip(before[slot].parts(), after[slot].parts()))
    model.fused = None
    model.write_state(2, before[2])
    expected = model.step([StepInput(2, [77])])[0]
    assert rel_err(fused, expected) < 1e-4
    assert all(np.allclose(a, b, atol=1e-5) for a, b in zip(after[2].parts(), model.read_state(2).parts()))


@pytest.mark.parametrize("form", ["bf16.pth", "fp32.pth", "fp16.st", "bf16.pth, Int8 at load",
                                  "bf16.pth, NF4 at load", "nf4 prefab of layers 0-1"])
@pytest.mark.parametrize("rows", [2, 4, 5, 7])
def test_decoding_batches_equal_the_layer_by_layer_ones(tmp_path, form, rows):
    """Rows in slots out of order, packed layers through their direct kernels (below 5 rows)
    and the block kernel (from 5), a step after step."""
    model = _model(tmp_path, form, max_batch=8)
    slots = [7, 2, 5, 0, 3, 6, 1][:rows]
    for n, slot in enumerate(slots):
        model.step([StepInput(slot, PROMPT[n % 3 :])])
    states = {slot: model.read_state(slot) for slot in slots}

    def decode(steps=4):
        tokens = {slot: PROMPT[n] for n, slot in enumerate(slots)}
        logits = []
        for _ in range(steps):
            out = model.step([StepInput(slot, [tokens[slot]]) for slot in slots])
            tokens = {slot: int(np.argmax(row)) for slot, row in zip(slots, out)}
            logits.append(np.stack(out))
        return np.stack(logits), [model.read_state(slot) for slot in slots]

    layers, calls = model.fused, []
    model.fused = lambda *args: calls.append(len(args[0])) or layers(*args)
    fused, fused_states = decode()
    assert calls == [rows] * 4  # every step took the fused layers, the prompts did not
    model.fused = None
    for slot, state in states.items():
        model.write_state(slot, state)
    layered, layered_states = decode()
    assert rel_err(fused, layered) < 1e-4
    assert (fused.argmax(axis=-1) == layered.argmax(axis=-1)).all()
    for a, b in zip(fused_states, layered_states):
        assert all(np.allclose(x, y, atol=1e-5) for x, y in zip(a.parts(), b.parts()))


def test_the_vectorisable_exp_follows_libm():
    """intrinsics.exp (the fused layers' sigmoids, tanh and decay): within 4e-7 of e^x over
    the floats whose e^x is a normal float32, saturating beyond, nan kept."""
    from ai00_like.rwkv.cpu.intrinsics import build

    tools = build()
    exp = tools.exp

    @tools.jit(parallel=False)
    def each(x, out):
        for i in range(x.shape[0]):
            out[i] = exp(x[i])

    x = np.concatenate([np.linspace(-87.3, 88.3, 1_000_001, dtype=np.float32),
                        np.random.default_rng(0).standard_normal(100_000).astype(np.float32) * 4])
    out = np.empty_like(x)
    each(x, out)
    want = np.exp(x.astype(np.float64))
    assert (np.abs(out - want) / want).max() < 4e-7
    far = np.array([-1e4, -100, 100, 1e4, -np.inf, np.inf, np.nan], dtype=np.float32)
    out = np.empty_like(far)
    each(far, out)
    assert (out[[0, 1, 4]] < 1.2e-38).all() and (out[[2, 3, 5]] > 2e38).all() and np.isnan(out[6])
