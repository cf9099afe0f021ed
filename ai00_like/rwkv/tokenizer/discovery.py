"""Which vocabulary a model brings with it, and whether a tokenizer fits a model.

A model trained on its own vocabulary (the demo model's 4096 tokens) is useless with the
World vocabulary we ship: every request would fail on an id the model does not have. So a
model without a configured tokenizer looks for its own, in this order:

1. a regular file beside it named after it (its stem), the first of `NAMED_AFTER_MODEL`:
   the explicit "vocab" spellings first, then the bare `<stem>.txt` / `<stem>.json`, which
   are less surely a vocabulary, then Hugging Face's `tokenizer.json` spellings;
2. for safetensors, the file its header's `__metadata__["tokenizer"]` names: a bare file
   name in the model's folder (a downloaded model must not make us read other files).

`check_vocabulary` then refuses, at load, a tokenizer whose ids do not all fit the model.
"""

from __future__ import annotations

from pathlib import Path

from ..errors import ModelFileError
from ..formats.safetensors_header import read_safetensors_metadata
from .byte_vocab import ByteVocab
from .vocab_files import default_tokenizer_path

TOKENIZER_METADATA_KEY = "tokenizer"

NAMED_AFTER_MODEL = (
    "{stem}_vocab.txt",
    "{stem}.vocab.txt",
    "{stem}_vocab.json",
    "{stem}.txt",
    "{stem}.json",
    "{stem}_tokenizer.json",
    "{stem}.tokenizer.json",
)

_SAFETENSORS = (".st", ".safetensors")


def find_tokenizer(model_path: str | Path) -> Path | None:
    """The model's own vocabulary file (see the module docstring), or None when it has none."""
    model = Path(model_path)
    if not model.name:
        return None
    return _named_after(model) or _from_metadata(model)


def _named_after(model: Path) -> Path | None:
    for pattern in NAMED_AFTER_MODEL:
        candidate = model.with_name(pattern.format(stem=model.stem))
        if candidate.name != model.name and candidate.is_file():
            return candidate
    return None


def _from_metadata(model: Path) -> Path | None:
    if model.suffix.lower() not in _SAFETENSORS or not model.is_file():
        return None
    try:
        name = read_safetensors_metadata(model).get(TOKENIZER_METADATA_KEY, "")
    except ModelFileError:
        return None  # the model's own load reports what is wrong with the file
    if not _is_bare_name(name) or name == model.name:
        return None
    candidate = model.with_name(name)
    return candidate if candidate.is_file() else None


def _is_bare_name(name: str) -> bool:
    # Lexically inside the folder: no separator of any platform, no parent, no drive.
    return bool(name) and name not in (".", "..") and not any(c in name for c in "/\\:\0")


def check_vocabulary(tokenizer: ByteVocab, vocab: int, model_name: str | Path, tokenizer_name: str | Path) -> None:
    """Refuse a tokenizer with ids beyond the model's `vocab` rows, in one line saying what to do.

    A smaller tokenizer is fine: models pad their vocabulary (65536 rows for World's 65530 ids)."""
    if tokenizer.vocab_size <= vocab:
        return
    model, used = Path(model_name), Path(tokenizer_name)
    which = " (the RWKV World vocabulary, used when a model brings none)" if _is_world(used) else ""
    raise ValueError(
        f"{model}: the tokenizer {used}{which} does not belong to this model: its ids go up to "
        f"{tokenizer.vocab_size - 1} ({tokenizer.vocab_size} tokens) but the model's vocabulary has {vocab}; "
        f"put the model's own vocabulary beside it as {model.stem}_vocab.txt, or set `tokenizer` in its config "
        "section ([tokenizer] path for [model]; --tokenizer for generate)")


def _is_world(path: Path) -> bool:
    try:
        return path.resolve() == default_tokenizer_path().resolve()
    except OSError:
        return False
