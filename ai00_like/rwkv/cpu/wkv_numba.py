"""v7's WKV recurrence token by token, compiled: every segment of a step in one call.

In numpy the recurrence needs the chunked form of rwkv-spec §3.2 to be fast, and even so a
512-token prefill spends a sixth of its time in ~30 small array operations per chunk and
head. Compiled, the plain recurrence of §2.5 is cheaper still: each head's state
(N×N floats, 16 KB at N = 64) stays in the core's cache while the tokens stream through it,
and every (segment, head) pair is independent: a decoding batch's pairs are shared among the
cores (ops.threads_for). It is also the reference's own order of operations, in fp32.

`wkv7_segments` is None without numba (jit.py); the callers then use wkv.py.
"""

from __future__ import annotations

import numpy as np

from .jit import LAUNCH, compiler


def _build():
    tools = compiler()
    if tools is None:
        return None
    jit, prange = tools

    @jit
    def kernel(states, slots, starts, stops, r, decay, k, v, a, b, y):  # pragma: no cover - compiled
        H, N = r.shape[1], r.shape[2]
        for task in prange(len(slots) * H):
            seg, h = task // H, task % H
            S = states[slots[seg], h]  # [value, key]
            for t in range(starts[seg], stops[seg]):
                rt, wt, kt, vt, at, bt = r[t, h], decay[t, h], k[t, h], v[t, h], a[t, h], b[t, h]
                for i in range(N):
                    row = S[i]
                    sa = np.float32(0.0)
                    for j in range(N):
                        sa += row[j] * at[j]
                    vi = vt[i]
                    acc = np.float32(0.0)
                    for j in range(N):
                        s = row[j] * wt[j] + sa * bt[j] + vi * kt[j]
                        row[j] = s
                        acc += s * rt[j]
                    y[t, h, i] = acc

    def wkv7_segments(plan, states, r, log_decay, k, v, a, b):
        """All segments of a step; `states` is the layer's pool [B, H, N(value), N(key)],
        updated in place; the others are the stacked rows [A, H, N]. Returns y [A, H, N].

        S ← S·(diag(decay) + a bᵀ) + v kᵀ;  y = S r   (a = −κ̂, b = κ̂⊙α, k = k')
        """
        args = [np.ascontiguousarray(x, dtype=np.float32) for x in (r, np.exp(log_decay), k, v, a, b)]
        y = np.empty_like(args[0])
        with LAUNCH:
            kernel(states, plan.slots, plan.starts, plan.stops, *args, y)
        return y

    return wkv7_segments


wkv7_segments = _build()
