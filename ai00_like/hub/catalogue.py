"""The catalogue of released models (catalogue.toml, shipped in the package) and what a
name given to `pull` means: an alias of the catalogue, or REPO/FILE on the hub."""

from __future__ import annotations

import tomllib
from pathlib import Path

import msgspec

from ..rwkv.memory import HEADROOM

CATALOGUE = Path(__file__).resolve().parent / "catalogue.toml"

# What the numpy backend keeps of a bf16 release, as a share of the file: the matrices at
# 2 bytes (bf16), 1 + 1/64 (Int8) or 1/2 + 1/32 (NF4) a weight, the head staying bf16.
# (Measured on the 1.5B shape by bench/load_memory.py: 0.95, 0.56 and 0.37 of the file.)
KEPT_SHARE = {"bf16": 1.0, "int8": 0.6, "nf4": 0.4}


class Model(msgspec.Struct, frozen=True):
    alias: str
    repo: str
    file: str
    params: str
    size: int
    thinking: str

    def recommended(self, available: int | None) -> str | None:
        """The finest precision whose resident size fits in `available` bytes (None when
        unknown: bf16, the file's own); None when nothing fits."""
        if available is None:
            return "bf16"
        for precision, share in KEPT_SHARE.items():
            if self.size * share + HEADROOM <= available:
                return precision
        return None


class Catalogue(msgspec.Struct, frozen=True):
    model: list[Model]


def load_catalogue(path: Path = CATALOGUE) -> list[Model]:
    return msgspec.convert(tomllib.loads(path.read_text(encoding="utf-8")), Catalogue).model


class UnknownModel(ValueError):
    pass


def resolve(name: str, models: list[Model] | None = None) -> tuple[str, str, Model | None]:
    """(repo, file in it, catalogue entry or None) for an alias or an `owner/repo/file` name."""
    models = load_catalogue() if models is None else models
    for model in models:
        if name in (model.alias, model.file, f"{model.repo}/{model.file}"):
            return model.repo, model.file, model
    parts = name.split("/")
    if len(parts) >= 3 and all(parts):
        return "/".join(parts[:2]), "/".join(parts[2:]), None
    aliases = ", ".join(m.alias for m in models)
    raise UnknownModel(f"unknown model '{name}': give an alias ({aliases}) or REPO/FILE, such as "
                       f"BlinkDL/rwkv7-g1/{models[0].file}")
