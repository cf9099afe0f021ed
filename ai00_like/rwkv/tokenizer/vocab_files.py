"""RWKV World vocabulary files: the rwkv package's .txt and web-rwkv's .json (rwkv-spec §8).

.txt:  one token per line, "<id> <python str or bytes literal> <byte length>"; the literal may
       contain spaces, so the fields are split at the first and the last space.
.json: web-rwkv's {"<id>": "text" | [byte, ...]}.
Id 0 is end-of-text and is never in the file.
"""

from __future__ import annotations

import ast
import json
from collections.abc import Mapping
from pathlib import Path

from ...assets import assets_root
from .errors import TokenizerError

WORLD_VOCAB_NAME = "rwkv_vocab_v20230424"


def default_tokenizer_path() -> Path:
    """The shipped RWKV World vocabulary (``assets/tokenizer/rwkv_vocab_v20230424.txt``)."""
    return assets_root() / "tokenizer" / f"{WORLD_VOCAB_NAME}.txt"


def read_world_vocab(path: str | Path) -> dict[int, bytes]:
    """Read a World vocab file (.txt or .json, by extension or content) into ``{id: bytes}``."""
    path = Path(path)
    text = read_text(path)
    if path.suffix.lower() == ".json" or text.lstrip()[:1] == "{":
        return _world_vocab_from_json(text, path)
    return world_vocab_from_txt(text, path)


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


def read_text(path: Path) -> str:
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


def world_vocab_from_txt(text: str, path: Path) -> dict[int, bytes]:
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


class Pairs(list):
    """A JSON object as its (key, value) pairs: the World format must reject duplicate ids,
    which json.loads would silently merge into a dict."""


def json_pairs(text: str, path: Path) -> object:
    try:
        return json.loads(text, object_pairs_hook=Pairs)
    except json.JSONDecodeError as e:
        raise TokenizerError(f"{path}:{e.lineno}: invalid JSON: {e.msg}") from None


def _world_vocab_from_json(text: str, path: Path) -> dict[int, bytes]:
    return world_vocab_from_pairs(json_pairs(text, path), path)


def world_vocab_from_pairs(pairs: object, path: Path) -> dict[int, bytes]:
    if not isinstance(pairs, Pairs):
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
