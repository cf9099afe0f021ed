"""The synthetic checkpoints on which our engine is compared with the reference package."""

from __future__ import annotations

import numpy as np

PROMPT_TOKENS = 100
GREEDY_STEPS = 64

# name → (version, make_checkpoint keyword arguments). Head sizes 32 and 64, vocabularies
# other than 65536, several depths and widths.
CASES = {
    "v4-L2-D64": ("4", dict(n_layer=2, n_embd=64, vocab=1000, seed=40)),
    "v4-L3-D96": ("4", dict(n_layer=3, n_embd=96, vocab=777, seed=41)),
    "v5.0-L2-D64-N32": ("5.0", dict(n_layer=2, n_embd=64, head_size=32, vocab=1000, seed=50)),
    "v5.1-L2-D64-N32": ("5.1", dict(n_layer=2, n_embd=64, head_size=32, vocab=1000, seed=51)),
    "v5.2-L2-D64-N32": ("5.2", dict(n_layer=2, n_embd=64, head_size=32, vocab=1000, seed=52)),
    "v5.2-L3-D128-N64": ("5.2", dict(n_layer=3, n_embd=128, head_size=64, vocab=777, seed=53)),
    "v6-L2-D64-N32": ("6", dict(n_layer=2, n_embd=64, head_size=32, vocab=1000, seed=60)),
    "v6-L3-D128-N64": ("6", dict(n_layer=3, n_embd=128, head_size=64, vocab=777, seed=61)),
    "v7-L2-D64-N32": ("7", dict(n_layer=2, n_embd=64, head_size=32, vocab=1000, seed=70)),
    "v7-L3-D128-N64": ("7", dict(n_layer=3, n_embd=128, head_size=64, vocab=777, seed=71)),
    "v7-L4-D128-N32": ("7", dict(n_layer=4, n_embd=128, head_size=32, vocab=1000, seed=72)),
}


def prompt_for(name: str, vocab: int) -> list[int]:
    seed = sum(map(ord, name))
    return np.random.default_rng(seed).integers(1, vocab, PROMPT_TOKENS).tolist()
