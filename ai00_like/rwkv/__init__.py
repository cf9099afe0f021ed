"""The RWKV engine: checkpoints, tokenizers and the numpy backend.

    from ai00_like.rwkv import load_model
    model = load_model("model.st")               # .st / .safetensors / .pth, v4–v7
    logits, state = model.forward([1, 2, 3])     # like the reference `rwkv` package
    logits, state = model.forward([4], state)
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from .errors import ModelFileError
from .info import ModelInfo

__all__ = ["load_model", "load_state", "ModelFileError", "ModelInfo"]

DEVICES = ("auto", "cpu")


def load_model(
    path: str | Path,
    device: str = "auto",
    *,
    max_batch: int = 1,
    loras: Sequence[tuple[str | Path, float]] = (),
    state: str | Path | None = None,
    progress=None,
):
    """Load a checkpoint (format and version detected from the file) onto a backend.

    `loras` are (file, alpha) pairs merged into the weights at load; `state` is a
    state-tuning file whose state becomes every slot's initial state. `device` "auto"
    picks the numpy backend until the GPU backend exists. `progress(done, total)` follows
    the preparation of the layers (where fp16/bf16 weights are converted).
    """
    from .cpu.model import CpuModel
    from .loader import read_checkpoint

    if device not in DEVICES:
        raise ValueError(f"unknown device {device!r}; expected one of {DEVICES}")
    # bf16 stays mapped here and is widened layer by layer in the model, with the rest.
    checkpoint = read_checkpoint(path, loras=loras, keep_bf16=True)
    initial = load_state(state, checkpoint.info) if state is not None else None
    return CpuModel(checkpoint.tensors, checkpoint.info, max_batch=max_batch, initial_state=initial,
                    progress=progress)


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
