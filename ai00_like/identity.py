"""The identity of a model's weights, the same on every machine that holds the same files.

Replicas share stored RNN states (response_store), and a state is only right for the
weights that made it. The identity must therefore follow the files' content, not where
they lie: the same model under /data/models on one machine and /srv/rwkv on another is
one model. Hashing whole files of several GB at every load would slow every start, so a
file is known by its name, its size and a SHA-256 of its first and last MiB: different
weights of one architecture share a size, but not those bytes (the header holds the
tensor layout; the ends hold different weights). Computed once per load, in the loading
thread.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

from .messages import ModelInfoEvent, ModelSpec

EDGE = 1 << 20  # bytes hashed at each end of a file


def file_identity(path: str | Path) -> str:
    """`name:size:sha256(first MiB + last MiB)`; OSError when the file cannot be read."""
    path = Path(path)
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        digest.update(f.read(EDGE))
        if size > EDGE:
            f.seek(max(EDGE, size - EDGE))
            digest.update(f.read(EDGE))
    return f"{path.name}:{size}:{digest.hexdigest()}"


def weights_identity(spec: ModelSpec) -> str:
    """The model file, its LoRAs (with their alphas) and its initial states, by content."""
    parts = [file_identity(spec.path)]
    parts += [f"lora={file_identity(lora.path)}@{lora.alpha}" for lora in spec.loras]
    parts += [f"state={file_identity(s.path)}#{s.id}{'*' if s.default else ''}" for s in spec.states]
    return "|".join(parts)


def fingerprint(model: ModelInfoEvent) -> str:
    """Changes when the weights or the engine settings behind the same model id change.

    The same on every replica serving the same files wherever they lie, so that replicas
    sharing a response store use each other's states (and never another model's)."""
    spec = model.spec
    weights = model.identity or f"{spec.path}|{spec.loras}|{spec.states}"
    key = f"{weights}|{model.info}"
    return "fp_" + hashlib.sha1(key.encode()).hexdigest()[:10]
