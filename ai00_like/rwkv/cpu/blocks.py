"""The layers of RWKV v4, v5, v6 and v7 in numpy (rwkv-spec §2): a `Block` per layer, its
time mix and channel mix per version.

Every block works on the stacked rows of a batch step ([A, C]: the tokens of all slots
one after the other) and on this layer's slice of the state pool; only the WKV
recurrence and the token shift care which slot a row belongs to. gpu/blocks.py records
the same blocks as GPU dispatches.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from ..norms import LN_EPS, group_norm, layer_norm
from ..weights import LayerWeights, att_projections, ffn_projections, v7_loras
from .ops import kernel_form, linear, sigmoid, silu, token_shift
from .wkv import (
    run_segments,
    wkv4_sequence,
    wkv4_step,
    wkv5_sequence,
    wkv5_step,
    wkv7_sequence,
    wkv7_step,
)
from . import intrinsics
from .jit import kernels_on, launch
from .wkv_numba import wkv5_segments

if intrinsics.build() is not None:
    from .fused7_layer import chunk_heads, rows_layer_norm, rows_mixed, rows_relu_squared
else:
    chunk_heads = rows_layer_norm = rows_mixed = rows_relu_squared = None

V7_DECAY_SCALE = 0.606531  # e^-1/2, as the reference writes it


def projections(w: LayerWeights, mix: str, names) -> dict[str, np.ndarray]:
    """A mix's projection matrices (`mix` "att" or "ffn"), in the form `linear` reads."""
    return {n: kernel_form(w.projection(f"{mix}.{n}.weight")) for n in names}


class Context:
    """What one layer hands to the next within a step (v7's value residual)."""

    v_first: np.ndarray | None = None


# ------------------------------------------------------------------------------ v4


class TimeMix4:
    def __init__(self, w: LayerWeights, info):
        self.mix = np.stack([w.vector(f"att.time_mix_{q}") for q in "kvr"])[:, None, :]
        self.log_decay = -np.exp(w.vector("att.time_decay"))  # per step, < 0
        self.bonus = w.vector("att.time_first")
        self.W = projections(w, "att", att_projections(info.version))

    def __call__(self, z, prev, plan, states, ctx):
        xk, xv, xr = z * self.mix + prev * (1.0 - self.mix)
        r = sigmoid(linear(xr, self.W["receptance"]))
        k, v = linear(xk, self.W["key"]), linear(xv, self.W["value"])
        wkv = run_segments(
            plan, states, lambda s, k, v: wkv4_step(s, k, v, self.log_decay, self.bonus),
            lambda s, k, v: wkv4_sequence(s, k, v, self.log_decay, self.bonus), k, v,
        )
        return linear(r * wkv, self.W["output"])


class ChannelMix4:
    """v4 and v5: x = z·μ + p·(1−μ);  σ(W_r x_r) ⊙ W_v relu(W_k x_k)²."""

    def __init__(self, w: LayerWeights, info):
        self.mix = np.stack([w.vector("ffn.time_mix_k"), w.vector("ffn.time_mix_r")])[:, None, :]
        self.W = projections(w, "ffn", ffn_projections(info.version))

    def __call__(self, z, prev):
        xk, xr = z * self.mix + prev * (1.0 - self.mix)
        return feed_forward(self.W, xk, xr)


# ------------------------------------------------------------------------------ v5


class TimeMix5:
    def __init__(self, w: LayerWeights, info):
        self.H, self.N = info.n_head, info.head_size
        self.gated = info.version != "5.0"
        self.mix = np.stack([w.vector(f"att.time_mix_{q}") for q in ("rkvg" if self.gated else "rkv")])[:, None, :]
        # 5.0/5.1 decay and bonus are per head, 5.2 per channel: [H, 1] or [H, N] broadcast alike.
        per_head = (self.H, -1)
        self.log_decay = (-np.exp(w.matrix("att.time_decay"))).reshape(per_head)
        if w.has("att.time_faaaa"):
            self.bonus = w.matrix("att.time_faaaa").reshape(per_head)
        else:  # the legacy name holds log u
            self.bonus = np.exp(w.matrix("att.time_first")).reshape(per_head)
        self.W = projections(w, "att", att_projections(info.version))
        self.ln_x = (w.vector("att.ln_x.weight"), w.vector("att.ln_x.bias"))

    def __call__(self, z, prev, plan, states, ctx):
        A, H, N = z.shape[0], self.H, self.N
        mixed = z * self.mix + prev * (1.0 - self.mix)
        r, k, v = (linear(x, self.W[n]).reshape(A, H, N) for x, n in zip(mixed, ("receptance", "key", "value")))
        log_decay = np.broadcast_to(self.log_decay, (A, H, N))
        y = wkv5(plan, states, r, k, v, log_decay, self.bonus)
        y = group_norm(y.reshape(A, H * N), H, *self.ln_x)
        if self.gated:
            y = y * silu(linear(mixed[3], self.W["gate"]))
        return linear(y, self.W["output"])


