"""The layers of RWKV v4, v5, v6 and v7 as GPU programs (rwkv-spec §2): the same blocks as
cpu/blocks.py, each uploading its weights and recording its dispatches over the stacked
rows of a step.

Matrices are [out, in] buffers (the LoRA matrices, stored [in, out], transposed once); the
small vectors of a block are packed into one buffer in the order its kernel reads them. The
mix kernel computes x = z + (p − z)·μ, so v4/v5's z·μ + p·(1−μ) is given 1 − μ.
"""

from __future__ import annotations

import numpy as np

from ..norms import GN_EPS
from ..quant import QuantisedMatrix
from ..weights import LayerWeights, att_projections, ffn_projections, v7_loras
from .buffers import Matrix, Uploader
from .recorder import RELU2, SIGMOID, SILU, TANH, Recorder

mixed = Recorder.mixed


def projections(up: Uploader, w: LayerWeights, prefix: str, names) -> dict[str, Matrix]:
    """A block's projections, uploaded as their quantised blocks where they come so."""
    stored = lambda n: w.tensors[f"{w.prefix}{prefix}{n}.weight"]
    return {n: up.matrix(m if isinstance(m := stored(n), QuantisedMatrix) else w.matrix(f"{prefix}{n}.weight"))
            for n in names}


def lora(up: Uploader, w: LayerWeights, name: str) -> Matrix:
    return up.matrix(np.ascontiguousarray(w.matrix(name).T))


def norm_pair(up: Uploader, w: LayerWeights, name: str) -> tuple:
    return up.vector(w.vector(f"{name}.weight")), up.vector(w.vector(f"{name}.bias"))


# ------------------------------------------------------------------------------ v4


class TimeMix4:
    def __init__(self, w: LayerWeights, info, up: Uploader):
        self.mix = up.vector(1.0 - np.stack([w.vector(f"att.time_mix_{q}") for q in "rkv"]))
        self.wkv = up.vector(np.concatenate([-np.exp(w.vector("att.time_decay")), w.vector("att.time_first")]))
        self.W = projections(up, w, "att.", att_projections(info.version))

    def record(self, rec: Recorder, layer: int) -> None:
        off = rec.off
        rec.mix(self.mix, 3)  # r, k, v
        rec.linear(mixed(0), self.W["receptance"], "r", SIGMOID)
        rec.linear(mixed(1), self.W["key"], "k")
        rec.linear(mixed(2), self.W["value"], "v")
        rec.wkv("wkv4.wgsl", (rec.C, rec.segment_table, off("r"), off("k"), off("v"), off("y"),
                              *rec.states.at("wkv", layer)), self.wkv, (rec.groups_c, rec.segments))
        rec.linear("y", self.W["output"], "x", accumulate=1)


class ChannelMix4:
    """v4–v6: σ(W_r x_r) ⊙ W_v relu(W_k x_k)², the mixed inputs in region order r, k."""

    def __init__(self, w: LayerWeights, info, up: Uploader):
        self.mix = up.vector(self.coefficients(w))
        self.W = projections(up, w, "ffn.", ffn_projections(info.version))

    @staticmethod
    def coefficients(w: LayerWeights) -> np.ndarray:
        return 1.0 - np.stack([w.vector("ffn.time_mix_r"), w.vector("ffn.time_mix_k")])

    def record(self, rec: Recorder, layer: int) -> None:
        rec.mix(self.mix, 2)
        rec.linear(mixed(0), self.W["receptance"], "r", SIGMOID)
        rec.linear(mixed(1), self.W["key"], "h", RELU2)
        rec.linear("h", self.W["value"], "t")
        rec.multiply("r", "t", "x", accumulate=1)


# ------------------------------------------------------------------------------ v5


def record_wkv5(rec: Recorder, layer: int, vecs, ln_x, dynamic: int) -> None:
    """v5/v6's recurrence (`dynamic`: v6's decay per token, in "w") and the per-head norm."""
    off, info = rec.off, rec.info
    rec.wkv("wkv5.wgsl", (rec.C, info.head_size, rec.segment_table, dynamic, off("r"), off("w"), off("k"), off("v"),
                          off("y"), *rec.states.at("wkv", layer)), vecs, (info.n_head, rec.segments))
    rec.norm("y", "y", ln_x, groups=info.n_head, eps=GN_EPS)


