"""The WKV recurrence of v5/v6 token by token, compiled: every segment of a step in one call
(v7's is fused7_layer.py's `wkv`, inside the work between its products).

In numpy the recurrence needs the chunked form of rwkv-spec §3.2 to be fast, and even so a
512-token prefill spends a sixth of its time in ~30 small array operations per chunk and
head. Compiled, the plain recurrence of §2.5 is cheaper still: each head's state
(N×N floats, 16 KB at N = 64) stays in the core's cache while the tokens stream through it,
and every (segment, head) pair is independent: a decoding batch's pairs are shared among the
cores (ops.threads_for). It is also the reference's own order of operations, in fp32.

`wkv5_segments` is None without numba (jit.py); the callers then use wkv.py.
"""

from __future__ import annotations

import numpy as np

from .jit import compiler, launch, read_only


def _build():
    tools = compiler()
    if tools is None:
        return None
    jit, prange = tools

    # Each task takes one view, its head's state; the loops index the arrays themselves. A
    # view per row or per token costs two atomic reference counts in numba's runtime, and
    # they had taken most of the time (a token's 12 heads: 16 → 9 µs).
    @jit
    def kernel5(states, slots, starts, stops, r, decay, k, v, u, y):  # pragma: no cover - compiled
        H, N = r.shape[1], r.shape[2]
        for task in prange(len(slots) * H):
            seg, h = task // H, task % H
            S = states[slots[seg], h]  # [key, value]
            for t in range(starts[seg], stops[seg]):
                for j in range(N):
                    y[t, h, j] = 0.0
                for i in range(N):
                    ri, ki, wi = r[t, h, i], k[t, h, i], decay[t, h, i]
                    rui = ri * u[h, i] * ki
                    for j in range(N):
                        y[t, h, j] += ri * S[i, j] + rui * v[t, h, j]
                        S[i, j] = wi * S[i, j] + ki * v[t, h, j]

    def run_segments(kernel, plan, states, per_token, extra=()):
        args = [np.ascontiguousarray(x, dtype=np.float32) for x in per_token]
        if any(a.shape != args[0].shape for a in args) or states.dtype != np.float32:
            raise ValueError("WKV inputs must all be [rows, heads, head_size], states float32")  # no bounds checks inside
        y = np.empty_like(args[0])
        launch(kernel, states, plan.slots, plan.starts, plan.stops, *args, *extra, y)
        return y

    def wkv5_segments(plan, states, r, k, v, log_decay, u):
        """v5/v6: `states` [B, H, N(key), N(value)], updated in place; u [H, N] or [H, 1]. y [A, H, N].

        y[j] = Σ_i r[i]·(u[i]·k[i]·v[j] + S[i, j]);  S[i, j] ← decay[i]·S[i, j] + k[i]·v[j]
        """
        u = read_only(np.ascontiguousarray(np.broadcast_to(u, r.shape[1:]), dtype=np.float32))  # v5.0/5.1 store [H, 1]
        return run_segments(kernel5, plan, states, (r, np.exp(log_decay), k, v), (u,))

    return wkv5_segments


wkv5_segments = _build()
