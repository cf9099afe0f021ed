"""The WebGPU backend against the numpy backend (issue 6), on small synthetic models.

Runs on any Vulkan/Metal/D3D12 adapter, including Mesa's software lavapipe
(`apt-get install mesa-vulkan-drivers`); skipped when wgpu or such an adapter is missing.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from engine_helpers import greedy, rel_err

from ai00_like.rwkv.batch import StepInput
from ai00_like.rwkv.info import detect
from ai00_like.rwkv.synthetic import make_checkpoint

pytest.importorskip("wgpu", reason="the GPU backend needs the wgpu package", exc_type=ImportError)
from ai00_like.rwkv.gpu.device import best_adapter, list_adapters

ADAPTER = best_adapter(allow_software=True)
pytestmark = pytest.mark.skipif(ADAPTER is None, reason="no WebGPU adapter with compute (apt-get install mesa-vulkan-drivers)")

TOLERANCE = 1e-4  # max |Δlogits| / std(logits), fp32 on both sides
SHAPE = {"n_layer": 2, "n_embd": 64, "head_size": 32, "vocab": 1000}  # lavapipe runs ≈ 1 GFLOP/s: keep it small


def tokens(seed, n, vocab=SHAPE["vocab"]):
    return np.random.default_rng(seed).integers(0, vocab, n).tolist()


VERSIONS = ["4", "5.0", "5.1", "5.2", "6", "7"]


def pair(seed, max_batch=1, version="7"):
    """(numpy model, GPU model) of one synthetic checkpoint."""
    from ai00_like.rwkv.cpu.model import CpuModel
    from ai00_like.rwkv.gpu.model import GpuModel

    shape = {k: v for k, v in SHAPE.items() if not (version == "4" and k == "head_size")}
    tensors = make_checkpoint(version, seed=seed, **shape)
    info = detect({k: a.shape for k, a in tensors.items()})
    return (CpuModel(tensors, info, max_batch=max_batch),
            GpuModel(tensors, info, max_batch=max_batch, adapter=ADAPTER.index))


@pytest.fixture(scope="module")
def models():
    return pair(seed=7, max_batch=4)


def test_adapters_are_listed_with_their_kind():
    adapters = list_adapters()
    assert ADAPTER in adapters
    for a in adapters:
        assert a.name and a.backend
        if "llvmpipe" in a.name.lower():
            assert a.software


@pytest.mark.parametrize("version", VERSIONS)
@pytest.mark.parametrize("seed", [1, 2])
def test_prompt_and_greedy_steps_match_numpy(version, seed):
    cpu, gpu = pair(seed, version=version)
    assert gpu.info.version == version
    prompt = tokens(seed, 24)  # > 16 rows: the tiled matrix kernel; the decode steps: matrix–vector
    want, want_ids = greedy(cpu, prompt, 8)
    got, got_ids = greedy(gpu, prompt, 8)
    errors = [rel_err(g, w) for g, w in zip(got, want)]
    assert max(errors) < TOLERANCE, f"worst step {int(np.argmax(errors))}: {max(errors):.2e}"
    assert got_ids == want_ids


def test_every_tokens_logits_and_the_state_match_numpy(models):
    cpu, gpu = models
    prompt = tokens(3, 19)
    want, want_state = cpu.forward(prompt, full_output=True)
    got, got_state = gpu.forward(prompt, full_output=True)
    assert got.shape == want.shape == (19, SHAPE["vocab"])
    assert max(rel_err(g, w) for g, w in zip(got, want)) < TOLERANCE
    for name in ("att_shift", "wkv", "ffn_shift"):
        np.testing.assert_allclose(getattr(got_state, name), getattr(want_state, name), rtol=1e-4, atol=1e-5)


def test_forward_continues_from_a_given_state_and_leaves_it_alone(models):
    cpu, gpu = models
    _, state = cpu.forward(tokens(4, 10))
    before = state.copy()
    want, _ = cpu.forward(tokens(5, 3), state)
    got, _ = gpu.forward(tokens(5, 3), state)
    assert rel_err(got, want) < TOLERANCE
    np.testing.assert_array_equal(state.wkv, before.wkv)


def test_batched_step_of_mixed_slots_matches_single_runs(models):
    _, gpu = models
    for slot in range(4):
        gpu.reset(slot)
    history = {0: tokens(10, 9), 2: tokens(11, 1), 3: tokens(12, 5)}
    # slot 2 decodes after a prefill of its own; slot 3's prompt arrives in two chunks
    gpu.step([StepInput(2, tokens(13, 6), "none")])
    history[2] = tokens(13, 6) + history[2]
    gpu.step([StepInput(3, history[3][:2], "none")])
    out = gpu.step([
        StepInput(0, history[0], "all"),
        StepInput(1, [], "last"),
        StepInput(2, history[2][-1:], "last"),
        StepInput(3, history[3][2:], "last"),
    ])
    assert out[1] is None
    alone = {slot: gpu.forward(toks, full_output=slot == 0)[0] for slot, toks in history.items()}
    assert out[0].shape == (9, SHAPE["vocab"])
    for slot in (0, 2, 3):
        assert rel_err(out[slot], alone[slot]) < TOLERANCE, slot
    # the step updated each slot's state as a run of its own would
    _, state3 = gpu.forward(history[3])
    np.testing.assert_allclose(gpu.read_state(3).wkv, state3.wkv, rtol=1e-4, atol=1e-5)


def test_decoding_steps_encoded_ahead_match_numpy(models):
    """A decoding step's command buffer is encoded during the step before; steps of another
    shape in between, and a rolled-back state, run what they must."""
    cpu, gpu = models
    for model in (cpu, gpu):
        for slot in range(4):
            model.reset(slot)
    shapes = [[0], [0], [0, 1], [0], [1], [0, 1, 2], [0, 1, 2]]  # slots stepping, one token each
    for n, slots in enumerate(shapes):
        if n == 4:  # a rollback between two steps of one shape, as a failed draft does
            for model in (cpu, gpu):
                model.write_state(1, model.initial_state())
        inputs = [StepInput(slot, tokens(30 + n, 1), "last") for slot in slots]
        for want, got in zip(cpu.step(inputs), gpu.step(inputs)):
            assert rel_err(got, want) < TOLERANCE, (n, slots)
    assert gpu.ahead.program is not None  # the last step prepared the next


def test_state_save_restore_and_reset(models):
    cpu, gpu = models
    prompt, more = tokens(20, 12), tokens(21, 4)
    gpu.reset(0)
    gpu.step([StepInput(0, prompt, "none")])
    saved = gpu.read_state(0)
    _, cpu_state = cpu.forward(prompt)
    np.testing.assert_allclose(saved.wkv, cpu_state.wkv, rtol=1e-4, atol=1e-5)
    (first,) = gpu.step([StepInput(0, more, "last")])
    gpu.write_state(1, saved)  # restored into another slot: continues identically
    (again,) = gpu.step([StepInput(1, more, "last")])
    np.testing.assert_allclose(again, first, rtol=1e-5, atol=1e-5)
    gpu.reset(1)
    (fresh,) = gpu.step([StepInput(1, more, "last")])
    assert rel_err(fresh, gpu.forward(more)[0]) < 1e-5
    assert rel_err(fresh, first) > 1e-2


def test_bad_step_inputs_are_refused(models):
    _, gpu = models
    with pytest.raises(ValueError, match="slot"):
        gpu.step([StepInput(4, [1], "last")])  # the scratch slot of `forward` is not a pool slot
    with pytest.raises(ValueError, match="token ids"):
        gpu.step([StepInput(0, [SHAPE["vocab"]], "last")])
    with pytest.raises(ValueError, match="slot"):
        gpu.read_state(-1)


def test_load_model_picks_the_device(tmp_path):
    from safetensors.numpy import save_file

    from ai00_like.rwkv import load_model
    from ai00_like.rwkv.cpu.model import CpuModel
    from ai00_like.rwkv.gpu.model import GpuModel
    from ai00_like.rwkv.model import Model

    path = tmp_path / "tiny.st"
    save_file(make_checkpoint("7", seed=5, **SHAPE), path)
    assert isinstance(load_model(path, device="cpu"), CpuModel)
    on_gpu = load_model(path, device="gpu", precision="fp32")
    assert isinstance(on_gpu, GpuModel)
    assert isinstance(load_model(path, device=str(ADAPTER.index)), GpuModel)
    auto = load_model(path, device="auto", precision="fp32")  # a software adapter is never picked by "auto"
    assert isinstance(auto, CpuModel if best_adapter(allow_software=False) is None else GpuModel)
    assert isinstance(on_gpu, Model) and isinstance(auto, Model)  # the seam the engine uses
    assert rel_err(on_gpu.forward([1, 2, 3])[0], auto.forward([1, 2, 3])[0]) < TOLERANCE
    with pytest.raises(ValueError, match="no GPU adapter 99"):
        load_model(path, device=99)
    with pytest.raises(ValueError, match="unknown device"):
        load_model(path, device="tpu")


@pytest.mark.parametrize("version", ["4", "5.2", "6"])
def test_mixed_step_and_states_match_numpy_for_every_version(version):
    cpu, gpu = pair(9, max_batch=2, version=version)
    prompt, other = tokens(30, 11), tokens(31, 3)
    want = [cpu.step([StepInput(0, prompt, "all"), StepInput(1, other, "last")]),
            cpu.step([StepInput(0, [7], "last"), StepInput(1, [8], "last")])]
    got = [gpu.step([StepInput(0, prompt, "all"), StepInput(1, other, "last")]),
           gpu.step([StepInput(0, [7], "last"), StepInput(1, [8], "last")])]
    for g_step, w_step in zip(got, want):
        for g, w in zip(g_step, w_step):
            assert rel_err(g, w) < TOLERANCE
    for slot in (0, 1):
        g, w = gpu.read_state(slot), cpu.read_state(slot)
        for name in ("att_shift", "wkv", "ffn_shift"):
            np.testing.assert_allclose(getattr(g, name), getattr(w, name), rtol=1e-4, atol=1e-5)


# Lower precisions against fp32 on the GPU, the table in docs/models.md: worst relative logit error
# (max |Δ| / std) over 64 greedy steps, and the share of steps with fp32's greedy token
# (both fed the same tokens). fp16 on a synthetic fp32 model (the demo model is stored in
# fp16, so fp16 would be exact there); Int8 and NF4 of every layer on the trained demo model.
# The bounds are ~2× what was measured, agreement a step or two below it.
LOWER_PRECISION = {  # mode → (model, load options, max error, min agreement); measured error, agreement
    "fp16": ("synthetic", {"precision": "fp16"}, 1e-2, 0.95),  # ≤ 3e-3, 1.0
    "int8": ("demo", {"quant": 99, "quant_type": "int8"}, 0.05, 0.95),  # 0.018, 1.0
    "nf4": ("demo", {"quant": 99, "quant_type": "nf4"}, 0.5, 0.9),  # 0.26, 0.97
}
DEMO = Path(__file__).resolve().parents[2] / "assets" / "models" / "demo.st"


@pytest.fixture(scope="module")
def fp32_runs(tmp_path_factory):
    """Per model: its file, a prompt, fp32's logits and greedy tokens over 64 steps."""
    from safetensors.numpy import save_file

    from ai00_like.rwkv import load_model

    synthetic = tmp_path_factory.mktemp("fp32") / "v7.st"
    save_file(make_checkpoint("7", seed=4, n_layer=3, n_embd=128, head_size=64, vocab=1000), synthetic)
    runs = {}
    for name, path in (("synthetic", synthetic), ("demo", DEMO)):
        prompt = tokens(40, 24, vocab=1000)
        runs[name] = (path, prompt, *greedy(load_model(path, device="gpu", precision="fp32"), prompt, 64))
    return runs