class TimeMix5:
    def __init__(self, w: LayerWeights, info, up: Uploader):
        self.gated = info.version != "5.0"
        bonus = w.matrix("att.time_faaaa") if w.has("att.time_faaaa") else np.exp(w.matrix("att.time_first"))
        per_channel = lambda values: np.broadcast_to(  # 5.0/5.1 keep decay and bonus per head, 5.2 per channel
            values.reshape(info.n_head, -1), (info.n_head, info.head_size)).reshape(-1)
        self.mix = up.vector(1.0 - np.stack([w.vector(f"att.time_mix_{q}") for q in ("rkvg" if self.gated else "rkv")]))
        self.wkv = up.vector(np.concatenate([per_channel(bonus), per_channel(-np.exp(w.matrix("att.time_decay")))]))
        self.ln_x = norm_pair(up, w, "att.ln_x")
        self.W = projections(up, w, "att.", att_projections(info.version))

    def record(self, rec: Recorder, layer: int) -> None:
        rec.mix(self.mix, 4 if self.gated else 3)  # r, k, v (, g)
        rec.linear(mixed(0), self.W["receptance"], "r")
        rec.linear(mixed(1), self.W["key"], "k")
        rec.linear(mixed(2), self.W["value"], "v")
        record_wkv5(rec, layer, self.wkv, self.ln_x, dynamic=0)
        if self.gated:
            rec.linear(mixed(3), self.W["gate"], "g", SILU)
            rec.multiply("y", "g", "y")
        rec.linear("y", self.W["output"], "x", accumulate=1)


# ------------------------------------------------------------------------------ v6


class TimeMix6:
    def __init__(self, w: LayerWeights, info, up: Uploader):
        maa_w2 = w.matrix("att.time_maa_w2")  # [5, Dm, C], slices in the order w, k, v, r, g
        maa = {q: w.vector(f"att.time_maa_{q}") for q in "wkvrg"}
        self.maa_x = up.vector(w.vector("att.time_maa_x"))
        # in region order r, w, k, v, (a: unused), g
        unused = np.zeros(info.n_embd, np.float32)
        self.maa = up.vector(np.stack([maa["r"], maa["w"], maa["k"], maa["v"], unused, maa["g"]]))
        self.maa_w1 = lora(up, w, "att.time_maa_w1")
        self.maa_w2 = {q: up.matrix(np.ascontiguousarray(maa_w2[n].T)) for n, q in enumerate("wkvrg")}
        self.decay_w1, self.decay_w2 = lora(up, w, "att.time_decay_w1"), lora(up, w, "att.time_decay_w2")
        self.wkv = up.vector(np.concatenate([w.vector("att.time_faaaa"), w.vector("att.time_decay")]))
        self.ln_x = norm_pair(up, w, "att.ln_x")
        self.W = projections(up, w, "att.", att_projections(info.version))

    def record(self, rec: Recorder, layer: int) -> None:
        rec.mix(self.maa_x, 1, dst="y")  # z + (p − z) μ_x, the LoRA's input
        rec.linear("y", self.maa_w1, "t", TANH)
        rank = self.maa_w1.rows // 5
        for n, q in enumerate("wkvrg"):  # each slice of the LoRA's output through its own W2
            rec.linear("t", self.maa_w2[q], mixed("rwkvag".index(q)), src_shift=n * rank, src_stride=self.maa_w1.rows)
        rec.mix(self.maa, 6, entry="dynamic")  # in region order r, w, k, v, (a), g
        rec.linear(mixed(0), self.W["receptance"], "r")
        rec.linear(mixed(2), self.W["key"], "k")
        rec.linear(mixed(3), self.W["value"], "v")
        rec.linear(mixed(5), self.W["gate"], "g", SILU)
        rec.linear(mixed(1), self.decay_w1, "a", TANH)
        rec.linear("a", self.decay_w2, "w")  # λ's LoRA part; decay = exp(−exp(λ)) in the kernel
        record_wkv5(rec, layer, self.wkv, self.ln_x, dynamic=1)
        rec.multiply("y", "g", "y")
        rec.linear("y", self.W["output"], "x", accumulate=1)


class ChannelMix6(ChannelMix4):
    """v6: its coefficients are μ itself (x = z + (p − z)·μ)."""

    @staticmethod
    def coefficients(w: LayerWeights) -> np.ndarray:
        return np.stack([w.vector("ffn.time_maa_r"), w.vector("ffn.time_maa_k")])


# ------------------------------------------------------------------------------ v7


