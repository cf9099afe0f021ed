"""Nucleus sampling, as Ai00 does it (ai00-reference §3.3), for a group of requests."""

from __future__ import annotations

import numpy as np

from .draw import draw, sample_whole, tempered_weights, truncate


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
    rows, width = logits.shape
    k_limit = np.where((top_k <= 0) | (top_k >= width), width, top_k)
    # top_p = 1 keeps everything: no mass limit at all (a float running sum could otherwise
    # creep past 1.0 a hair early and drop the tail).
    mass_limit = np.where(top_p >= 1.0, np.inf, top_p)
    tokens = np.empty(rows, dtype=np.int64)

    untruncated = (k_limit >= width) & np.isinf(mass_limit)
    if untruncated.any():
        tokens[untruncated] = sample_whole(logits[untruncated], temperature[untruncated], uniform[untruncated])
    cut = ~untruncated
    if cut.any():
        sub = logits if cut.all() else logits[cut]
        ids, logit_vals, keep = truncate(sub, sub, log_norm[cut], k_limit[cut], mass_limit[cut])
        picked = draw(tempered_weights(logit_vals, keep, temperature[cut]), uniform[cut])
        tokens[cut] = ids[np.arange(ids.shape[0]), picked]
    return tokens