# ------------------------------------------------------------------------------ v6


class TimeMix6:
    def __init__(self, w: LayerWeights, info):
        self.H, self.N = info.n_head, info.head_size
        self.maa_x = w.vector("att.time_maa_x")
        # The data-dependent mix LoRA yields 5 slices in the order w, k, v, r, g.
        self.maa = np.stack([w.vector(f"att.time_maa_{q}") for q in "wkvrg"])[:, None, :]
        self.maa_w1 = w.matrix("att.time_maa_w1")  # [C, 5·Dm]
        self.maa_w2 = w.matrix("att.time_maa_w2")  # [5, Dm, C]
        self.decay = w.vector("att.time_decay")
        self.decay_w1, self.decay_w2 = w.matrix("att.time_decay_w1"), w.matrix("att.time_decay_w2")
        self.bonus = w.matrix("att.time_faaaa").reshape(self.H, self.N)
        self.W = projections(w, "att", att_projections(info.version))
        self.ln_x = (w.vector("att.ln_x.weight"), w.vector("att.ln_x.bias"))

    def __call__(self, z, prev, plan, states, ctx):
        A, H, N = z.shape[0], self.H, self.N
        d = prev - z
        m = np.tanh((z + d * self.maa_x) @ self.maa_w1).reshape(A, 5, -1)
        dyn = np.einsum("aqd,qdc->qac", m, self.maa_w2)
        xw, xk, xv, xr, xg = z + d * (self.maa + dyn)
        r, k, v = (linear(x, self.W[n]).reshape(A, H, N) for x, n in ((xr, "receptance"), (xk, "key"), (xv, "value")))
        g = silu(linear(xg, self.W["gate"]))
        lam = self.decay + np.tanh(xw @ self.decay_w1) @ self.decay_w2
        log_decay = (-np.exp(lam)).reshape(A, H, N)  # decay = exp(−exp(λ)), per token
        y = wkv5(plan, states, r, k, v, log_decay, self.bonus)
        y = group_norm(y.reshape(A, H * N), H, *self.ln_x)
        return linear(y * g, self.W["output"])


class ChannelMix6:
    """v6: x = z + (p − z)·μ;  σ(W_r x_r) ⊙ W_v relu(W_k x_k)²."""

    def __init__(self, w: LayerWeights, info):
        self.maa = np.stack([w.vector("ffn.time_maa_k"), w.vector("ffn.time_maa_r")])[:, None, :]
        self.W = projections(w, "ffn", ffn_projections(info.version))

    def __call__(self, z, prev):
        xk, xr = z + (prev - z) * self.maa
        return feed_forward(self.W, xk, xr)


# ------------------------------------------------------------------------------ v7


class HeadWeights(NamedTuple):
    """TimeMix7's vectors from its products' outputs to its output matrix, fp32 [C] (r_k
    [H, N]; v0 is w0 in the first layer, which has no value residual)."""

    w0: np.ndarray
    a0: np.ndarray
    v0: np.ndarray
    k_k: np.ndarray
    k_a: np.ndarray
    r_k: np.ndarray
    lnx_w: np.ndarray
    lnx_b: np.ndarray


class HeadRows(NamedTuple):
    """A step's rows [A, C] from TimeMix7's products: r, k, v, the gate g, and the raw
    outputs of the decay's, α's and the value residual's LoRAs (before their sums and
    sigmoids; the first layer's value_lora is v, unused)."""

    r: np.ndarray
    k: np.ndarray
    v: np.ndarray
    g: np.ndarray
    decay_lora: np.ndarray
    alpha_lora: np.ndarray
    value_lora: np.ndarray


