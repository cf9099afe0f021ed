"""Seeded synthetic checkpoints with the exact names and shapes of released models.

Released RWKV weights cannot be downloaded here, so tests and benchmarks build their
models from a seed (rwkv-spec §9). Values are drawn so that activations stay O(1)
through the layers and decays sit in the range trained models use.
"""

from __future__ import annotations

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
    rng = np.random.default_rng(seed)
    C = n_embd
    H = C // head_size if version != "4" else 1
    N = head_size if version != "4" else C
    if version == "7":
        F = ffn or 4 * C
    elif version == "4":
        F = ffn or 4 * C
    else:
        F = ffn or (C * 7 // 2) // 32 * 32
    lora = dict(lora or {})

    def uniform(lo, hi, *shape):
        return rng.uniform(lo, hi, size=shape).astype(np.float32)

    def normal(std, *shape):
        return (rng.standard_normal(size=shape) * std).astype(np.float32)

    def linear(out_dim, in_dim):  # [out, in], std 1/sqrt(in) keeps the output O(1)
        return normal(1.0 / np.sqrt(in_dim), out_dim, in_dim)

    def vec(lo=0.0, hi=1.0):  # a [1,1,C] mix coefficient, stored as released models do
        return uniform(lo, hi, 1, 1, C)

    def norm_pair(prefix: str, dim: int = C):
        return {f"{prefix}.weight": 1.0 + normal(0.1, dim), f"{prefix}.bias": normal(0.1, dim)}

    sd: dict[str, np.ndarray] = {"emb.weight": normal(1.0, vocab, C)}
    sd.update(norm_pair("blocks.0.ln0"))
    for i in range(n_layer):
        b = f"blocks.{i}."
        sd.update(norm_pair(b + "ln1"))
        sd.update(norm_pair(b + "ln2"))
        att, ffn_ = b + "att.", b + "ffn."
        for name in ("receptance", "key", "value", "output"):
            sd[f"{att}{name}.weight"] = linear(C, C)
        sd[ffn_ + "key.weight"] = linear(F, C)
        sd[ffn_ + "value.weight"] = linear(C, F)
        if version != "7":
            sd[ffn_ + "receptance.weight"] = linear(C, C)

        if version == "4":
            for q in "kvr":
                sd[att + f"time_mix_{q}"] = vec()
            sd[att + "time_decay"] = uniform(-4.0, 1.0, C)
            sd[att + "time_first"] = uniform(-1.0, 1.0, C)
            sd[ffn_ + "time_mix_k"] = vec()
            sd[ffn_ + "time_mix_r"] = vec()
        elif version.startswith("5"):
            for q in "kvr":
                sd[att + f"time_mix_{q}"] = vec()
            if version == "5.2":
                sd[att + "time_decay"] = uniform(-6.0, 0.5, H, N)
                sd[att + "time_faaaa"] = uniform(-1.0, 1.0, H, N)
            else:
                sd[att + "time_decay"] = uniform(-6.0, 0.5, H)
                sd[att + "time_first"] = uniform(-1.0, 1.0, H)  # legacy name: u = exp(time_first)
            if version != "5.0":
                sd[att + "time_mix_g"] = vec()
                sd[att + "gate.weight"] = linear(C, C)
            sd.update(norm_pair(att + "ln_x"))
            sd[ffn_ + "time_mix_k"] = vec()
            sd[ffn_ + "time_mix_r"] = vec()
        elif version == "6":
            Dm, Dd = lora.get("mix", 32), lora.get("decay", 64)
            for q in "xwkvrg":
                sd[att + f"time_maa_{q}"] = vec()
            sd[att + "time_maa_w1"] = normal(0.5 / np.sqrt(C), C, 5 * Dm)
            sd[att + "time_maa_w2"] = normal(0.5 / np.sqrt(Dm), 5, Dm, C)
            sd[att + "time_decay"] = uniform(-6.0, 0.5, 1, 1, C)
            sd[att + "time_decay_w1"] = normal(0.5 / np.sqrt(C), C, Dd)
            sd[att + "time_decay_w2"] = normal(0.5 / np.sqrt(Dd), Dd, C)
            sd[att + "time_faaaa"] = uniform(-1.0, 1.0, H, N)
            sd[att + "gate.weight"] = linear(C, C)
            sd.update(norm_pair(att + "ln_x"))
            sd[ffn_ + "time_maa_k"] = vec()
            sd[ffn_ + "time_maa_r"] = vec()
        else:  # v7
            Dw, Da = lora.get("decay", 16), lora.get("a", 16)
            Dv, Dg = lora.get("value", 8), lora.get("gate", 32)
            for q in "rwkvag":
                sd[att + f"x_{q}"] = vec()
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
            sd[att + "r_k"] = normal(0.5, H, N)
            sd.update(norm_pair(att + "ln_x"))
            sd[ffn_ + "x_k"] = vec()
    sd.update(norm_pair("ln_out"))
    sd["head.weight"] = linear(vocab, C) * 2.0  # a peaked distribution: greedy picks are clear
    return sd


def make_state(n_layer: int, n_embd: int, head_size: int, seed: int = 0) -> dict[str, np.ndarray]:
    """A seeded state-tuning file's tensors (`blocks.i.att.time_state`, [H, N, N] value-major)."""
    rng = np.random.default_rng(seed)
    H = n_embd // head_size
    return {
        f"blocks.{i}.att.time_state": (rng.standard_normal((H, head_size, head_size)) * 0.3).astype(np.float32)
        for i in range(n_layer)
    }
