"""Nucleus sampling, as Ai00 does it (ai00-reference §3.3), for a group of requests."""

from __future__ import annotations

import numpy as np

from .draw import sample_ranked


def sample_nucleus(
    logits: np.ndarray,
    log_norm: np.ndarray,
    top_k: np.ndarray,
    top_p: np.ndarray,
    temperature: np.ndarray,
    uniform: np.ndarray,
) -> np.ndarray:
    """One token per row of `logits` (float32 [rows, width], penalties, mask and bias
    already applied; -inf = impossible).

    Sort by probability, keep the first `top_k` (0 = no limit), keep tokens while the mass
    before them is <= `top_p` (the crossing token stays), raise the kept probabilities to
    1/`temperature` (> 0 here; greedy rows never come in), renormalise and draw with
    `uniform`.
    """
    return sample_ranked(logits, lambda rows, cut: (rows, log_norm[cut]), top_k, top_p, temperature, uniform)
