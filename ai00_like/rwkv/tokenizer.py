"""Tokenizers behind one small API: the RWKV World vocabulary and Hugging Face tokenizer.json.

Both expose ``encode(text)``, ``encode_bytes(data)``, ``decode_bytes(ids)``, ``decode(ids)``,
``token_bytes(id)``, ``vocab_size`` and ``eos_id``; :class:`StreamDecoder` turns a stream of ids
into text without ever splitting a UTF-8 character. See rwkv-spec.md §8.
"""

from __future__ import annotations

import ast
import codecs
import json
import re
from collections.abc import Iterable, Mapping
from pathlib import Path

__all__ = [
    "TokenizerError",
    "WorldTokenizer",
    "HFTokenizer",
    "StreamDecoder",
    "load_tokenizer",
    "default_tokenizer_path",
    "read_world_vocab",
    "world_vocab_json",
]

WORLD_VOCAB_NAME = "rwkv_vocab_v20230424"


class TokenizerError(ValueError):
    """A tokenizer file is missing or malformed; the message names the file (and line)."""


def default_tokenizer_path() -> Path:
    """The shipped RWKV World vocabulary (``assets/tokenizer/rwkv_vocab_v20230424.txt``)."""
    return Path(__file__).resolve().parents[2] / "assets" / "tokenizer" / f"{WORLD_VOCAB_NAME}.txt"


# ---------------------------------------------------------------------------------------------
# World vocabulary files
#
# .txt:  one token per line, "<id> <python str or bytes literal> <byte length>"; the literal may
#        contain spaces, so the fields are split at the first and the last space.
# .json: web-rwkv's {"<id>": "text" | [byte, ...]}.
# Id 0 is end-of-text and is never in the file.


def read_world_vocab(path: str | Path) -> dict[int, bytes]:
    """Read a World vocab file (.txt or .json, by extension or content) into ``{id: bytes}``."""
    path = Path(path)
    text = _read_text(path)
    if path.suffix.lower() == ".json" or text.lstrip()[:1] == "{":
        return _world_vocab_from_json(text, path)
    return _world_vocab_from_txt(text, path)


def world_vocab_json(tokens: Mapping[int, bytes]) -> str:
    """Render ``{id: bytes}`` in web-rwkv's JSON format, one token per line, ids ascending."""
    lines = []
    for tid in sorted(tokens):
        raw = tokens[tid]
        try:
            value: str | list[int] = raw.decode("utf-8")
        except UnicodeDecodeError:
            value = list(raw)
        lines.append(f'"{tid}": {json.dumps(value, ensure_ascii=False)}')
    return "{\n" + ",\n".join(lines) + "\n}\n"


def _read_text(path: Path) -> str:
    try:
        # newline="" keeps "\r" so we split lines ourselves: str.splitlines() would also split
        # on U+2028 and friends, which a literal could in principle contain.
        with open(path, encoding="utf-8", newline="") as f:
            return f.read()
    except FileNotFoundError:
        raise TokenizerError(f"{path}: tokenizer file not found") from None
    except (OSError, UnicodeDecodeError) as e:
        raise TokenizerError(f"{path}: cannot read tokenizer file: {e}") from None


def _parse_literal(lit: str) -> str | bytes:
    # Most lines are plain quoted text; skipping literal_eval for them makes loading ~3x faster.
    # Without a backslash and without the quote character inside, a quoted literal is verbatim.
    q = lit[:1]
    if len(lit) >= 2 and q in "'\"" and lit[-1] == q and "\\" not in lit and q not in lit[1:-1]:
        return lit[1:-1]
    return ast.literal_eval(lit)  # never eval(): the file is data


