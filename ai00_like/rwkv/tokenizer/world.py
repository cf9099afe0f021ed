"""World tokenizer: greedy longest match over bytes (not BPE), identical to the reference
TRIE_TOKENIZER of the rwkv package.

Speed in pure Python comes from two layers:
* a trie of nested dicts, walked one byte at a time from each token start (the walk has to
  go on until the trie runs out, since a longer token may follow a non-token prefix);
* a cache of short ASCII pieces (words, numbers, punctuation, whitespace runs). A piece's
  tokens are cached only when they provably do not depend on what follows: no token started
  inside the piece can reach past its end. That depends on the next byte only, so the cache
  key is the piece plus that byte. Everything else (CJK, emoji, invalid bytes, long runs)
  goes through the trie walk in full context, so the result is always exact.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from pathlib import Path

from .byte_vocab import ByteVocab
from .errors import TokenizerError
from .vocab_files import read_world_vocab

# Every byte falls in exactly one class, so the pieces cover the input without gaps.
_PIECES = re.compile(rb" ?[A-Za-z]+| ?[0-9]+| ?[^\sA-Za-z0-9\x80-\xff]+|\s+|[\x80-\xff]+")
_MAX_CACHED_PIECE = 32  # longer pieces are rare repeats; they would only bloat the cache
_CACHE_LIMIT = 1 << 16  # entries; cleared when full, refilled by the text at hand
_TOKEN = -1  # trie key of a node's token id (byte keys are 0..255)


class WorldTokenizer(ByteVocab):
    """RWKV World tokenizer over a ``{id: token bytes}`` vocabulary (id 0 = end-of-text)."""

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
