"""What every tokenizer shares: each token id stands for a fixed string of bytes.

Decoding is then the concatenation of token bytes, which is what lets a stream be decoded
token by token (`StreamDecoder`) without re-decoding what came before.
"""

from __future__ import annotations

import codecs
from collections.abc import Iterable
from functools import cached_property


class ByteVocab:
    """Decoding over `_bytes` ({id: token bytes}); subclasses fill it and implement encoding."""

    eos_id = 0
    source = "<vocab>"
    _bytes: dict[int, bytes]

    @cached_property
    def vocab_size(self) -> int:
        """Largest id + 1 (65530 for the World vocab; models pad their embedding to 65536)."""
        return max(self._bytes) + 1 if self._bytes else 0

    def token_bytes(self, token_id: int) -> bytes:
        """The bytes of one token; b"" for end-of-text (0), special tokens and unknown ids."""
        return self._bytes.get(token_id, b"")

    def encode_bytes(self, data: bytes) -> list[int]:
        raise NotImplementedError

    def encode(self, text: str) -> list[int]:
        return self.encode_bytes(text.encode("utf-8"))

    def decode_bytes(self, ids: Iterable[int]) -> bytes:
        get = self._bytes.get
        return b"".join([get(i, b"") for i in ids])

    def decode(self, ids: Iterable[int]) -> str:
        return self.decode_bytes(ids).decode("utf-8", errors="replace")


class StreamDecoder:
    """Turns token ids into text as they arrive, never splitting a UTF-8 character.

    A token may end in the middle of a character; its bytes are held until the character is
    complete. Bytes that can no longer become valid UTF-8 come out as U+FFFD.
    """

    def __init__(self, tokenizer: ByteVocab):
        self._token_bytes = tokenizer.token_bytes
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")

    def push(self, token_id: int) -> str:
        """The text completed by this token (possibly "")."""
        return self._decoder.decode(self._token_bytes(token_id))

    def flush(self) -> str:
        """Whatever is still held at the end of the stream (an incomplete tail → U+FFFD)."""
        return self._decoder.decode(b"", final=True)
