"""Shared steps of the samplers: the truncation walk, temperature, and the final draw.

Everything here works on [rows, columns] arrays so one call serves a whole group of
requests. Probabilities are taken relative to the full-vocabulary softmax (`log_norm` is
its log-normaliser), exactly as Ai00 compares running sums against top_p / tau.
"""

from __future__ import annotations

import numpy as np

from .scratch import scratch
from .topk import top_k_sorted

# With no top_k limit, the walk looks at this many best candidates first and widens by
# `_WIDEN` until the probability mass is reached. Typical top_p values end in round one.
_FIRST_ROUND = 512
_WIDEN = 8


def draw(weights: np.ndarray, uniform: np.ndarray) -> np.ndarray:
    """Per row, the column picked by inverse-CDF sampling with u ~ U[0, 1).

    Returns the first column whose running weight is > u·total. Columns with weight 0 can
    never be picked (the running sum does not move there), and u < 1 keeps the pick inside
    the row. Weights need not be normalised; every row needs one positive weight.
    """
    cumulative = np.cumsum(weights, axis=1)
    target = uniform * cumulative[:, -1]
    picked = np.count_nonzero(cumulative <= target[:, None], axis=1)
    return np.minimum(picked, weights.shape[1] - 1)


def tempered_weights(logit_vals: np.ndarray, keep: np.ndarray, temperature: np.ndarray) -> np.ndarray:
    """p ** (1 / T) over the kept candidates, up to a constant, without underflow to NaN.

    p_i / p_max = exp(l_i - l_max), so (p_i / p_max) ** (1/T) = exp((l_i - l_max) / T); the
    best kept token always gets weight 1, however small T is.
    """
    vals = logit_vals.astype(np.float64)
    best = np.max(np.where(keep, vals, -np.inf), axis=1, keepdims=True)
    with np.errstate(invalid="ignore"):  # -inf - -inf in dropped columns; masked below
        scaled = np.exp((vals - best) / temperature[:, None])
    return np.where(keep, scaled, 0.0)


def sample_whole(logits: np.ndarray, temperature: np.ndarray, uniform: np.ndarray) -> np.ndarray:
    """Draw from the full distribution raised to 1/T (no truncation at all): no sort needed,
    tokens are walked in vocabulary order."""
    rows, width = logits.shape
    tokens = np.empty(rows, dtype=np.int64)
    weights = scratch.array("whole_weights", (width,), np.float64)
    for row in range(rows):
        np.subtract(logits[row], logits[row].max(), out=weights)
        weights /= temperature[row]
        np.exp(weights, out=weights)
        np.cumsum(weights, out=weights)  # running sums, in float64 over the whole vocabulary
        picked = np.searchsorted(weights, uniform[row] * weights[-1], side="right")
        tokens[row] = min(int(picked), width - 1)
    return tokens


def truncate(
    scores: np.ndarray,
    logits: np.ndarray,
    log_norm: np.ndarray,
    k_limit: np.ndarray,
    mass_limit: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Ai00's cut, for Nucleus (scores = logits) and Typical (scores = typicality).

    Walk each row's tokens in descending `scores` order; keep a token while fewer than
    `k_limit` are kept and the probability mass of the tokens before it does not exceed
    `mass_limit` (so the token that crosses the limit is kept, and a limit of 0 keeps one).
    Tokens with probability 0 are never kept.

    Returns [rows, columns] arrays: token ids, their logits, and the keep mask.
    """
    rows, width = scores.shape
    widest = int(k_limit.max())
    columns = widest if widest <= 2 * _FIRST_ROUND else _FIRST_ROUND
    pending = np.arange(rows)
    results: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]] = []
    while pending.size:
        columns = min(columns, width)
        subset = scores if pending.size == rows else scores[pending]
        ids, score_vals = top_k_sorted(subset, columns)
        if scores is logits:
            logit_vals = score_vals
        else:
            logit_vals = logits[pending[:, None], ids]
        prob = np.exp(logit_vals.astype(np.float64) - log_norm[pending, None])
        mass_before = np.cumsum(prob, axis=1) - prob
        rank = np.arange(ids.shape[1])
        keep = (
            (rank < k_limit[pending, None])
            & (mass_before <= mass_limit[pending, None])
            & (score_vals > -np.inf)
            & (prob > 0)
        )
        # The cut is settled when the limit on rank lies within the columns looked at, or
        # the mass crossed the limit inside them, or there is nothing more to look at.
        settled = (
            (k_limit[pending] <= ids.shape[1])
            | (mass_before[:, -1] + prob[:, -1] > mass_limit[pending])
            | (columns >= width)
        )
        results.append((pending[settled], ids[settled], logit_vals[settled], keep[settled]))
        pending = pending[~settled]
        columns *= _WIDEN
        if 4 * columns >= width:  # nearly everything: one full sort beats more rounds
            columns = width

    if len(results) == 1 and results[0][0].size == rows:
        _, ids, logit_vals, keep = results[0]
        return ids, logit_vals, keep
    columns = max(part[1].shape[1] for part in results)
    ids = np.zeros((rows, columns), dtype=np.int64)
    logit_vals = np.full((rows, columns), -np.inf, dtype=np.float32)
    keep = np.zeros((rows, columns), dtype=bool)
    for where, part_ids, part_vals, part_keep in results:
        used = part_ids.shape[1]
        ids[where, :used] = part_ids
        logit_vals[where, :used] = part_vals
        keep[where, :used] = part_keep
    return ids, logit_vals, keep


def sample_ranked(
    logits: np.ndarray,
    rank,
    top_k: np.ndarray,
    mass: np.ndarray,
    temperature: np.ndarray,
    uniform: np.ndarray,
) -> np.ndarray:
    """One token per row: order the tokens by `rank(rows_logits, rows) -> (scores, log_norm)`
    (higher first), keep the first `top_k` (0 = no limit), keep while the mass before a
    token is <= `mass` (the crossing token stays), raise the kept probabilities to
    1/`temperature` (> 0: greedy rows never come here), renormalise, draw with `uniform`.
    """
    rows, width = logits.shape
    k_limit = np.where((top_k <= 0) | (top_k >= width), width, top_k)
    # mass 1 keeps everything: no limit at all (a float running sum could otherwise creep
    # past 1.0 a hair early and drop the tail).
    mass_limit = np.where(mass >= 1.0, np.inf, mass)
    tokens = np.empty(rows, dtype=np.int64)
    # No cut: every possible token, and the order no longer matters.
    untruncated = (k_limit >= width) & np.isinf(mass_limit)
    if untruncated.any():
        tokens[untruncated] = sample_whole(logits[untruncated], temperature[untruncated], uniform[untruncated])
    cut = ~untruncated
    if cut.any():
        sub = logits if cut.all() else logits[cut]
        scores, log_norm = rank(sub, cut)
        ids, logit_vals, keep = truncate(scores, sub, log_norm, k_limit[cut], mass_limit[cut])
        picked = draw(tempered_weights(logit_vals, keep, temperature[cut]), uniform[cut])
        tokens[cut] = ids[np.arange(ids.shape[0]), picked]
    return tokens
