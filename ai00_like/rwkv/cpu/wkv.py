"""The WKV recurrences of every RWKV version, one token at a time and chunk-parallel.

Each recurrence comes in two forms that compute the same thing:
* `*_step`: one token for a batch of independent sequences (decoding);
* `*_sequence`: all tokens of one sequence, in chunks of `CHUNK` where a stable
  chunked form exists (rwkv-spec §3.2), token by token where it does not (v4).

States are plain float32 arrays (rwkv-spec §2.6): v4 `[3, C]` = (aa, bb, pp);
v5/v6 `[H, N, N]` key-major `S[key, value]`; v7 `[H, N, N]` value-major `S[value, key]`.
"""

from __future__ import annotations

import numpy as np

CHUNK = 16  # tokens per chunk: measured fastest on the 0.1B shape (bench/engine.py); exact far beyond


def run_segments(plan, states: np.ndarray, step, sequence, *per_token: np.ndarray) -> np.ndarray:
    """Run a recurrence over the stacked rows of a batch step.

    Single-token segments (decoding slots) go through one vectorised `step`; each longer
    segment (a prefill chunk) through `sequence`. `states` is this layer's pool [B, ...];
    the slots' states are read from it and written back.
    """
    out = None
    if len(plan.single_rows):
        rows, slots = plan.single_rows, plan.single_slots
        # Decoding slots that sit side by side in the pool (the common case) are updated in
        # place through a view; others are gathered, updated and scattered back.
        where = plan.single_slot_range if plan.single_slot_range is not None else slots
        current = states[where]
        y, new = step(current, *(a[rows] for a in per_token))
        if new is not current or plan.single_slot_range is None:
            states[where] = new
        out = np.empty((plan.n_rows,) + y.shape[1:], dtype=np.float32)
        out[rows] = y
    for slot, start, stop in plan.long_segments:
        y, new = sequence(states[slot], *(a[start:stop] for a in per_token))
        states[slot] = new
        if out is None:
            out = np.empty((plan.n_rows,) + y.shape[1:], dtype=np.float32)
        out[start:stop] = y
    return out


# ---------------------------------------------------------------- v4 (per channel, rwkv-spec §2.2)


def wkv4_step(state: np.ndarray, k: np.ndarray, v: np.ndarray, w: np.ndarray, u: np.ndarray):
    """state [..., 3, C] = (aa, bb, pp) with pp the running max exponent; w < 0 is the log-decay."""
    aa, bb, pp = state[..., 0, :], state[..., 1, :], state[..., 2, :]
    uk = u + k
    q = np.maximum(pp, uk)
    e1, e2 = np.exp(pp - q), np.exp(uk - q)
    y = (e1 * aa + e2 * v) / (e1 * bb + e2)
    decayed = pp + w
    q = np.maximum(decayed, k)
    e1, e2 = np.exp(decayed - q), np.exp(k - q)
    return y, np.stack([e1 * aa + e2 * v, e1 * bb + e2, q], axis=-2)


def wkv4_sequence(state, k, v, w, u):
    y = np.empty_like(k)
    for t in range(k.shape[0]):
        y[t], state = wkv4_step(state, k[t], v[t], w, u)
    return y, state


# ---------------------------------------------------------------- v5 / v6 (diagonal decay, §2.3–2.4)


def wkv5_step(state, r, k, v, log_decay, u):
    """r, k, v, log_decay: [b, H, N]; u [H, N]; state [b, H, N(key), N(value)], updated in place.

    y[j] = Σ_i r[i]·(u[i]·k[i]·v[j] + S[i, j]);  S[i, j] ← decay[i]·S[i, j] + k[i]·v[j]
    """
    y = (r[..., None, :] @ state)[..., 0, :] + np.sum(r * u * k, axis=-1, keepdims=True) * v
    state *= np.exp(log_decay)[..., :, None]  # in place: the caller's state is updated
    state += k[..., :, None] * v[..., None, :]
    return y, state


def wkv5_sequence(state, r, k, v, log_decay, u):
    """One sequence [T, H, N] in chunks, with the pair-wise decay products of rwkv-spec §3.2.

    Every exponent is a sum of log-decays over a span, so it is ≤ 0: no overflow even
    for the near-zero decays v6 can produce.
    """
    T = r.shape[0]
    y = np.empty_like(v)
    for c0 in range(0, T, CHUNK):
        c1 = min(T, c0 + CHUNK)
        y[c0:c1], state = _wkv5_chunk(state, r[c0:c1], k[c0:c1], v[c0:c1], log_decay[c0:c1], u)
    return y, state