@pytest.mark.parametrize("mode", sorted(LOWER_PRECISION))
def test_lower_precisions_stay_close_to_fp32(mode, fp32_runs):
    from ai00_like.rwkv import load_model
    from ai00_like.rwkv.accuracy import against_reference

    name, options, max_error, min_agreement = LOWER_PRECISION[mode]
    path, prompt, want, want_ids = fp32_runs[name]
    model = load_model(path, device="gpu", **{"precision": "fp32", **options})
    error, agreement = against_reference(model, prompt, want, want_ids)
    assert error < max_error
    assert agreement >= min_agreement


def test_unknown_precision_is_refused():
    from ai00_like.rwkv.gpu.model import GpuModel

    cpu, _ = pair(1)
    with pytest.raises(ValueError, match="precision"):
        GpuModel(cpu.tensors, cpu.info, adapter=ADAPTER.index, precision="int3")


def test_the_demo_model_runs_as_on_numpy():
    from ai00_like.rwkv import load_model

    cpu, gpu = load_model(DEMO, device="cpu"), load_model(DEMO, device="gpu", precision="fp32")
    prompt = list(range(100, 140))
    want, want_ids = greedy(cpu, prompt, 16)
    got, got_ids = greedy(gpu, prompt, 16)
    assert max(rel_err(g, w) for g, w in zip(got, want)) < TOLERANCE
    assert got_ids == want_ids


