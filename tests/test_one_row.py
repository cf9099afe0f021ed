"""A v7 step of one row runs each layer as one compiled call (cpu/fused7.py): it must give
what blocks.py's layers give, on every file form, with 16-bit, fp32 and packed matrices
alike, and from any slot of the pool. (Against the reference package, test_file_forms.py
covers it too: its greedy runs decode one row at a time.)"""

from __future__ import annotations

import numpy as np
import pytest

from ai00_like.rwkv import load_model
from ai00_like.rwkv.accuracy import greedy, rel_err
from ai00_like.rwkv.batch import StepInput
from ai00_like.rwkv.cpu import fused7
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


def _model(tmp_path, form):
    write, options = FORMS[form]
    path = tmp_path / ("model.st" if ".st" in form or "prefab" in form else "model.pth")
    write(make_checkpoint("7", **SHAPE), path)
    return load_model(str(path), max_batch=4, **options)


@pytest.mark.parametrize("form", list(FORMS))
def test_one_row_steps_equal_the_layer_by_layer_ones(tmp_path, form):
    model = _model(tmp_path, form)
    assert model.one_row is not None, "this form's single rows should take the fused path"
    fused_logits, fused_tokens = greedy(model, PROMPT, 12)
    model.one_row = None
    logits, tokens = greedy(model, PROMPT, 12)
    assert fused_tokens == tokens
    assert rel_err(fused_logits, logits) < 1e-4


def test_packed_layers_are_fused_with_their_own_kernels(tmp_path):
    model = _model(tmp_path, "nf4 prefab of layers 0-1")
    forms = [type(w[-1]).__name__ for w in model.one_row.weights]  # the channel mix's value matrix
    assert forms == ["tuple", "tuple", "ndarray"]


def test_a_single_row_in_any_slot_leaves_the_other_slots_alone(tmp_path):
    model = _model(tmp_path, "bf16.pth")
    for slot in range(4):
        model.step([StepInput(slot, PROMPT[: slot + 2])])
    before = [model.read_state(slot) for slot in range(4)]
    fused = model.step([StepInput(2, [77])])[0]
    after = [model.read_state(slot) for slot in range(4)]
    for slot in (0, 1, 3):
        assert all(np.array_equal(a, b) for a, b in zip(before[slot].parts(), after[slot].parts()))
    model.one_row = None
    model.write_state(2, before[2])
    expected = model.step([StepInput(2, [77])])[0]
    assert rel_err(fused, expected) < 1e-4
    assert all(np.allclose(a, b, atol=1e-5) for a, b in zip(after[2].parts(), model.read_state(2).parts()))
