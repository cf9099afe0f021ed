"""Model version and size detection from tensor names and shapes alone (rwkv-spec §1.3).

Works on a mapping of official tensor names to shapes, so it can describe a file
from its header without reading the weights (the models list of the API does that).
"""

from __future__ import annotations

import re
from collections.abc import Mapping

import msgspec

from .errors import ModelFileError

VERSIONS = ("4", "5.0", "5.1", "5.2", "6", "7")

# v7 variants with extra tensors that change the math; refuse rather than run them wrongly.
_UNSUPPORTED_V7 = {
    "ffn.s_emb.weight": "a v7 'DeepEmbed' checkpoint",
    "ffn.s0": "a v7 'DeepEmbed' checkpoint",
}


class ModelInfo(msgspec.Struct, frozen=True):
    version: str  # one of VERSIONS
    n_layer: int
    n_embd: int  # C
    n_head: int  # H (v4: 1, it has no heads)
    head_size: int  # N (v4: C)
    vocab: int  # rows of emb.weight
    ffn: int  # F
    dim_att: int
    # LoRA ranks of v6 (mix, decay) and v7 (decay, a, value, gate); 0 where absent.
    lora: dict[str, int] = msgspec.field(default_factory=dict)

    @property
    def state_floats_per_layer(self) -> int:
        if self.version == "4":
            return 5 * self.n_embd
        return 2 * self.n_embd + self.n_head * self.head_size * self.head_size


_BLOCK = re.compile(r"^blocks\.(\d+)\.")


def detect(shapes: Mapping[str, tuple[int, ...]], path: str | None = None) -> ModelInfo:
    """Tell version and sizes from official tensor names → shapes."""

    def need(name: str) -> tuple[int, ...]:
        if name not in shapes:
            raise ModelFileError(path, f"not an RWKV checkpoint: tensor '{name}' is missing")
        return tuple(shapes[name])

    layers = [int(m.group(1)) for k in shapes if (m := _BLOCK.match(k))]
    if not layers:
        raise ModelFileError(path, "not an RWKV checkpoint: no 'blocks.N.' tensors")
    n_layer = max(layers) + 1
    vocab, n_embd = need("emb.weight")
    need("head.weight")
    dim_att = need("blocks.0.att.key.weight")[0]
    ffn = need("blocks.0.ffn.key.weight")[0]
    names = set(shapes)

    def has(suffix: str) -> bool:
        return any(k.endswith(suffix) for k in names)

    lora: dict[str, int] = {}
    if "blocks.0.att.r_k" in names or "blocks.0.att.x_r" in names:
        for suffix, what in _UNSUPPORTED_V7.items():
            if has(suffix):
                raise ModelFileError(path, f"unsupported model: {what}")
        version = "7"
        n_head, head_size = need("blocks.0.att.r_k")
        lora = {
            "decay": need("blocks.0.att.w1")[1],
            "a": need("blocks.0.att.a1")[1],
            "value": need(f"blocks.{min(1, n_layer - 1)}.att.v1")[1],
            "gate": need("blocks.0.att.g1")[1],
        }
    elif has("att.time_maa_x"):
        version = "6"
        n_head = need("blocks.0.att.time_faaaa")[0]
        head_size = dim_att // n_head
        lora = {
            "mix": need("blocks.0.att.time_maa_w1")[1] // 5,
            "decay": need("blocks.0.att.time_decay_w1")[1],
        }
    elif has("att.ln_x.weight"):
        decay = need("blocks.0.att.time_decay")
        n_head = decay[0]
        head_size = dim_att // n_head
        if "blocks.0.att.gate.weight" not in names:
            version = "5.0"
        elif len(decay) > 1 and decay[1] > 1:
            version = "5.2"
        else:
            version = "5.1"
    else:
        for name in ("att.time_mix_k", "att.time_decay", "att.time_first"):
            need(f"blocks.0.{name}")
        version = "4"
        n_head, head_size = 1, dim_att
    if n_head * head_size != dim_att or dim_att != n_embd:
        raise ModelFileError(
            path, f"unsupported shapes: n_embd {n_embd}, dim_att {dim_att}, {n_head} heads of {head_size}"
        )
    return ModelInfo(
        version=version,
        n_layer=n_layer,
        n_embd=n_embd,
        n_head=n_head,
        head_size=head_size,
        vocab=vocab,
        ffn=ffn,
        dim_att=dim_att,
        lora=lora,
    )
