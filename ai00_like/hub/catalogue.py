"""The catalogue of released models (catalogue.toml, shipped in the package) and what a
name given to `pull` means: an alias of the catalogue, or REPO/FILE on the hub. A REPO/FILE
name is checked before the hub is asked: it becomes a path on the hub's host (with HF_TOKEN)
and a file name in the models folder, so `..`, `.` and empty segments, backslashes, absolute
paths, URLs and control characters are refused."""

from __future__ import annotations

import re
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


class InvalidName(UnknownModel):
    """A name that can be no file of the hub; an UnknownModel, so that whoever refuses an
    unknown name refuses it the same way."""


# The hub's own rule for each half of a repository id (huggingface_hub's validate_repo_id):
# word characters, '-' and '.', beginning and ending with a word character.
_REPO_PART = re.compile(r"^\w(?:[\w.-]*\w)?$", re.ASCII)
_SCHEME = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*:")
_DRIVE = re.compile(r"^[A-Za-z]:[\\/]")


def resolve(name: str, models: list[Model] | None = None) -> tuple[str, str, Model | None]:
    """(repo, file in it, catalogue entry or None) for an alias or an `owner/repo/file` name.
    Raises UnknownModel; InvalidName (an UnknownModel too) for a name that can be no file of the hub."""
    models = load_catalogue() if models is None else models
    for model in models:
        if name in (model.alias, model.file, f"{model.repo}/{model.file}"):
            return model.repo, model.file, model
    example = f"{models[0].repo}/{models[0].file}"
    _check_name(name, example)
    parts = name.split("/")
    if len(parts) >= 3:
        return "/".join(parts[:2]), "/".join(parts[2:]), None
    aliases = ", ".join(m.alias for m in models)
    raise UnknownModel(f"unknown model '{name}': give an alias ({aliases}) or REPO/FILE, such as {example}")


def _check_name(name: str, example: str) -> None:
    """Raise InvalidName when `name` could reach another path of the hub's host (`..`, an
    absolute path, a URL) or another file than the folder's own: each reason in one line."""
    why = _why_invalid(name)
    if why:
        raise InvalidName(f"model name {name!r} {why}: give an alias or OWNER/REPO/FILE, such as {example}")


def _why_invalid(name: str) -> str | None:
    if any(ord(c) < 32 or ord(c) == 127 for c in name):
        return "has a control character"
    if name.startswith("/") or _DRIVE.match(name):
        return "is an absolute path"
    if "://" in name or _SCHEME.match(name):
        return "is a URL, not a file of the hub (HF_ENDPOINT picks the hub)"
    if "\\" in name:
        return "has a backslash (segments are separated by '/')"
    segments = name.split("/")
    if len(segments) > 1 and "" in segments:
        return "has an empty segment ('//', or '/' at an end)"
    if "." in segments or ".." in segments:
        return "has a '.' or '..' segment"
    if len(segments) >= 2 and not all(_REPO_PART.match(p) and "--" not in p and ".." not in p for p in segments[:2]):
        return "does not begin with a repository id (OWNER/REPO: letters, digits, '_', '-', '.')"
    return None
