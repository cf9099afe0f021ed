"""Building synthetic models for the engine tests."""

from __future__ import annotations

import numpy as np

from ai00_like.rwkv.cpu.model import CpuModel
from ai00_like.rwkv.info import detect
from ai00_like.rwkv.synthetic import make_checkpoint


def synthetic_model(version: str, max_batch: int = 1, **kwargs) -> CpuModel:
    tensors = make_checkpoint(version, **kwargs)
    return CpuModel(tensors, detect({k: a.shape for k, a in tensors.items()}), max_batch=max_batch)


def rel_err(got: np.ndarray, want: np.ndarray) -> float:
    """max |Δ| relative to the spread of the reference logits (rwkv-spec §5)."""
    return float(np.abs(np.asarray(got) - want).max() / np.asarray(want).std())


def greedy(model, prompt, steps):
    """Logits after the prompt and after each greedy step, and the greedy tokens."""
    logits, state = model.forward(prompt)
    rows, tokens = [logits], []
    for _ in range(steps):
        tokens.append(int(np.argmax(logits)))
        logits, state = model.forward([tokens[-1]], state)
        rows.append(logits)
    return np.stack(rows), tokens