class TimeMix7:
    def __init__(self, w: LayerWeights, info):
        self.H, self.N, self.first = info.n_head, info.head_size, w.layer == 0
        self.mix = np.stack([w.vector(f"att.x_{q}") for q in "rwkvag"])[:, None, :]
        self.lora = {n: w.low_rank(f"att.{n}") for n in v7_loras(w.layer)}  # [out, in], as linear reads
        own = lambda v: np.array(v, dtype=np.float32)  # own copies: one compiled type
        w0 = own(w.vector("att.w0"))
        self.heads = HeadWeights(w0, own(w.vector("att.a0")), w0 if self.first else own(w.vector("att.v0")),
                                 own(w.vector("att.k_k")), own(w.vector("att.k_a")),
                                 own(w.matrix("att.r_k").reshape(self.H, self.N)),
                                 own(w.vector("att.ln_x.weight")), own(w.vector("att.ln_x.bias")))
        self.W = projections(w, "att", att_projections(info.version))

    def __call__(self, z, prev, plan, states, ctx):
        # x_q = z + (p − z)·μ_q, each made where it is used: the six at once were a prefill's
        # largest temporaries
        delta, (mu_r, mu_w, mu_k, mu_v, mu_a, mu_g) = prev - z, self.mix
        xv = _mixed(z, delta, mu_v)
        lora = self.lora
        v = linear(xv, self.W["value"])
        rows = HeadRows(
            r=linear(_mixed(z, delta, mu_r), self.W["receptance"]),
            k=linear(_mixed(z, delta, mu_k), self.W["key"]),
            v=v,
            g=linear(sigmoid(linear(_mixed(z, delta, mu_g), lora["g1"])), lora["g2"]),
            decay_lora=linear(np.tanh(linear(_mixed(z, delta, mu_w), lora["w1"])), lora["w2"]),
            alpha_lora=linear(linear(_mixed(z, delta, mu_a), lora["a1"]), lora["a2"]),
            value_lora=v if self.first else linear(linear(xv, lora["v1"]), lora["v2"]),
        )
        if chunk_heads is not None and kernels_on():
            y = self._compiled_heads(rows, plan, states, ctx)
        else:
            y = self._heads(rows, plan, states, ctx)
        return linear(y, self.W["output"])

    def _heads(self, rows: HeadRows, plan, states, ctx):
        """From the products' rows to what the output matrix multiplies: the WKV's inputs
        (rwkv-spec §2.5), the recurrence, and the normed heads plus the bonus, gated."""
        A, H, N, hw = rows.r.shape[0], self.H, self.N, self.heads
        log_decay = -V7_DECAY_SCALE * sigmoid(hw.w0 + rows.decay_lora)
        alpha = sigmoid(hw.a0 + rows.alpha_lora)  # in-context learning rate
        kappa = (rows.k * hw.k_k).reshape(A, H, N)
        kappa = kappa / np.maximum(np.linalg.norm(kappa, axis=-1, keepdims=True), 1e-12)
        k = rows.k * (1.0 + (alpha - 1.0) * hw.k_a)  # κ̂ above uses the unmodified k
        v = rows.v
        if self.first:
            ctx.v_first = v
        else:
            v = v + (ctx.v_first - v) * sigmoid(hw.v0 + rows.value_lora)
        r3, k3, v3 = rows.r.reshape(A, H, N), k.reshape(A, H, N), v.reshape(A, H, N)
        per_token = (r3, log_decay.reshape(A, H, N), k3, v3, -kappa, kappa * alpha.reshape(A, H, N))
        y = run_segments(plan, states, wkv7_step, wkv7_sequence, *per_token)
        y = group_norm(y.reshape(A, H * N), H, hw.lnx_w, hw.lnx_b)
        bonus = np.sum(r3 * k3 * hw.r_k, axis=-1, keepdims=True) * v3  # added after the norm
        return (y + bonus.reshape(A, H * N)) * rows.g

    def _compiled_heads(self, rows: HeadRows, plan, states, ctx):
        """`_heads` in one compiled call (fused7_layer.mixed_heads, the decoding layer's
        own): a prefill's element-wise numpy work, about a sixth of a 0.1B chunk's time."""
        rows = HeadRows(*(np.ascontiguousarray(a, dtype=np.float32) for a in rows))
        if self.first:
            ctx.v_first = np.empty_like(rows.v)
        slots = np.repeat(plan.slots, plan.stops - plan.starts).astype(np.int64)
        return launch(chunk_heads, self.heads, rows, ctx.v_first, self.first, states, slots)


