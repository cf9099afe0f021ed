"""The normalisations both backends use (rwkv-spec §2.1), in numpy, and their epsilons.

The GPU backend applies ln0 and ln_out with these on the host and its shaders use the same
epsilons; keeping them here, apart from the CPU backend, lets a GPU-only process run
without importing the CPU kernels' compiler.
"""

from __future__ import annotations

import numpy as np

LN_EPS = 1e-5
GN_EPS = 64e-5  # GroupNorm(x/8, 1e-5) as trained == GroupNorm(x, 64e-5)


def layer_norm(x: np.ndarray, weight: np.ndarray, bias: np.ndarray, eps: float = LN_EPS) -> np.ndarray:
    mean = x.mean(axis=-1, keepdims=True)
    centred = x - mean
    var = np.einsum("...i,...i->...", centred, centred)[..., None] / x.shape[-1]
    return centred * (1.0 / np.sqrt(var + eps)) * weight + bias


def group_norm(x: np.ndarray, n_head: int, weight: np.ndarray, bias: np.ndarray, eps: float = GN_EPS) -> np.ndarray:
    """Normalise each head's slice of the last axis on its own, then one affine over all."""
    shape = x.shape
    grouped = x.reshape(*shape[:-1], n_head, shape[-1] // n_head)
    mean = grouped.mean(axis=-1, keepdims=True)
    centred = grouped - mean
    var = (centred * centred).mean(axis=-1, keepdims=True)
    return (centred / np.sqrt(var + eps)).reshape(shape) * weight + bias
