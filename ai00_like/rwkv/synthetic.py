"""Seeded synthetic checkpoints with the exact names and shapes of released models.

Released RWKV weights cannot be downloaded here, so tests and benchmarks build their
models from a seed (rwkv-spec §9). Values are drawn so that activations stay O(1)
through the layers and decays sit in the range trained models use.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from .info import VERSIONS


def make_checkpoint(
    version: str,
    *,
    n_layer: int = 2,
    n_embd: int = 64,
    head_size: int = 32,
    vocab: int = 1000,
    ffn: int | None = None,
    lora: dict[str, int] | None = None,
    seed: int = 0,
) -> dict[str, np.ndarray]:
    """A float32 state dict in the official `.pth` layout of RWKV `version` (see info.VERSIONS)."""
    if version not in VERSIONS:
        raise ValueError(f"unknown RWKV version {version!r}; expected one of {VERSIONS}")
    C = n_embd
    draw = _Draws(seed, C)
    H = C // head_size if version != "4" else 1
    N = head_size if version != "4" else C
    F = ffn or (4 * C if version in ("7", "4") else (C * 7 // 2) // 32 * 32)
    time_mixing = _TIME_MIXING.get(version, _v5_time_mixing)
    sd: dict[str, np.ndarray] = {"emb.weight": draw.normal(1.0, vocab, C)}
    sd.update(draw.norm_pair("blocks.0.ln0"))
    for i in range(n_layer):
        b = f"blocks.{i}."
        sd.update(draw.norm_pair(b + "ln1"))
        sd.update(draw.norm_pair(b + "ln2"))
        att, ffn_ = b + "att.", b + "ffn."
        for name in ("receptance", "key", "value", "output"):
            sd[f"{att}{name}.weight"] = draw.linear(C, C)
        sd[ffn_ + "key.weight"] = draw.linear(F, C)
        sd[ffn_ + "value.weight"] = draw.linear(C, F)
        if version != "7":
            sd[ffn_ + "receptance.weight"] = draw.linear(C, C)
        time_mixing(sd, draw, _Layer(version, att, ffn_, H, N, dict(lora or {})))
    sd.update(draw.norm_pair("ln_out"))
    sd["head.weight"] = draw.linear(vocab, C) * 2.0  # a peaked distribution: greedy picks are clear
    return sd


class _Draws:
    """Seeded float32 tensors, drawn in call order from one generator: the order of the
    calls is the checkpoint's content, so the builders below must keep it."""

    def __init__(self, seed: int, C: int):
        self.rng = np.random.default_rng(seed)
        self.C = C

    def uniform(self, lo, hi, *shape):
        return self.rng.uniform(lo, hi, size=shape).astype(np.float32)

    def normal(self, std, *shape):
        return (self.rng.standard_normal(size=shape) * std).astype(np.float32)

    def linear(self, out_dim, in_dim):  # [out, in], std 1/sqrt(in) keeps the output O(1)
        return self.normal(1.0 / np.sqrt(in_dim), out_dim, in_dim)

    def vec(self, lo=0.0, hi=1.0):  # a [1,1,C] mix coefficient, stored as released models do
        return self.uniform(lo, hi, 1, 1, self.C)

    def norm_pair(self, prefix: str) -> dict[str, np.ndarray]:
        return {f"{prefix}.weight": 1.0 + self.normal(0.1, self.C), f"{prefix}.bias": self.normal(0.1, self.C)}


class _Layer(NamedTuple):
    """What a version's time-mixing tensors of one layer are named and shaped by."""

    version: str
    att: str  # "blocks.{i}.att."
    ffn: str  # "blocks.{i}.ffn."
    H: int
    N: int
    lora: dict[str, int]


def _v4_time_mixing(sd: dict, draw: _Draws, layer: _Layer) -> None:
    att, ffn, C = layer.att, layer.ffn, draw.C
    for q in "kvr":
        sd[att + f"time_mix_{q}"] = draw.vec()
    sd[att + "time_decay"] = draw.uniform(-4.0, 1.0, C)
    sd[att + "time_first"] = draw.uniform(-1.0, 1.0, C)
    sd[ffn + "time_mix_k"] = draw.vec()
    sd[ffn + "time_mix_r"] = draw.vec()


