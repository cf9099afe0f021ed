"""Locally typical sampling, as Ai00 does it (ai00-reference §3.4), for a group of requests."""

from __future__ import annotations

import numpy as np

from .draw import sample_ranked
from .scratch import scratch


def typicality(logits: np.ndarray, row_max: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Scores (higher = more typical) and the log-normaliser of every row.

    Ai00 orders tokens by |-ln p - H| with H the entropy. Since -ln p = lse - l and
    H = lse - Σ p·l, that distance is |l - Σ p·l|: how far a token's logit is from the
    mean logit under p. Tokens with p = 0 in float32 (Ai00 drops them) score -inf.
    The scores live in a scratch buffer, valid until the next call.
    """
    shifted = scratch.array("typical_scores", logits.shape, np.float32)
    np.subtract(logits, row_max[:, None], out=shifted)
    weights = scratch.array("typical_weights", logits.shape, np.float32)
    np.exp(shifted, out=weights)
    norm = weights.sum(axis=1).astype(np.float64)
    # -inf logits have weight 0: clamp them so 0 * -inf does not make NaN (their score is
    # set to -inf below anyway).
    np.maximum(shifted, -1e4, out=shifted)
    mean_shifted = np.einsum("ij,ij->i", weights, shifted) / norm
    scores = shifted
    np.subtract(shifted, mean_shifted[:, None].astype(np.float32), out=scores)
    np.abs(scores, out=scores)
    np.negative(scores, out=scores)
    impossible = scratch.array("typical_impossible", logits.shape, np.bool_)
    np.equal(weights, 0, out=impossible)
    np.copyto(scores, -np.inf, where=impossible)
    return scores, row_max + np.log(norm)


def sample_typical(
    logits: np.ndarray,
    row_max: np.ndarray,
    top_k: np.ndarray,
    tau: np.ndarray,
    temperature: np.ndarray,
    uniform: np.ndarray,
) -> np.ndarray:
    """One token per row: order by typicality, keep the first `top_k` (0 = no limit), keep
    while the mass before a token is <= `tau` (the crossing token stays), raise to
    1/`temperature` (> 0), renormalise, draw."""
    return sample_ranked(logits, lambda rows, cut: typicality(rows, row_max[cut]), top_k, tau, temperature, uniform)