@pytest.mark.parametrize("quant_type", ["int8", "nf4"])
@pytest.mark.parametrize("version", ["6", "7"])
def test_quantised_kernels_compute_with_the_dequantised_weights(version, quant_type):
    """The GPU's on-the-fly dequantisation equals numpy's, so a numpy model given the
    dequantised matrices must produce the same logits (the quantisation error itself is in
    docs/models.md's table, not a unit test's business)."""
    from ai00_like.rwkv.cpu.model import CpuModel
    from ai00_like.rwkv.gpu.model import GpuModel
    from ai00_like.rwkv.quant import dequantise, quantise

    cpu, _ = pair(6, version=version)
    gpu = GpuModel(cpu.tensors, cpu.info, adapter=ADAPTER.index, quant=1, quant_type=quant_type)
    tensors = dict(cpu.tensors)
    for name, weights in cpu.tensors.items():
        block = name.split(".")
        if block[:2] == ["blocks", "0"] and block[2] in ("att", "ffn") and block[-1] == "weight" and weights.ndim == 2:
            restored = dequantise(quant_type, *quantise(quant_type, weights), weights.size)
            tensors[name] = restored.reshape(weights.shape).astype(np.float32)
    assert sum(not np.array_equal(tensors[n], cpu.tensors[n]) for n in tensors) >= 6  # layer 0's projections
    reference = CpuModel(tensors, cpu.info)
    prompt = tokens(50, 12)
    want, want_ids = greedy(reference, prompt, 8)
    got, got_ids = greedy(gpu, prompt, 8)
    assert max(rel_err(g, w) for g, w in zip(got, want)) < TOLERANCE
    assert got_ids == want_ids
    assert gpu.weight_bytes < GpuModel(cpu.tensors, cpu.info, adapter=ADAPTER.index).weight_bytes


