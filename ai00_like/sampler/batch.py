"""One sampling step for every active request of a batched forward pass.

Per step: the rows the compiled kernel takes (fused.py: greedy or Nucleus with penalties
and nothing else) go there. For the rest: build the adjusted logits of every row
(penalties, grammar mask, logit_bias), then hand all rows that use the same algorithm to
it at once as one [rows, vocab] array. Then record each chosen token in its request's
state.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from . import fused
from .mirostat import sample_mirostat
from .nucleus import sample_nucleus
from .params import Nucleus
from .request import RequestSampler
from .scratch import scratch
from .topk import padded_width, top_k_sorted
from .typical import sample_typical


@dataclass(frozen=True, slots=True)
class BatchSample:
    """What one step picked, row for row.

    * `tokens`: int64 [B].
    * `logprobs`: float64 [B], the chosen token's log-probability under the distribution
      the request's own adjustments make of the model's logits: after penalties, mask and
      logit_bias, before top-k/top-p/typical/Mirostat truncation and before temperature.
      That is the distribution the model "proposes" for this request; after truncation most
      alternatives would be -inf and the temperature would make the numbers depend on a
      knob rather than on the model. NaN for rows whose request asked for no logprobs;
      -inf only when a row had no possible token at all (see below).
    * `top_logprobs`: per row, the request's `top_logprobs` best (token, logprob) pairs of
      that same distribution, best first; impossible tokens are left out; [] when not asked.

    A row where every token is impossible (the mask and bias ban them all) falls back to
    the argmax of the raw logits, so a step never fails; its logprob is -inf.
    """

    tokens: np.ndarray
    logprobs: np.ndarray
    top_logprobs: list[list[tuple[int, float]]]


# Rows are sampled in chunks of this many so that the several passes each step makes over
# a row (max, exp, threshold, ...) find it in cache, and the scratch buffers stay 4 MB at
# V = 65536. Measured with bench/sampler.py: ≈10% faster at batch 64, no change at 16.
ROW_CHUNK = 16


def sample_batch(samplers: Sequence[RequestSampler], logits) -> BatchSample:
    """Pick the next token of every request: row i of `logits` (float32 [B, V], or a
    sequence of B rows) belongs to `samplers[i]`. Updates every sampler's state with its
    chosen token. `logits` is not modified. Each row's result depends only on that row and
    its own sampler, never on the rest of the batch."""
    rows = [np.asarray(row) for row in logits] if not isinstance(logits, np.ndarray) else list(np.atleast_2d(logits))
    if len(rows) != len(samplers):
        raise ValueError(f"{len(samplers)} samplers for {len(rows)} rows of logits")
    vocab = rows[0].shape[0] if rows else 0
    for sampler in samplers:
        if sampler.vocab_size != vocab:
            raise ValueError(f"a sampler built for {sampler.vocab_size} tokens got {vocab} logits")
    # Each row consumes one uniform draw, whichever path samples it.
    uniform = np.array([sampler.next_uniform() for sampler in samplers])
    tokens = np.empty(len(rows), dtype=np.int64)
    logprobs = np.full(len(rows), np.nan)
    top_logprobs: list[list[tuple[int, float]]] = [[] for _ in rows]
    rest = list(range(len(rows)))
    if fused.fits(vocab):
        rest = _sample_fused(samplers, rows, uniform, tokens)
    for start in range(0, len(rest), ROW_CHUNK):
        part = rest[start : start + ROW_CHUNK]
        picked = _sample_rows([samplers[i] for i in part], np.stack([rows[i] for i in part]), uniform[part])
        tokens[part], logprobs[part] = picked.tokens, picked.logprobs
        for i, pairs in zip(part, picked.top_logprobs):
            top_logprobs[i] = pairs
    return BatchSample(tokens=tokens, logprobs=logprobs, top_logprobs=top_logprobs)


def _sample_fused(samplers: Sequence[RequestSampler], rows: list[np.ndarray], uniform: np.ndarray,
                  tokens: np.ndarray) -> list[int]:
    """Sample the rows the compiled kernel can take (fused.py) into `tokens`; returns the
    indices of the rows left for the numpy path. Plain lists, not numpy's small arrays: at
    batch 1 the kernel takes a few µs and this bookkeeping was most of a step's sampling."""
    top_k = [sampler.fused_top_k() for sampler in samplers]
    chosen = [i for i, k in enumerate(top_k) if k]
    if not chosen:
        return list(range(len(rows)))
    penalties, top_p, temperature = [], [], []
    for i in chosen:
        state, params = samplers[i].penalties, samplers[i].params
        penalties.append((state.ids, state.now()) if state is not None and state.active else None)
        # top_p 1 keeps everything, as draw.py's sample_ranked: no float sum may creep past it.
        # Greedy rows (top_k 1) may be Typical's and use neither.
        nucleus = isinstance(params, Nucleus)
        top_p.append(params.top_p if nucleus and params.top_p < 1.0 else np.inf)
        temperature.append(params.temperature if nucleus else 1.0)
    picked, status = fused.sample([rows[i] for i in chosen], penalties, [top_k[i] for i in chosen], top_p,
                                  temperature, [uniform[i] for i in chosen])
    rest = [i for i in range(len(rows)) if not top_k[i]]
    for n, i in enumerate(chosen):
        if status[n] == fused.DONE:
            tokens[i] = picked[n]
            samplers[i].record(int(picked[n]), None)
        else:
            rest.append(i)
    return sorted(rest)