def _world_vocab_from_txt(text: str, path: Path) -> dict[int, bytes]:
    tokens: dict[int, bytes] = {}
    for lineno, line in enumerate(text.split("\n"), 1):
        line = line.rstrip("\r")
        if not line.strip():
            continue
        where = f"{path}:{lineno}"
        first, last = line.find(" "), line.rfind(" ")
        if first <= 0 or last == first:
            raise TokenizerError(f"{where}: expected '<id> <literal> <byte length>', got {line!r}")
        try:
            tid = int(line[:first])
            length = int(line[last + 1 :])
        except ValueError:
            raise TokenizerError(f"{where}: id and byte length must be integers: {line!r}") from None
        try:
            value = _parse_literal(line[first + 1 : last])
        except (ValueError, SyntaxError, MemoryError, RecursionError) as e:
            raise TokenizerError(f"{where}: bad token literal ({e}): {line!r}") from None
        if isinstance(value, str):
            value = _utf8(value, where)
        elif not isinstance(value, bytes):
            raise TokenizerError(f"{where}: token literal is a {type(value).__name__}, not str or bytes")
        if len(value) != length:
            raise TokenizerError(f"{where}: token is {len(value)} bytes but the line says {length}")
        _add_token(tokens, tid, value, where)
    return tokens


class _Pairs(list):
    """A JSON object as its (key, value) pairs: the World format must reject duplicate ids,
    which json.loads would silently merge into a dict."""


def _json_pairs(text: str, path: Path) -> object:
    try:
        return json.loads(text, object_pairs_hook=_Pairs)
    except json.JSONDecodeError as e:
        raise TokenizerError(f"{path}:{e.lineno}: invalid JSON: {e.msg}") from None


def _world_vocab_from_json(text: str, path: Path) -> dict[int, bytes]:
    return _world_vocab_from_pairs(_json_pairs(text, path), path)


def _world_vocab_from_pairs(pairs: object, path: Path) -> dict[int, bytes]:
    if not isinstance(pairs, _Pairs):
        raise TokenizerError(f'{path}: expected a JSON object {{"<id>": token, ...}}')
    tokens: dict[int, bytes] = {}
    for key, value in pairs:
        where = f"{path}: id {key!r}"
        try:
            tid = int(key)
        except ValueError:
            raise TokenizerError(f"{where}: ids must be integers") from None
        if isinstance(value, str):
            raw = _utf8(value, where)
        elif isinstance(value, list) and all(type(x) is int and 0 <= x < 256 for x in value):
            raw = bytes(value)
        else:
            raise TokenizerError(f"{where}: token must be a string or a list of bytes (0..255)")
        _add_token(tokens, tid, raw, where)
    return tokens


def _utf8(value: str, where: str) -> bytes:
    try:
        return value.encode("utf-8")
    except UnicodeEncodeError:
        raise TokenizerError(f"{where}: token text contains a lone surrogate") from None


def _add_token(tokens: dict[int, bytes], tid: int, raw: bytes, where: str) -> None:
    if tid <= 0:
        raise TokenizerError(f"{where}: id {tid} is not allowed (0 is end-of-text, ids start at 1)")
    if tid in tokens:
        raise TokenizerError(f"{where}: duplicate id {tid}")
    if not raw:
        raise TokenizerError(f"{where}: empty token")
    tokens[tid] = raw


# ---------------------------------------------------------------------------------------------
# World tokenizer: greedy longest match over bytes (not BPE), identical to the reference
# TRIE_TOKENIZER of the rwkv package.
#
# Speed in pure Python comes from two layers:
# * a trie of nested dicts, walked one byte at a time from each token start (the walk has to
#   go on until the trie runs out, since a longer token may follow a non-token prefix);
# * a cache of short ASCII pieces (words, numbers, punctuation, whitespace runs). A piece's
#   tokens are cached only when they provably do not depend on what follows: no token started
#   inside the piece can reach past its end. That depends on the next byte only, so the cache
#   key is the piece plus that byte. Everything else (CJK, emoji, invalid bytes, long runs)
#   goes through the trie walk in full context, so the result is always exact.

# Every byte falls in exactly one class, so the pieces cover the input without gaps.
_PIECES = re.compile(rb" ?[A-Za-z]+| ?[0-9]+| ?[^\sA-Za-z0-9\x80-\xff]+|\s+|[\x80-\xff]+")
_MAX_CACHED_PIECE = 32  # longer pieces are rare repeats; they would only bloat the cache
_CACHE_LIMIT = 1 << 16  # entries; cleared when full, refilled by the text at hand
_TOKEN = -1  # trie key of a node's token id (byte keys are 0..255)