def test_long_prompts_run_in_chunks_with_the_same_result(models, monkeypatch):
    import ai00_like.rwkv.gpu.model as gpu_model

    cpu, gpu = models
    prompt = tokens(60, 23)
    whole, whole_state = gpu.forward(prompt, full_output=True)
    monkeypatch.setattr(gpu_model, "FORWARD_CHUNK", 5)
    chunked, chunked_state = gpu.forward(prompt, full_output=True)
    assert chunked.shape == whole.shape
    assert max(rel_err(c, w) for c, w in zip(chunked, whole)) < TOLERANCE
    np.testing.assert_allclose(chunked_state.wkv, whole_state.wkv, rtol=1e-4, atol=1e-5)
    hidden, _ = gpu.forward_hidden(prompt)
    want_hidden, _ = cpu.forward_hidden(prompt)
    np.testing.assert_allclose(hidden, want_hidden, rtol=1e-3, atol=1e-4)


TILED = {"software": True, "hardware": False}  # matmul_tiled's row heights: up to 4, or 1
BLOCKED = {"16x4": (16, 4), "8x8": (8, 8)}  # matmul_blocked's WG_Y × RT


@pytest.mark.parametrize("kernel", [*TILED, *BLOCKED])
def test_every_prefill_kernel_matches_numpy(models, kernel, monkeypatch):
    """A prefill runs the blocked kernel (any adapter; in every shape that the benches compare)
    where K allows, else the tiled one (one row per thread on a GPU, up to four on a software
    adapter): each gives numpy's logits."""
    from ai00_like.rwkv.gpu import recorder

    cpu, gpu = models
    if kernel in TILED:
        chosen = recorder.prefill_kernel
        monkeypatch.setattr(recorder, "prefill_kernel", lambda rows, *_: chosen(rows, 1, TILED[kernel], 0))
    else:
        monkeypatch.setattr(recorder, "BLOCK_SHAPE", dict(zip(("WG_Y", "RT"), BLOCKED[kernel])))
    gpu.programs.clear()  # recorded with the default kernel
    try:
        prompt = tokens(61, 70)  # 70 rows: TM 4 on a software adapter, two blocks of rows
        got, state = gpu.forward(prompt, full_output=True)
        want, want_state = cpu.forward(prompt, full_output=True)
        assert max(rel_err(g, w) for g, w in zip(got, want)) < TOLERANCE
        np.testing.assert_allclose(state.wkv, want_state.wkv, rtol=1e-4, atol=1e-5)
    finally:
        gpu.programs.clear()