def _sample_rows(samplers: Sequence[RequestSampler], logits: np.ndarray, uniform: np.ndarray) -> BatchSample:
    rows, vocab = logits.shape
    width = padded_width(vocab)
    work = scratch.array("work", (rows, width), np.float32)
    work[:, vocab:] = -np.inf
    for row, sampler in enumerate(samplers):
        sampler.prepare_logits(logits[row], work[row, :vocab])

    row_max = work.max(axis=1)
    broken = ~np.isfinite(row_max) & (row_max != -np.inf)
    for row in np.flatnonzero(broken):
        row_max[row] = _repair(work[row])
    dead = row_max == -np.inf

    tokens = np.empty(rows, dtype=np.int64)
    surprise = np.full(rows, np.nan)
    kind = np.array([sampler.kind for sampler in samplers])
    kind[dead] = "dead"
    wants_logprobs = np.array([sampler.options.wants_logprobs for sampler in samplers])

    # Typical computes its own normaliser along with the entropy.
    needs_norm = (((kind != "greedy") & (kind != "Typical")) | wants_logprobs) & ~dead
    log_norm = np.full(rows, -np.inf)
    if needs_norm.any():
        log_norm[needs_norm] = _log_normaliser(work, row_max, needs_norm)

    if dead.any():
        tokens[dead] = [_fallback_token(logits[row]) for row in np.flatnonzero(dead)]
    greedy = kind == "greedy"
    if greedy.any():
        tokens[greedy] = np.argmax(_rows(work, np.flatnonzero(greedy)), axis=1)

    nucleus = np.flatnonzero(kind == "Nucleus")
    if nucleus.size:
        params = [samplers[row].params for row in nucleus]
        tokens[nucleus] = sample_nucleus(
            _rows(work, nucleus),
            log_norm[nucleus],
            np.array([p.top_k for p in params], dtype=np.int64),
            np.array([p.top_p for p in params]),
            np.array([p.temperature for p in params]),
            uniform[nucleus],
        )
    typical = np.flatnonzero(kind == "Typical")
    if typical.size:
        params = [samplers[row].params for row in typical]
        tokens[typical] = sample_typical(
            _rows(work, typical),
            row_max[typical],
            np.array([p.top_k for p in params], dtype=np.int64),
            np.array([p.tau for p in params]),
            np.array([p.temperature for p in params]),
            uniform[typical],
        )
    mirostat = np.flatnonzero(kind == "Mirostat")
    if mirostat.size:
        tokens[mirostat], surprise[mirostat] = sample_mirostat(
            _rows(work, mirostat),
            log_norm[mirostat],
            np.array([samplers[row].max_surprise for row in mirostat]),
            uniform[mirostat],
        )

    logprobs = np.full(rows, np.nan)
    top_logprobs: list[list[tuple[int, float]]] = [[] for _ in range(rows)]
    asked = np.flatnonzero(wants_logprobs)
    if asked.size:
        with np.errstate(invalid="ignore"):  # dead rows: -inf - -inf, set just below
            logprobs[asked] = work[asked, tokens[asked]] - log_norm[asked]
        logprobs[asked[dead[asked]]] = -np.inf
        _fill_top_logprobs(samplers, work, log_norm, asked[~dead[asked]], top_logprobs)

    for row, sampler in enumerate(samplers):
        sampler.record(int(tokens[row]), None if np.isnan(surprise[row]) else float(surprise[row]))
    return BatchSample(tokens=tokens, logprobs=logprobs, top_logprobs=top_logprobs)


def _rows(work: np.ndarray, rows: np.ndarray) -> np.ndarray:
    """The given rows of `work`: `work` itself when that is all of them, else a copy in a
    scratch buffer (valid until the next _rows call)."""
    if rows.size == work.shape[0]:
        return work
    return np.take(work, rows, axis=0, out=scratch.array("group", (rows.size, work.shape[1]), work.dtype))


def _log_normaliser(work: np.ndarray, row_max: np.ndarray, which: np.ndarray) -> np.ndarray:
    """log Σ exp(logits) of the selected rows, shifted by the row max for stability."""
    sub = _rows(work, np.flatnonzero(which))
    shifted = scratch.array("exp", sub.shape, np.float32)
    np.subtract(sub, row_max[which, None], out=shifted)
    np.exp(shifted, out=shifted)
    # A float32 pairwise sum is accurate to ~1e-6 here and cheaper than converting to f64.
    return row_max[which] + np.log(shifted.sum(axis=1).astype(np.float64))


def _repair(row: np.ndarray) -> float:
    """A row with NaN or +inf logits (a broken model output or a forced token): NaN becomes
    impossible, and if some tokens are +inf they are the only possible ones, equally likely."""
    np.copyto(row, -np.inf, where=np.isnan(row))
    forced = row == np.inf
    if forced.any():
        row[...] = np.where(forced, 0.0, -np.inf)
    return float(row.max())


def _fallback_token(raw: np.ndarray) -> int:
    return int(np.argmax(np.where(np.isnan(raw), -np.inf, raw)))


def _fill_top_logprobs(
    samplers: Sequence[RequestSampler],
    work: np.ndarray,
    log_norm: np.ndarray,
    rows: np.ndarray,
    out: list[list[tuple[int, float]]],
) -> None:
    wanted = np.array([samplers[row].options.top_logprobs for row in rows], dtype=np.int64)
    rows = rows[wanted > 0]
    wanted = wanted[wanted > 0]
    if not rows.size:
        return
    ids, vals = top_k_sorted(_rows(work, rows), int(wanted.max()))
    for j, row in enumerate(rows):
        count = int(wanted[j])
        finite = vals[j, :count] > -np.inf
        out[row] = [
            (int(token), float(value - log_norm[row]))
            for token, value in zip(ids[j, :count][finite], vals[j, :count][finite])
        ]
