"""Hugging Face tokenizer.json (e.g. the GPT-NeoX 20B tokenizer of RWKV-4 Pile models)."""

from __future__ import annotations

import json
import re
from pathlib import Path

from .byte_vocab import ByteVocab
from .errors import TokenizerError
from .vocab_files import read_text


def _byte_level_alphabet() -> dict[str, int]:
    """GPT-2's byte-level BPE spells each byte as a printable character: bytes that are
    printable in Latin-1 stand for themselves, the others are moved to U+0100 and up."""
    printable = [*range(0x21, 0x7F), *range(0xA1, 0xAD), *range(0xAE, 0x100)]
    moved = [b for b in range(256) if b not in printable]
    alphabet = {chr(b): b for b in printable}
    alphabet.update({chr(0x100 + i): b for i, b in enumerate(moved)})
    return alphabet


def _has_component(spec: object, kind: str) -> bool:
    """Whether a tokenizer.json component (possibly a Sequence of them) contains ``kind``."""
    if isinstance(spec, dict):
        if spec.get("type") == kind:
            return True
        return any(_has_component(v, kind) for v in spec.values() if isinstance(v, (dict, list)))
    if isinstance(spec, list):
        return any(_has_component(v, kind) for v in spec)
    return False


_BYTE_FALLBACK = re.compile(r"<0x([0-9A-Fa-f]{2})>")


class HFTokenizer(ByteVocab):
    """A Hugging Face ``tokenizer.json`` through the ``tokenizers`` package.

    ``decode_bytes`` concatenates per-token bytes so that streaming works token by token. It is
    exact for byte-level BPE vocabularies and for byte-fallback/Metaspace (SentencePiece-style)
    ones; other decoders' post-processing (e.g. WordPiece "##" joins) is not applied.
    Special tokens decode to nothing, as with ``tokenizers``' default ``skip_special_tokens``.
    """

    def __init__(self, path: str | Path, *, eos_id: int = 0):
        from tokenizers import Tokenizer  # imported here: World-only users never need it

        path = Path(path)
        spec = _read_json(path)
        if not isinstance(spec, dict) or "model" not in spec:
            raise TokenizerError(f"{path}: not a Hugging Face tokenizer.json (no \"model\" key)")
        try:
            self._tk = Tokenizer.from_file(str(path))
        except Exception as e:  # tokenizers raises a bare Exception with the parser's message
            raise TokenizerError(f"{path}: cannot load tokenizer.json: {e}") from None
        self.source = str(path)
        self.eos_id = eos_id
        self._byte_level = _has_component(spec.get("decoder"), "ByteLevel") or _has_component(
            spec.get("pre_tokenizer"), "ByteLevel"
        )
        metaspace = _has_component(spec.get("decoder"), "Metaspace") or _has_component(
            spec.get("pre_tokenizer"), "Metaspace"
        )
        byte_fallback = bool(spec["model"].get("byte_fallback"))
        alphabet = _byte_level_alphabet()

        self._bytes: dict[int, bytes] = {}
        for token, tid in self._tk.get_vocab(with_added_tokens=False).items():
            if self._byte_level and all(c in alphabet for c in token):
                raw = bytes(alphabet[c] for c in token)
            elif byte_fallback and (m := _BYTE_FALLBACK.fullmatch(token)):
                raw = bytes([int(m.group(1), 16)])
            else:
                raw = (token.replace("\u2581", " ") if metaspace else token).encode("utf-8")
            self._bytes[tid] = raw
        for added in spec.get("added_tokens") or ():
            # Added tokens are stored as plain text, not in the byte-level alphabet.
            self._bytes[added["id"]] = b"" if added.get("special") else added["content"].encode("utf-8")
        # For encode_bytes: the id of each single byte, when the vocab has them all.
        single = {raw[0]: tid for tid, raw in self._bytes.items() if len(raw) == 1}
        self._byte_ids = single if self._byte_level and len(single) == 256 else None

    @classmethod
    def from_file(cls, path: str | Path, *, eos_id: int = 0) -> HFTokenizer:
        return cls(path, eos_id=eos_id)

    def encode(self, text: str) -> list[int]:
        return self._tk.encode(text, add_special_tokens=False).ids

    def encode_bytes(self, data: bytes) -> list[int]:
        data = bytes(data)
        try:
            return self.encode(data.decode("utf-8"))
        except UnicodeDecodeError:
            pass
        if self._byte_ids is None:
            raise TokenizerError(f"{self.source}: this tokenizer cannot encode bytes that are not valid UTF-8")
        # Valid stretches go through the tokenizer; each invalid byte becomes its byte token.
        out: list[int] = []
        for part in re.split("([\udc80-\udcff]+)", data.decode("utf-8", "surrogateescape")):
            if part and "\udc80" <= part[0] <= "\udcff":
                out.extend(self._byte_ids[ord(c) - 0xDC00] for c in part)
            elif part:
                out.extend(self.encode(part))
        return out


def _read_json(path: Path) -> object:
    text = read_text(path)
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise TokenizerError(f"{path}:{e.lineno}: invalid JSON: {e.msg}") from None


# ---------------------------------------------------------------------------------------------
