"""Mirostat (v2-like), as Ai00 does it (ai00-reference §3.5), for a group of requests."""

from __future__ import annotations

import math

import numpy as np

from .draw import draw
from .scratch import scratch
from .topk import rows_to_padded

LN2 = math.log(2.0)


def sample_mirostat(
    logits: np.ndarray,
    log_norm: np.ndarray,
    max_surprise: np.ndarray,
    uniform: np.ndarray,
) -> tuple[np.ndarray, np.ndarray]:
    """One token per row, and the observed surprise (bits) that updates the request's state.

    In descending order of probability, keep tokens up to and including the first whose
    surprise -log2 p exceeds `max_surprise`: i.e. every token with p >= 2**-max_surprise
    plus the most likely of the others. Draw in proportion to p within that set (no sort
    needed for that). Observed surprise = log2(Σ kept p) - log2(p of the chosen token).
    """
    rows, width = logits.shape
    # -log2 p > s  <=>  l < lse - s·ln2
    cut = (log_norm - max_surprise * LN2).astype(np.float32)
    kept = scratch.array("mirostat_kept", logits.shape, np.bool_)
    np.greater_equal(logits, cut[:, None], out=kept)
    ids, vals = rows_to_padded(np.flatnonzero(kept), width, rows, logits)
    # The crossing token: the most likely token under the cut.
    under = scratch.array("mirostat_under", logits.shape, np.float32)
    np.copyto(under, logits)
    np.copyto(under, -np.inf, where=kept)
    crossing = np.argmax(under, axis=1)
    ids = np.concatenate([ids, crossing[:, None]], axis=1)
    vals = np.concatenate([vals, under[np.arange(rows), crossing][:, None]], axis=1)

    prob = np.exp(vals.astype(np.float64) - log_norm[:, None])
    picked = draw(prob, uniform)
    chosen = np.arange(rows), picked
    surprise = (np.log(prob.sum(axis=1)) - np.log(prob[chosen])) / LN2
    return ids[chosen], surprise