class TimeMix7:
    def __init__(self, w: LayerWeights, info, up: Uploader):
        unused = np.zeros(info.n_embd, np.float32)  # block 0 has no value residual
        self.mix = up.vector(np.stack([w.vector(f"att.x_{q}") for q in "rwkvag"]))
        self.prepare = up.vector(np.concatenate([
            w.vector("att.w0"), w.vector("att.a0"), w.vector("att.v0") if w.layer else unused,
            w.vector("att.k_k"), w.vector("att.k_a")]))
        self.out_vecs = up.vector(np.concatenate([w.vector("att.ln_x.weight"), w.vector("att.ln_x.bias"),
                                                  w.vector("att.r_k")]))
        self.W = projections(up, w, "att.", att_projections(info.version))
        self.lora = {n: lora(up, w, f"att.{n}") for n in v7_loras(w.layer)}

    def record(self, rec: Recorder, layer: int) -> None:
        off, W, lora, N = rec.off, self.W, self.lora, rec.info.head_size
        heads = (rec.info.n_head, rec.rows)
        rec.mix(self.mix, 6)  # r, w, k, v, a, g
        rec.linear("xr", W["receptance"], "r")
        rec.linear("xk", W["key"], "k")
        rec.linear("xv", W["value"], "v")
        rec.linear("xw", lora["w1"], "t", TANH)
        rec.linear("t", lora["w2"], "w")
        rec.linear("xa", lora["a1"], "t")
        rec.linear("t", lora["a2"], "a")
        if layer:
            rec.linear("xv", lora["v1"], "t")
            rec.linear("t", lora["v2"], "b")
        rec.linear("xg", lora["g1"], "t", SIGMOID)
        rec.linear("t", lora["g2"], "g")
        rec.dispatch("v7_prepare.wgsl", "main", (rec.C, N, int(layer == 0), off("k"), off("v"), off("w"), off("a"),
                                                 off("b"), off("vfirst")), [rec.act, self.prepare], heads)
        rec.wkv("wkv7.wgsl", (rec.C, N, rec.segment_table, off("r"), off("w"), off("k"), off("v"), off("a"), off("b"),
                              off("y"), *rec.states.at("wkv", layer)), None, (rec.info.n_head, rec.segments))
        rec.dispatch("v7_output.wgsl", "main", (rec.C, N, off("y"), off("r"), off("k"), off("v"), off("g"), GN_EPS),
                     [rec.act, self.out_vecs], heads)
        rec.linear("y", W["output"], "x", accumulate=1)


class ChannelMix7:
    """v7: W_v relu(W_k x)², no receptance gate."""

    def __init__(self, w: LayerWeights, info, up: Uploader):
        self.mix = up.vector(w.vector("ffn.x_k"))
        self.W = projections(up, w, "ffn.", ffn_projections(info.version))

    def record(self, rec: Recorder, layer: int) -> None:
        rec.mix(self.mix, 1)
        rec.linear(mixed(0), self.W["key"], "h", RELU2)
        rec.linear("h", self.W["value"], "x", accumulate=1)


MIXES = {"4": (TimeMix4, ChannelMix4), "5": (TimeMix5, ChannelMix4), "6": (TimeMix6, ChannelMix6),
         "7": (TimeMix7, ChannelMix7)}


class Block:
    """One layer: x += time_mix(ln1(x)); x += channel_mix(ln2(x)), each mix fed the previous
    token's normalised row too (the token shift)."""

    def __init__(self, w: LayerWeights, info, up: Uploader):
        self.layer = w.layer
        self.ln1, self.ln2 = norm_pair(up, w, "ln1"), norm_pair(up, w, "ln2")
        time_mix, channel_mix = MIXES[info.version[0]]
        self.time_mix, self.channel_mix = time_mix(w, info, up), channel_mix(w, info, up)

    def record(self, rec: Recorder) -> None:
        rec.norm("x", "z", self.ln1)
        rec.shift("att_shift", self.layer)
        self.time_mix.record(rec, self.layer)
        rec.norm("x", "z", self.ln2)
        rec.shift("ffn_shift", self.layer)
        self.channel_mix.record(rec, self.layer)

    def matrices(self) -> list[Matrix]:
        """Every weight matrix of the layer, as stored (what its weights cost on the GPU)."""
        found = []
        for mix in (self.time_mix, self.channel_mix):
            for value in vars(mix).values():
                values = value.values() if isinstance(value, dict) else [value]
                found += [m for m in values if isinstance(m, Matrix)]
        return found