def test_a_device_with_little_workgroup_memory_prefills_with_the_tiled_kernel():
    from ai00_like.rwkv.gpu.recorder import BLOCK_SHAPE, blocked_workgroup_bytes, prefill_kernel

    needed = blocked_workgroup_bytes(BLOCK_SHAPE)
    assert needed > 16384  # the default shape with NF4's table: more than WebGPU promises
    assert prefill_kernel(256, 2048, False, needed).entry == "matmul_blocked"
    assert prefill_kernel(256, 2048, False, 16384).entry == "matmul_tiled"
    assert prefill_kernel(256, 2044, False, needed).entry == "matmul_tiled"  # K not a multiple of 8


@pytest.mark.parametrize("fmt", ["fp32", "fp16", "int8", "nf4"])
def test_blocked_kernel_on_partial_blocks_of_every_format(models, fmt):
    """Rows, outputs and K that fill no block (K a multiple of 8, not of the 32 staged), x at an
    offset and stride, an activation and the residual added: as numpy computes them."""
    from ai00_like.rwkv.gpu.buffers import STORAGE, Uploader
    from ai00_like.rwkv.gpu.recorder import WEIGHT_ACCESS, prefill_kernel
    from ai00_like.rwkv.quant import QuantisedMatrix, dequantise, quantise

    _, gpu = models
    rows, m, k, x_off, stride = 70, 100, 40, 3, 45
    rng = np.random.default_rng(5)
    weights = rng.standard_normal((m, k)).astype(np.float32) * 0.1
    weights[np.abs(weights) < 1e-3] = 1e-3  # no f16 subnormals: NVIDIA's driver flushes them to zero
    if fmt in ("int8", "nf4"):
        matrix = Uploader(gpu.gpu).matrix(QuantisedMatrix.of(fmt, weights))
        weights = dequantise(fmt, *quantise(fmt, weights), weights.size).reshape(m, k)
    else:
        matrix = Uploader(gpu.gpu, fmt).matrix(weights)
        weights = weights.astype(np.float16).astype(np.float32) if fmt == "fp16" else weights
    x = rng.standard_normal(x_off + rows * stride).astype(np.float32)
    residual = rng.standard_normal((rows, m)).astype(np.float32)
    device = gpu.gpu.device
    x_buffer = device.create_buffer_with_data(data=x, usage=STORAGE)
    y = device.create_buffer_with_data(data=residual, usage=STORAGE)
    kernel = prefill_kernel(rows, k, False, gpu.gpu.limits["max-compute-workgroup-storage-size"])
    assert kernel.entry == "matmul_blocked"
    groups = (-(-m // kernel.block_outputs), -(-rows // kernel.block_rows))
    dispatch = gpu.kernels.dispatch(kernel.shader, kernel.entry, (rows, m, k, x_off, stride, 0, 0, m, 1, 1),
                                    [x_buffer, matrix.parts[0].buffer, y, matrix.parts[0].scales], groups,
                                    prelude=WEIGHT_ACCESS[fmt], constants=kernel.constants)
    gpu.kernels.run([dispatch])
    got = np.frombuffer(device.queue.read_buffer(y), dtype=np.float32).reshape(rows, m)
    xs = np.stack([x[x_off + r * stride : x_off + r * stride + k] for r in range(rows)])
    want = np.tanh(xs.astype(np.float64) @ weights.T.astype(np.float64)) + residual  # act 1: tanh
    np.testing.assert_allclose(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("precision, quant", [("fp32", 0), ("fp16", 0), ("fp16", 2)])
def test_matrices_larger_than_a_binding_are_split_by_rows(precision, quant, monkeypatch):
    from ai00_like.rwkv.gpu.model import GpuModel

    cpu, _ = pair(8, version="6")
    whole = GpuModel(cpu.tensors, cpu.info, adapter=ADAPTER.index, precision=precision, quant=quant)
    monkeypatch.setattr(GpuModel, "max_binding", 20_000)  # the head (1000 × 64) in 5+ parts
    split = GpuModel(cpu.tensors, cpu.info, adapter=ADAPTER.index, precision=precision, quant=quant)
    assert len(split.head.parts) >= 4 and len(whole.head.parts) == 1
    prompt = tokens(70, 20)  # the tiled kernel, then the matrix–vector one
    want, want_ids = greedy(whole, prompt, 4)
    got, got_ids = greedy(split, prompt, 4)
    assert max(rel_err(g, w) for g, w in zip(got, want)) < TOLERANCE
    assert got_ids == want_ids


@pytest.mark.parametrize("quant_type", ["", "int8", "nf4"])
def test_matrix_vector_reductions_agree(quant_type):
    """The subgroup kernels (where the adapter has subgroups) and the workgroup-reduction ones,
    for one row and for a decoding batch, in every weight format."""
    from ai00_like.rwkv.gpu.model import GpuModel

    cpu, _ = pair(11, max_batch=5, version="7")
    options = {"quant": 99, "quant_type": quant_type} if quant_type else {}
    with_subgroups = GpuModel(cpu.tensors, cpu.info, max_batch=5, adapter=ADAPTER.index, **options)
    without = GpuModel(cpu.tensors, cpu.info, max_batch=5, adapter=ADAPTER.index, **options)
    with_subgroups.use_subgroups = True  # on the instance: the kernels are chosen when a step is first recorded
    without.use_subgroups = False
    if quant_type:  # the same dequantised weights on numpy
        cpu = type(cpu)(with_subgroups.tensors, cpu.info, max_batch=5)
    prompt = tokens(80, 1)  # one row at a time: the single-row matrix–vector kernels
    want = greedy(cpu, prompt, 3)[0]
    batch = [StepInput(slot, tokens(90 + slot, 1), "last") for slot in range(5)]  # the small-batch kernels
    want_batch = cpu.step(batch)
    for model in (with_subgroups, without):
        assert max(rel_err(g, w) for g, w in zip(greedy(model, prompt, 3)[0], want)) < TOLERANCE
        for got, w in zip(model.step(batch), want_batch):
            assert rel_err(got, w) < TOLERANCE


@pytest.mark.skipif(ADAPTER is None or not ADAPTER.subgroups, reason="the adapter has no subgroups")
def test_subgroup_kernels_are_left_off_where_they_measured_slower(models, monkeypatch):
    import dataclasses

    _, gpu = models
    for vendor, used in ((0x10DE, False), (0x1002, True), (0, True)):  # NVIDIA, AMD, unknown (lavapipe)
        monkeypatch.setattr(gpu.gpu, "adapter", dataclasses.replace(gpu.gpu.adapter, vendor_id=vendor))
        assert gpu.subgroups_used is used
    monkeypatch.setattr(gpu, "use_subgroups", True)
    assert gpu.subgroups_used


def test_heads_wider_than_the_kernels_are_refused(tmp_path):
    from safetensors.numpy import save_file

    from ai00_like.rwkv import load_model

    path = tmp_path / "wide.st"
    save_file(make_checkpoint("7", seed=2, n_layer=1, n_embd=256, head_size=128, vocab=100), path)
    with pytest.raises(ValueError, match="heads of up to 64 channels; this model's are 128: use device='cpu'"):
        load_model(path, device="gpu")
    assert load_model(path, device="cpu").forward([1, 2])[0].shape == (100,)


@pytest.mark.parametrize("entry", ["matvec8", "matvec", "matvec8_rows", "matmul_tiled"])
def test_fp16_weights_widen_exactly(models, entry):
    """Every kind of f16 (zeros, subnormals, the largest, negatives) comes out as numpy widens it."""
    from ai00_like.rwkv.gpu.buffers import STORAGE, Uploader
    from ai00_like.rwkv.gpu.recorder import matmul_tile

    _, gpu = models
    halves = np.array([0.0, -0.0, 6e-8, -3e-6, 6.1e-5, 65504.0, -2.5, 1 / 3], dtype=np.float16)
    weights = np.resize(halves, (16, 8)).astype(np.float32)
    weights[8:] *= -1
    device = gpu.gpu.device
    stored = Uploader(gpu.gpu, "fp16").matrix(weights)  # the model is fp32: store this matrix as fp16
    assert stored.format == "fp16"
    rows = 8
    x = device.create_buffer_with_data(data=np.eye(rows, 8, dtype=np.float32), usage=STORAGE)
    y = device.create_buffer(size=4 * rows * 16, usage=STORAGE)
    tile = matmul_tile(rows)
    groups = {"matmul_tiled": (1, 1), "matvec8_rows": (4, 1)}.get(entry, (4, rows))
    dispatch = gpu.kernels.dispatch("matmul.wgsl", entry, (rows, 16, 8, 0, 8, 0, 0, 16, 0, 0),
                                    [x, stored.parts[0].buffer, y], groups, prelude="weights_f16.wgsl", constants=tile)
    gpu.kernels.run([dispatch])
    got = np.frombuffer(device.queue.read_buffer(y), dtype=np.float32).reshape(rows, 16)
    want = weights.T[:rows]
    # WGSL lets an implementation flush subnormals to zero (NVIDIA's Vulkan driver does, for
    # 6e-8 and 6.1e-5 here); every normal value must come out exactly.
    subnormal = np.abs(want) < np.finfo(np.float16).tiny
    np.testing.assert_array_equal(got[~subnormal], want[~subnormal])
    assert np.all((got[subnormal] == want[subnormal]) | (got[subnormal] == 0))


@pytest.mark.skipif(ADAPTER is None or not ADAPTER.subgroups, reason="the adapter has no subgroups")
@pytest.mark.parametrize("entry", ["matvec8_subgroup", "matvec8_rows_subgroup"])
@pytest.mark.parametrize("x_off", [0, 4, 1])  # 1: x not vec4-aligned, read as scalars (X4 = 0)
def test_subgroup_matrix_vector_kernels(models, entry, x_off):
    """Rows past the last workgroup's share, K with a partial last stride of lanes, x at an
    offset and a stride other than K: every output as numpy computes it."""
    from ai00_like.rwkv.gpu.buffers import STORAGE, Uploader
    from ai00_like.rwkv.gpu.recorder import matmul_tile, matvec_group_rows

    _, gpu = models
    rng = np.random.default_rng(5)
    M, K, rows, stride = 37, 8 * 21, 3 if entry == "matvec8_rows_subgroup" else 1, 8 * 21 + 4
    weights = rng.standard_normal((M, K)).astype(np.float32)
    xs = rng.standard_normal(x_off + rows * stride).astype(np.float32)
    device = gpu.gpu.device
    stored = Uploader(gpu.gpu).matrix(weights)
    x = device.create_buffer_with_data(data=xs, usage=STORAGE)
    y = device.create_buffer(size=4 * rows * M, usage=STORAGE)
    group_rows = matvec_group_rows(entry, gpu.gpu.subgroup_width)
    constants = (*matmul_tile(rows), ("GROUP_ROWS", group_rows), ("X4", int(x_off % 4 == 0)))
    groups = (-(-M // group_rows), 1)
    dispatch = gpu.kernels.dispatch(("matmul.wgsl", "matvec_subgroup.wgsl"), entry,
                                    (rows, M, K, x_off, stride, 0, 0, M, 0, 0),
                                    [x, stored.parts[0].buffer, y, None, x], groups, prelude="weights_f32.wgsl",
                                    constants=constants)
    gpu.kernels.run([dispatch])
    got = np.frombuffer(device.queue.read_buffer(y), dtype=np.float32).reshape(rows, M)
    want = np.stack([weights @ xs[x_off + r * stride: x_off + r * stride + K] for r in range(rows)])
    np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("quant_type,head", [("int8", False), ("nf4", False), ("nf4", True)])
def test_a_prefab_gives_the_same_logits_on_both_backends(quant_type, head, tmp_path):
    """The same packed blocks, read by the CPU's kernels (kept packed, fused at batch 1) and by
    the GPU's shaders: the same logits to within fp32 rounding; with the head in Int8 blocks
    too (quant_head)."""
    from ai00_like.rwkv import load_model
    from ai00_like.rwkv.formats.safetensors import write_safetensors
    from ai00_like.rwkv.quant import quantise_tensors

    path = tmp_path / "prefab.st"
    tensors = make_checkpoint("7", n_layer=2, n_embd=128, head_size=32, vocab=1000, seed=9)
    write_safetensors(quantise_tensors(tensors, 2, quant_type, head=head), path, dtype="fp32")
    cpu = load_model(str(path), device="cpu", precision="fp32")
    gpu = load_model(str(path), device="gpu", precision="fp32")
    int8_kinds = ("PackedInt8", "PanelInt8")  # in rows, or in panels (AVX-512)
    assert type(cpu.blocks[0].channel_mix.W["key"]).__name__ in (int8_kinds if quant_type == "int8" else ("PackedNF4", "PanelNF4"))
    assert (type(cpu.head).__name__ in int8_kinds) == head
    assert (gpu.head.format == "int8") == head
    prompt = tokens(51, 12, vocab=1000)
    want, want_ids = greedy(cpu, prompt, 8)
    got, got_ids = greedy(gpu, prompt, 8)
    assert max(rel_err(g, w) for g, w in zip(got, want)) < TOLERANCE
    assert got_ids == want_ids
