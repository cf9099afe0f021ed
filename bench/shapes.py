"""The seeded RWKV-7 shapes the benchmarks run (engine.py, load_memory.py), and their bf16
checkpoints, made once in bench/.cache as RWKV models are released."""

from __future__ import annotations

from pathlib import Path

CACHE = Path(__file__).resolve().parent / ".cache"
SHAPES = {
    "quick": dict(n_layer=4, n_embd=256, head_size=64, vocab=65536, lora=dict(decay=32, a=32, value=16, gate=64)),
    "0.1B": dict(n_layer=12, n_embd=768, head_size=64, vocab=65536, lora=dict(decay=64, a=64, value=32, gate=128)),
    "0.4B": dict(n_layer=24, n_embd=1024, head_size=64, vocab=65536, lora=dict(decay=64, a=64, value=32, gate=128)),
    "1.5B": dict(n_layer=24, n_embd=2048, head_size=64, vocab=65536, lora=dict(decay=96, a=96, value=64, gate=256)),
}


def bf16_checkpoint(shape: str, n_layer: int | None = None) -> Path:
    """The seeded bf16 `.pth` of `shape` (made once), or of its first `n_layer` layers."""
    from ai00_like.rwkv.formats.pth import write_pth
    from ai00_like.rwkv.synthetic import make_checkpoint

    dims = dict(SHAPES[shape], **({"n_layer": n_layer} if n_layer else {}))
    path = CACHE / f"v7-{shape}{f'-L{n_layer}' if n_layer else ''}-seed1-bf16.pth"
    if not path.exists():
        CACHE.mkdir(exist_ok=True)
        write_pth(make_checkpoint("7", seed=1, **dims), path, "bf16")
    return path