class ChannelMix7:
    """v7: x = z + (p − z)·μ;  W_v relu(W_k x)², no receptance gate."""

    def __init__(self, w: LayerWeights, info):
        self.mix = w.vector("ffn.x_k")
        self.W = projections(w, "ffn", ffn_projections(info.version))

    def __call__(self, z, prev):
        return feed_forward(self.W, _mixed(z, prev - z, self.mix))


def wkv5(plan, states, r, k, v, log_decay, bonus):
    """v5/v6's recurrence over a step's segments: compiled, or numpy's step and chunked forms."""
    if wkv5_segments is not None and kernels_on():
        return wkv5_segments(plan, states, r, k, v, log_decay, bonus)
    return run_segments(plan, states, lambda s, *a: wkv5_step(s, *a, bonus), lambda s, *a: wkv5_sequence(s, *a, bonus),
                        r, k, v, log_decay)


def feed_forward(W, xk, xr=None):
    """The channel mix after its token mix: W_v relu(W_k x_k)², gated by σ(W_r x_r) before v7."""
    hidden = linear(xk, W["key"])  # [A, 4C]: squared in place, the largest activation of a prefill
    if rows_relu_squared is not None and kernels_on() and hidden.dtype == np.float32 and hidden.flags.c_contiguous:
        rows_relu_squared(hidden)
    else:
        np.square(np.maximum(hidden, 0.0, out=hidden), out=hidden)
    out = linear(hidden, W["value"])
    return out if xr is None else sigmoid(linear(xr, W["receptance"])) * out


MIXES = {"4": (TimeMix4, ChannelMix4), "5": (TimeMix5, ChannelMix4), "6": (TimeMix6, ChannelMix6),
         "7": (TimeMix7, ChannelMix7)}


class Block:
    """One layer: x += time_mix(ln1(x)); x += channel_mix(ln2(x)), each mix fed the previous
    token's normalised row too (the token shift)."""

    def __init__(self, tensors, info, layer: int, precision: str = "fp32", arena=None):
        w = LayerWeights(tensors, layer, precision, arena)
        self.ln1 = (w.vector("ln1.weight"), w.vector("ln1.bias"))
        self.ln2 = (w.vector("ln2.weight"), w.vector("ln2.bias"))
        time_mix, channel_mix = MIXES[info.version[0]]
        self.time_mix, self.channel_mix = time_mix(w, info), channel_mix(w, info)

    def __call__(self, x, slots, plan, ctx):
        """x: (A, C), the step's rows; slots: this layer's `LayerSlots` of every slot."""
        z = _layer_norm(x, self.ln1)
        x = x + self.time_mix(z, token_shift(z, slots.att_shift, plan), plan, slots.wkv, ctx)
        z = _layer_norm(x, self.ln2)
        return x + self.channel_mix(z, token_shift(z, slots.ffn_shift, plan))


def _mixed(z: np.ndarray, delta: np.ndarray, mu: np.ndarray) -> np.ndarray:
    """A token mix z + delta · mu (delta = p − z): compiled, on the cores, or numpy's while the kernels compile."""
    if rows_mixed is not None and kernels_on() and z.dtype == delta.dtype == mu.dtype == np.float32:
        return rows_mixed(z, delta, mu.reshape(-1))
    return z + delta * mu


def _layer_norm(x: np.ndarray, weights: tuple[np.ndarray, np.ndarray]) -> np.ndarray:
    """Each row of x normed: compiled, on the cores, or numpy's while the kernels compile."""
    if rows_layer_norm is not None and kernels_on() and x.dtype == np.float32:
        return rows_layer_norm(x, *weights, LN_EPS)
    return layer_norm(x, *weights)
