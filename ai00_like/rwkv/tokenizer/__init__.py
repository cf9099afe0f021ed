"""Tokenizers behind one small API: the RWKV World vocabulary and Hugging Face tokenizer.json.

Both expose ``encode(text)``, ``encode_bytes(data)``, ``decode_bytes(ids)``, ``decode(ids)``,
``token_bytes(id)``, ``vocab_size`` and ``eos_id`` (`byte_vocab.ByteVocab`); `StreamDecoder`
turns a stream of ids into text without ever splitting a UTF-8 character. See
docs/background/rwkv-spec.md §8. `find_tokenizer` finds the vocabulary a model brings
(beside it or named in its metadata) and `check_vocabulary` refuses one that does not fit.
"""

from __future__ import annotations

from pathlib import Path

from .byte_vocab import ByteVocab, StreamDecoder
from .discovery import check_vocabulary, find_tokenizer
from .errors import TokenizerError
from .huggingface import HFTokenizer
from .vocab_files import (
    Pairs,
    default_tokenizer_path,
    json_pairs,
    read_text,
    read_world_vocab,
    world_vocab_from_pairs,
    world_vocab_from_txt,
    world_vocab_json,
)
from .world import WorldTokenizer

__all__ = [
    "ByteVocab",
    "HFTokenizer",
    "StreamDecoder",
    "TokenizerError",
    "WorldTokenizer",
    "check_vocabulary",
    "default_tokenizer_path",
    "find_tokenizer",
    "load_tokenizer",
    "read_world_vocab",
    "world_vocab_json",
]


def load_tokenizer(path: str | Path) -> WorldTokenizer | HFTokenizer:
    """Pick the tokenizer by file: .txt is a World vocab; .json is a World vocab when it is an
    ``{"<id>": token}`` map and a Hugging Face tokenizer when it has a "model" key."""
    path = Path(path)
    if path.suffix.lower() == ".txt":
        return WorldTokenizer.from_file(path)
    text = read_text(path)
    if text.lstrip()[:1] != "{":
        if path.suffix.lower() == ".json":
            raise TokenizerError(f"{path}: expected a JSON object")
        return WorldTokenizer(world_vocab_from_txt(text, path), source=str(path))
    pairs = json_pairs(text, path)
    if isinstance(pairs, Pairs) and any(key == "model" for key, _ in pairs):
        return HFTokenizer(path)
    return WorldTokenizer(world_vocab_from_pairs(pairs, path), source=str(path))