def _v5_time_mixing(sd: dict, draw: _Draws, layer: _Layer) -> None:
    att, ffn, C, H, N = layer.att, layer.ffn, draw.C, layer.H, layer.N
    for q in "kvr":
        sd[att + f"time_mix_{q}"] = draw.vec()
    if layer.version == "5.2":
        sd[att + "time_decay"] = draw.uniform(-6.0, 0.5, H, N)
        sd[att + "time_faaaa"] = draw.uniform(-1.0, 1.0, H, N)
    else:
        sd[att + "time_decay"] = draw.uniform(-6.0, 0.5, H)
        sd[att + "time_first"] = draw.uniform(-1.0, 1.0, H)  # legacy name: u = exp(time_first)
    if layer.version != "5.0":
        sd[att + "time_mix_g"] = draw.vec()
        sd[att + "gate.weight"] = draw.linear(C, C)
    sd.update(draw.norm_pair(att + "ln_x"))
    sd[ffn + "time_mix_k"] = draw.vec()
    sd[ffn + "time_mix_r"] = draw.vec()


def _v6_time_mixing(sd: dict, draw: _Draws, layer: _Layer) -> None:
    att, ffn, C, normal = layer.att, layer.ffn, draw.C, draw.normal
    Dm, Dd = layer.lora.get("mix", 32), layer.lora.get("decay", 64)
    for q in "xwkvrg":
        sd[att + f"time_maa_{q}"] = draw.vec()
    sd[att + "time_maa_w1"] = normal(0.5 / np.sqrt(C), C, 5 * Dm)
    sd[att + "time_maa_w2"] = normal(0.5 / np.sqrt(Dm), 5, Dm, C)
    sd[att + "time_decay"] = draw.uniform(-6.0, 0.5, 1, 1, C)
    sd[att + "time_decay_w1"] = normal(0.5 / np.sqrt(C), C, Dd)
    sd[att + "time_decay_w2"] = normal(0.5 / np.sqrt(Dd), Dd, C)
    sd[att + "time_faaaa"] = draw.uniform(-1.0, 1.0, layer.H, layer.N)
    sd[att + "gate.weight"] = draw.linear(C, C)
    sd.update(draw.norm_pair(att + "ln_x"))
    sd[ffn + "time_maa_k"] = draw.vec()
    sd[ffn + "time_maa_r"] = draw.vec()


def _v7_time_mixing(sd: dict, draw: _Draws, layer: _Layer) -> None:
    att, C, normal, uniform, lora = layer.att, draw.C, draw.normal, draw.uniform, layer.lora
    Dw, Da = lora.get("decay", 16), lora.get("a", 16)
    Dv, Dg = lora.get("value", 8), lora.get("gate", 32)
    for q in "rwkvag":
        sd[att + f"x_{q}"] = draw.vec()
    sd[att + "w0"] = uniform(-6.0, 2.0, 1, 1, C)
    sd[att + "w1"] = normal(0.5 / np.sqrt(C), C, Dw)
    sd[att + "w2"] = normal(1.0 / np.sqrt(Dw), Dw, C)
    sd[att + "a0"] = uniform(-1.0, 1.0, 1, 1, C)
    sd[att + "a1"] = normal(0.5 / np.sqrt(C), C, Da)
    sd[att + "a2"] = normal(1.0 / np.sqrt(Da), Da, C)
    # Released models carry v0/v1/v2 in block 0 too, where they are unused.
    sd[att + "v0"] = uniform(-1.0, 1.0, 1, 1, C)
    sd[att + "v1"] = normal(0.5 / np.sqrt(C), C, Dv)
    sd[att + "v2"] = normal(1.0 / np.sqrt(Dv), Dv, C)
    sd[att + "g1"] = normal(0.5 / np.sqrt(C), C, Dg)
    sd[att + "g2"] = normal(1.0 / np.sqrt(Dg), Dg, C)
    sd[att + "k_k"] = uniform(0.5, 1.5, 1, 1, C)
    sd[att + "k_a"] = uniform(0.0, 1.0, 1, 1, C)
    sd[att + "r_k"] = normal(0.5, layer.H, layer.N)
    sd.update(draw.norm_pair(att + "ln_x"))
    sd[layer.ffn + "x_k"] = draw.vec()


# The tensors each version adds to a layer (5.0, 5.1 and 5.2 share one builder).
_TIME_MIXING = {"4": _v4_time_mixing, "6": _v6_time_mixing, "7": _v7_time_mixing}


def make_state(n_layer: int, n_embd: int, head_size: int, seed: int = 0) -> dict[str, np.ndarray]:
    """A seeded state-tuning file's tensors (`blocks.i.att.time_state`, [H, N, N] value-major)."""
    rng = np.random.default_rng(seed)
    H = n_embd // head_size
    return {
        f"blocks.{i}.att.time_state": (rng.standard_normal((H, head_size, head_size)) * 0.3).astype(np.float32)
        for i in range(n_layer)
    }