class WorldTokenizer:
    """RWKV World tokenizer over a ``{id: token bytes}`` vocabulary (id 0 = end-of-text)."""

    eos_id = 0

    def __init__(self, tokens: Mapping[int, bytes], *, source: str = "<vocab>"):
        by_bytes: dict[bytes, int] = {}
        for tid, raw in tokens.items():
            if type(tid) is not int or tid <= 0 or type(raw) is not bytes or not raw:
                raise TokenizerError(f"{source}: bad token {tid!r}: {raw!r} (ids > 0, non-empty bytes)")
            # Same bytes under two ids: the later one wins, as in the reference.
            by_bytes[raw] = tid
        missing = [b for b in range(256) if bytes([b]) not in by_bytes]
        if missing:
            shown = ", ".join(f"0x{b:02x}" for b in missing[:8]) + (", ..." if len(missing) > 8 else "")
            raise TokenizerError(
                f"{source}: no single-byte token for {len(missing)} byte value(s) ({shown}); "
                "every byte 0x00-0xff needs one so that any input can be encoded"
            )
        self.source = source
        self._bytes: dict[int, bytes] = dict(tokens)
        self._vocab_size = max(self._bytes) + 1
        self._root = self._build_trie(by_bytes)
        self._cache: dict[bytes, tuple[int, ...] | bool] = {}

    @staticmethod
    def _build_trie(by_bytes: Mapping[bytes, int]) -> dict[int, dict]:
        """Trie node = {byte: child node, ..., -1: token id if the path so far is a token}."""
        # Plain dicts keep the GC's work small: leaves hold only ints and are not tracked.
        root: dict[int, dict] = {}
        for raw, tid in by_bytes.items():
            node = root
            for byte in raw:
                child = node.get(byte)
                if child is None:
                    child = node[byte] = {}
                node = child
            node[_TOKEN] = tid
        return root

    @classmethod
    def from_file(cls, path: str | Path) -> WorldTokenizer:
        """Load a World vocab in the .txt format of the rwkv package or web-rwkv's .json."""
        return cls(read_world_vocab(path), source=str(path))

    @property
    def vocab_size(self) -> int:
        """Largest id + 1 (65530 for the World vocab; models pad their embedding to 65536)."""
        return self._vocab_size

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes of one token; b"" for end-of-text (0) and for ids with no token."""
        return self._bytes.get(token_id, b"")

    def encode(self, text: str) -> list[int]:
        return self.encode_bytes(text.encode("utf-8"))

    def encode_bytes(self, data: bytes) -> list[int]:
        data = bytes(data)
        n = len(data)
        out: list[int] = []
        cache = self._cache
        walk = self._walk
        pos = 0  # where the next token starts
        start = 0  # where the current piece starts
        for piece in _PIECES.findall(data):
            end = start + len(piece)
            if pos == start and end < n:
                key = data[start : end + 1]
                ids = cache.get(key)
                if ids is None and piece[0] < 0x80 and end - start <= _MAX_CACHED_PIECE:
                    ids = self._learn(key)
                if ids:
                    out.extend(ids)
                    pos = start = end
                    continue
            if pos < end:  # a token may have run past this piece already
                pos = walk(data, pos, end, out)
            start = end
        return out

    def decode_bytes(self, ids: Iterable[int]) -> bytes:
        get = self._bytes.get
        return b"".join([get(i, b"") for i in ids])

    def decode(self, ids: Iterable[int]) -> str:
        return self.decode_bytes(ids).decode("utf-8", errors="replace")

    def _walk(self, data: bytes, pos: int, stop: int, out: list[int]) -> int:
        """Append the greedy tokens of ``data`` from ``pos`` until reaching ``stop``; return
        where the last token ended (``>= stop``)."""
        root = self._root
        n = len(data)
        while pos < stop:
            node = root
            j = pos
            tid = -1
            end = pos
            while j < n:
                node = node.get(data[j])
                if node is None:
                    break
                j += 1
                here = node.get(_TOKEN)
                if here is not None:
                    tid = here
                    end = j
            out.append(tid)  # tid >= 0: every single byte is a token
            pos = end
        return pos

    def _learn(self, key: bytes) -> tuple[int, ...] | bool:
        """Tokens of the piece ``key[:-1]`` if they cannot depend on the text after it
        (``key[-1]`` is the next byte), else False; the answer is cached either way."""
        # The greedy walk over the piece alone, except that each walk may look at the next
        # byte: if one gets that far, a longer token could cross the piece end in context.
        root = self._root
        last = len(key) - 1
        ids: list[int] = []
        pos = 0
        result: tuple[int, ...] | bool = False
        while pos < last:
            node = root
            j = pos
            tid = -1
            end = pos
            while j <= last:
                node = node.get(key[j])
                if node is None:
                    break
                j += 1
                here = node.get(_TOKEN)
                if here is not None:
                    tid = here
                    end = j
            if j > last:
                break
            ids.append(tid)
            pos = end
        else:
            result = tuple(ids)
        if len(self._cache) >= _CACHE_LIMIT:
            self._cache.clear()
        self._cache[key] = result
        return result


# ---------------------------------------------------------------------------------------------
# Hugging Face tokenizer.json (e.g. the GPT-NeoX 20B tokenizer of RWKV-4 Pile models)


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


class HFTokenizer:
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
        ids = list(self._bytes)
        self._vocab_size = max(ids) + 1 if ids else 0
        # For encode_bytes: the id of each single byte, when the vocab has them all.
        single = {raw[0]: tid for tid, raw in self._bytes.items() if len(raw) == 1}
        self._byte_ids = single if self._byte_level and len(single) == 256 else None

    @classmethod
    def from_file(cls, path: str | Path, *, eos_id: int = 0) -> HFTokenizer:
        return cls(path, eos_id=eos_id)

    @property
    def vocab_size(self) -> int:
        return self._vocab_size

    def token_bytes(self, token_id: int) -> bytes:
        return self._bytes.get(token_id, b"")

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

    def decode_bytes(self, ids: Iterable[int]) -> bytes:
        get = self._bytes.get
        return b"".join([get(i, b"") for i in ids])

    def decode(self, ids: Iterable[int]) -> str:
        return self.decode_bytes(ids).decode("utf-8", errors="replace")


def _read_json(path: Path) -> object:
    text = _read_text(path)
    try:
        return json.loads(text)
    except json.JSONDecodeError as e:
        raise TokenizerError(f"{path}:{e.lineno}: invalid JSON: {e.msg}") from None


# ---------------------------------------------------------------------------------------------


def load_tokenizer(path: str | Path) -> WorldTokenizer | HFTokenizer:
    """Pick the tokenizer by file: .txt is a World vocab; .json is a World vocab when it is an
    ``{"<id>": token}`` map and a Hugging Face tokenizer when it has a "model" key."""
    path = Path(path)
    if path.suffix.lower() == ".txt":
        return WorldTokenizer.from_file(path)
    text = _read_text(path)
    if text.lstrip()[:1] != "{":
        if path.suffix.lower() == ".json":
            raise TokenizerError(f"{path}: expected a JSON object")
        return WorldTokenizer(_world_vocab_from_txt(text, path), source=str(path))
    pairs = _json_pairs(text, path)
    if isinstance(pairs, _Pairs) and any(key == "model" for key, _ in pairs):
        return HFTokenizer(path)
    return WorldTokenizer(_world_vocab_from_pairs(pairs, path), source=str(path))


class StreamDecoder:
    """Turns token ids into text as they arrive, never splitting a UTF-8 character.

    A token may end in the middle of a character; its bytes are held until the character is
    complete. Bytes that can no longer become valid UTF-8 come out as U+FFFD.
    """

    def __init__(self, tokenizer: WorldTokenizer | HFTokenizer):
        self._token_bytes = tokenizer.token_bytes
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, token_id: int) -> str:
        """The text completed by this token (possibly "")."""
        return self._decoder.decode(self._token_bytes(token_id))

    def flush(self) -> str:
        """Whatever is still held at the end of the stream (an incomplete tail → U+FFFD)."""
        return self._decoder.decode(b"", final=True)
