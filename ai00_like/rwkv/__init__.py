"""The RWKV engine: checkpoints, tokenizers, the numpy backend and the WebGPU backend.

    from ai00_like.rwkv import load_model
    model = load_model("model.st")               # .st / .safetensors / .pth, v4–v7
    logits, state = model.forward([1, 2, 3])     # like the reference `rwkv` package
    logits, state = model.forward([4], state)
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from .errors import ModelFileError
from .info import ModelInfo

if TYPE_CHECKING:  # numpy stays unimported until a model is loaded
    from .model import Model

__all__ = ["ModelFileError", "ModelInfo", "check_device", "load_model", "load_state"]

DEVICES = ("auto", "cpu", "gpu")  # or a GPU adapter index (gpu.device.list_adapters())


def load_model(
    path: str | Path,
    device: str | int = "auto",
    *,
    max_batch: int = 1,
    loras: Sequence[tuple[str | Path, float]] = (),
    state: str | Path | None = None,
    progress=None,
    precision: str = "auto",
    quant: int = 0,
    quant_type: str = "int8",
    quant_head: bool = False,
    warm_up: str = "now",
    exact: bool = True,
) -> Model:
    """Load a checkpoint (format and version detected from the file) onto a backend.

    `loras` are (file, alpha) pairs merged into the weights at load; `state` is a
    state-tuning file whose state becomes every slot's initial state. `device`: "cpu" is
    the numpy backend; "gpu" the best WebGPU adapter (a software one if nothing else); an
    int (or digits) that adapter of `gpu.device.list_adapters()`; "auto" a real GPU when
    there is one, else the numpy backend.
    `precision` is how the large matrices are kept: "auto" (the default) as the file stores
    them (a bf16 file stays bf16, an fp16 one fp16), or "fp32", "fp16", "bf16" (Ai00's
    "Fp16"/"Fp32" too). The numpy backend keeps 16-bit weights 16-bit and widens them as it
    reads them (activations and sums are fp32); the GPU backend has no bf16 and keeps bf16
    as fp16, saying so in the log. `quant` > 0 quantises the projections of the first
    `quant` layers as `quant_type` "int8" or "nf4" (rwkv-spec §6; Ai00's
    "Int8"/"NF4"/"None" too) on both backends, with the same weights: the numpy backend
    keeps Int8 packed where its rows are whole blocks and dequantises the rest and NF4.
    `quant_head` stores the head (the output matrix) as Int8 blocks too, on both backends:
    about half of a 16-bit head's bytes, read once per token.
    A saved quantised model loads back quantised as it was.
    `warm_up` ("now" or "background") is the numpy backend's (CpuModel): "background" serves
    on numpy and BLAS while the compiled kernels compile.
    `exact` (the default) keeps the numpy backend's activations fp32 in every product; with
    exact=False, on a CPU with AVX-512 VNNI, its Int8 products round them to 16-bit integers
    (cpu/vnni.py), about 1.5-2x as fast on a prompt's chunk.
    `progress(done, total)` follows the preparation of the layers (where fp16/bf16 weights
    are converted).
    """
    from .loader import read_checkpoint
    from .memory import check_fits
    from .quant import quant_options, quantise_tensors

    precision, quant, quant_type = quant_options(precision, quant, quant_type)
    adapter = _choose_adapter(device)
    # bf16 stays mapped here and is widened layer by layer in the model, with the rest.
    checkpoint = read_checkpoint(path, loras=loras, keep_bf16=True)
    initial = load_state(state, checkpoint.info) if state is not None else None
    tensors = quantise_tensors(checkpoint.tensors, quant, quant_type, head=quant_head) \
        if quant or quant_head else checkpoint.tensors
    if adapter is not None:
        from .gpu.model import GpuModel, check_gpu_shape

        try:
            check_gpu_shape(checkpoint.info)
        except ValueError:
            if device != "auto":
                raise
            adapter = None  # auto: what the kernels cannot run goes to the numpy backend
    if adapter is not None:
        return GpuModel(tensors, checkpoint.info, max_batch=max_batch, initial_state=initial,
                        progress=progress, adapter=adapter, precision=precision)
    from .cpu.model import CpuModel, kept_precision  # here: a GPU-only process never loads the CPU kernels

    precision = kept_precision(tensors, precision)
    check_fits(tensors, precision, path)  # before the first weight is converted or read
    return CpuModel(tensors, checkpoint.info, max_batch=max_batch, initial_state=initial, progress=progress,
                    precision=precision, source=str(path), warm_up=warm_up, exact=exact)


def check_device(device: str | int) -> None:
    """Raise ValueError unless `device` is a device name or an adapter index (not looked up)."""
    if not (isinstance(device, int) or str(device).isdigit() or device in DEVICES):
        raise ValueError(f"unknown device {device!r}; expected one of {DEVICES} or an adapter index")


def _choose_adapter(device: str | int) -> int | None:
    """The adapter index `device` asks for, or None for the numpy backend."""
    from .gpu import device as gpu

    if isinstance(device, str) and device.isdigit():
        device = int(device)
    if isinstance(device, int) and not isinstance(device, bool):
        adapters = gpu.list_adapters()
        if not 0 <= device < len(adapters):
            found = "; ".join(a.describe() for a in adapters) or "none (is wgpu installed?)"
            raise ValueError(f"no GPU adapter {device}; adapters: {found}")
        return device
    check_device(device)
    if device == "cpu":
        return None
    best = gpu.best_adapter(allow_software=device == "gpu")
    if best is None and device == "gpu":
        if not gpu.available():
            raise ValueError("device 'gpu' needs the wgpu package (pip install wgpu)")
        raise ValueError("device 'gpu': no WebGPU adapter with compute (Vulkan, Metal or D3D12) found")
    return best.index if best is not None else None


def load_state(path: str | Path, info: ModelInfo):
    """A state-tuning file as an initial `State` (its WKV part; shift rows start at zero)."""
    import numpy as np

    from .loader import read_state_file
    from .state import State

    state = State.zeros(info)
    layers = read_state_file(path, info)  # value-major [H, N, N] per layer
    # v5/v6 keep their WKV state key-major (as the reference package does), v7 value-major.
    state.wkv[:] = np.stack([layer.swapaxes(-1, -2) if info.version != "7" else layer for layer in layers])
    return state