def _wkv5_chunk(state, r, k, v, log_decay, u):
    T = r.shape[0]
    # Move heads first: [H, T, N]
    r, k, v, ld = (np.ascontiguousarray(a.transpose(1, 0, 2)) for a in (r, k, v, log_decay))
    # Prefix sums in float64: their differences are the exponents, and in float32 the
    # cancellation of two sums of dozens of log-decays would cost several digits.
    cum = np.cumsum(ld, axis=1, dtype=np.float64)  # Λ_t, inclusive
    before = cum - ld  # Λ_{t-1}
    # A[t, s] = Σ_i r_t[i] k_s[i] exp(Λ_{t-1}[i] − Λ_s[i]) for s < t
    span = before[:, :, None, :] - cum[:, None, :, :]  # [H, T, T, N]
    strictly_lower = np.tril(np.ones((T, T), dtype=bool), -1)
    span = np.exp(np.where(strictly_lower[None, :, :, None], span, -np.inf)).astype(np.float32)
    A = np.einsum("hti,hsi,htsi->hts", r, k, span, optimize=True)
    bonus = np.sum(r * u[:, None, :] * k, axis=-1, keepdims=True) * v
    y = (r * np.exp(before).astype(np.float32)) @ state + A @ v + bonus
    to_end = np.exp(cum[:, -1:, :] - cum).astype(np.float32)  # decay from each token to the chunk's end
    state = np.exp(cum[:, -1, :]).astype(np.float32)[:, :, None] * state + (k * to_end).transpose(0, 2, 1) @ v
    return y.transpose(1, 0, 2), state


# ---------------------------------------------------------------- v7 (diagonal + rank-1, §2.5)


def wkv7_step(state, r, log_decay, k, v, a, b):
    """All vectors [b, H, N]; state [b, H, N(value), N(key)], updated in place.

    S ← S·(diag(decay) + a bᵀ) + v kᵀ;  y = S r   (a = −κ̂, b = κ̂⊙α, k = k')
    """
    sa = state @ a[..., :, None]  # uses the old state
    state *= np.exp(log_decay)[..., None, :]  # in place: the caller's state is updated
    # both rank-1 updates as one [N, 2] @ [2, N] product
    state += np.concatenate((sa, v[..., :, None]), axis=-1) @ np.stack((b, k), axis=-2)
    y = (state @ r[..., :, None])[..., 0]
    return y, state


def wkv7_sequence(state, r, log_decay, k, v, a, b):
    T = r.shape[0]
    y = np.empty_like(v)
    for c0 in range(0, T, CHUNK):
        c1 = min(T, c0 + CHUNK)
        y[c0:c1], state = _wkv7_chunk(state, r[c0:c1], log_decay[c0:c1], k[c0:c1], v[c0:c1], a[c0:c1], b[c0:c1])
    return y, state


_MASKS: dict[int, tuple[np.ndarray, np.ndarray, np.ndarray]] = {}


def _chunk_masks(T: int):
    """(strictly lower [T, 2T], lower incl. diagonal [T, 2T], identity) for a chunk of T tokens."""
    if T not in _MASKS:
        strict = np.tril(np.ones((T, T), np.float32), -1)
        lower = np.tril(np.ones((T, T), np.float32))
        _MASKS[T] = (np.concatenate((strict, strict), 1), np.concatenate((lower, lower), 1), np.eye(T, dtype=np.float32))
    return _MASKS[T]


def _wkv7_chunk(state, r, log_decay, k, v, a, b):
    """The factorised chunk form of rwkv-spec §3.2 (γ_t = cumulative decay within the chunk).

    h_t = S_{t−1} a_t solve (I − tril(Ã B̄ᵀ, −1)) H = Ã S₀ᵀ + tril(Ã K̄ᵀ, −1) V
    Y   = R̃ S₀ᵀ + tril(R̃ B̄ᵀ) H + tril(R̃ K̄ᵀ) V
    S   = S₀ ⊙ γ_T + Hᵀ (B̄ ⊙ γ_T) + Vᵀ (K̄ ⊙ γ_T)
    The B̄ and K̄ terms are computed side by side ([B̄ K̄] and [H; V]) to halve the products.
    v7's decay is ≥ e^−0.6065 per step, so 1/γ stays far inside fp32 for chunks ≤ 128.
    """
    T = r.shape[0]
    strict, lower, eye = _chunk_masks(T)
    r, ld, k, v, a, b = (np.ascontiguousarray(x.transpose(1, 0, 2)) for x in (r, log_decay, k, v, a, b))
    cum = np.cumsum(ld, axis=1, dtype=np.float64)  # log γ_t (float64: see _wkv5_chunk)
    a_t = a * np.exp(cum - ld).astype(np.float32)  # ã_t = a_t ⊙ γ_{t−1}
    r_t = r * np.exp(cum).astype(np.float32)  # r̃_t = r_t ⊙ γ_t
    bk_bar_T = np.concatenate((b, k), axis=1) * np.exp(-np.concatenate((cum, cum), axis=1)).astype(np.float32)
    bk_bar_T = bk_bar_T.transpose(0, 2, 1)  # [H, N, 2T] = [B̄ K̄]ᵀ
    s0_t = state.transpose(0, 2, 1)  # S₀ᵀ: [H, key, value]
    a_bk = (a_t @ bk_bar_T) * strict
    h = np.linalg.solve(eye - a_bk[:, :, :T], a_t @ s0_t + a_bk[:, :, T:] @ v)
    hv = np.concatenate((h, v), axis=1)  # [H; V]: [H, 2T, N]
    y = r_t @ s0_t + ((r_t @ bk_bar_T) * lower) @ hv
    to_end = np.exp(cum[:, -1:, :] - cum).astype(np.float32)  # γ_T / γ_s, computed directly for precision
    state = state * np.exp(cum[:, -1, :]).astype(np.float32)[:, None, :] + hv.transpose(0, 2, 1) @ (
        np.concatenate((b, k), axis=1) * np.concatenate((to_end, to_end), axis=1))
    return y.transpose(1, 0, 2), state
