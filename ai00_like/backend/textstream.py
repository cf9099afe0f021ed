"""Generated tokens' bytes in, text pieces that are safe to stream out, with stop strings.

A token of the RWKV vocabulary is a byte string that may end in the middle of a UTF-8
character, and a stop string may arrive split over several tokens. `TextStream` therefore
holds back (1) the bytes of an incomplete character and (2) the longest tail of the text
that could still grow into a stop string, and emits everything before that.

Matching is done on decoded text (str), not on bytes. Stop strings are given as text, and
the pieces we emit are text: matching in the same unit means "the text before the match" is
a plain slice that can never cut a character in two, and a stop string that begins inside a
multi-byte character split over tokens simply matches once the incremental decoder has
completed that character. (For valid UTF-8 a byte match would find the same places, since
UTF-8 is self-synchronising; text also behaves sensibly around invalid bytes, which become
U+FFFD.) Code points are compared exactly, with no Unicode normalisation.

Which stop wins: the first stop string to be *completed*, reading the text left to right;
when several complete at the same character, the longest (the one starting earliest). This
makes the result independent of how the text happens to be split into tokens: a stream that
sees "abcd" in one token stops where a stream seeing "a", "b", "c", "d" would.
Ai00 scans bytes without backtracking and so misses overlapping matches such as "aab" in
"aaab"; the automaton below does not.
"""

from __future__ import annotations

import codecs
from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class TextPiece:
    """What one token adds to the stream: `text` to emit now (possibly empty), and whether
    a stop string has been matched (then nothing more will ever be emitted)."""

    text: str
    stopped: bool


class _StopMatcher:
    """An Aho–Corasick automaton over the stop strings, fed one character at a time.

    Its state is the longest suffix of the text read so far that is a prefix of some stop
    string: its length is exactly how much text must be held back, and it is found in
    amortised O(1) per character, so a token costs O(its length), not O(text so far).
    """

    def __init__(self, stops: Sequence[str]):
        # Node 0 is the root (the empty prefix). Per node: outgoing edges, failure link,
        # depth (length of the prefix it stands for), and the length of the longest stop
        # string that ends at this node, directly or through failure links (0 if none).
        self._edges: list[dict[str, int]] = [{}]
        self._fail: list[int] = [0]
        self._depth: list[int] = [0]
        self._match: list[int] = [0]
        for stop in stops:
            self._add(stop)
        self._link()
        self.state = 0

    def _add(self, stop: str) -> None:
        node = 0
        for char in stop:
            nxt = self._edges[node].get(char)
            if nxt is None:
                nxt = len(self._edges)
                self._edges.append({})
                self._fail.append(0)
                self._depth.append(self._depth[node] + 1)
                self._match.append(0)
                self._edges[node][char] = nxt
            node = nxt
        self._match[node] = max(self._match[node], len(stop))

    def _link(self) -> None:
        # Breadth-first, so a node's failure target (shallower) is finished before it.
        queue = list(self._edges[0].values())
        for node in queue:
            for char, child in self._edges[node].items():
                fallback = self._fail[node]
                while fallback and char not in self._edges[fallback]:
                    fallback = self._fail[fallback]
                target = self._edges[fallback].get(char, 0)
                self._fail[child] = target if target != child else 0
                # A longer stop ending here beats a shorter one inherited via the link.
                self._match[child] = max(self._match[child], self._match[self._fail[child]])
                queue.append(child)

    def feed(self, char: str) -> int:
        """Advance by one character; returns the length of the longest stop string that
        ends exactly here, or 0."""
        node = self.state
        while node and char not in self._edges[node]:
            node = self._fail[node]
        node = self._edges[node].get(char, 0)
        self.state = node
        return self._match[node]

    @property
    def held(self) -> int:
        """How many trailing characters could still be the start of a stop string."""
        return self._depth[self.state]


class TextStream:
    """Turns generated tokens' bytes into streamable text, cut before any stop string.

    ``push(token_bytes)`` returns the text that became safe to show; ``finish()`` returns
    whatever was still held back once generation ends without a stop (max_tokens, end of
    text), so no text is ever lost. Empty stop strings are ignored.
    """

    def __init__(self, stop: Sequence[str] = ()):
        if isinstance(stop, str):
            stop = [stop]
        self.stop = [s for s in stop if s]
        self._decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        self._matcher = _StopMatcher(self.stop)
        self._pending = ""  # decoded text not yet emitted: the held-back tail only
        self._pieces: list[str] = []
        self._emitted_chars = 0
        self._stopped = False
        self._finished = False

    @property
    def stopped(self) -> bool:
        """True once a stop string matched."""
        return self._stopped

    @property
    def emitted_chars(self) -> int:
        """Characters emitted so far (push and finish), for counting."""
        return self._emitted_chars

    @property
    def text_so_far(self) -> str:
        """All the text emitted so far, joined."""
        if len(self._pieces) > 1:
            self._pieces = ["".join(self._pieces)]
        return self._pieces[0] if self._pieces else ""

    @property
    def held_back(self) -> str:
        """Decoded text currently held back as a possible stop-string start (excludes
        the bytes of an incomplete character)."""
        return "" if self._stopped else self._pending

    def push(self, token_bytes: bytes) -> TextPiece:
        """Add one token's bytes; returns the newly safe text and whether we stopped."""
        if self._stopped or self._finished:
            return TextPiece("", self._stopped)
        return TextPiece(self._scan(self._decoder.decode(token_bytes)), self._stopped)

    def finish(self) -> str:
        """End of generation without a stop match: returns all text still held back,
        decoding incomplete trailing bytes as U+FFFD. Returns "" after a stop, and on any
        later call."""
        if self._stopped or self._finished:
            return ""
        text = self._scan(self._decoder.decode(b"", final=True))
        self._finished = True
        if self._stopped:
            return text
        tail, self._pending = self._pending, ""
        return self._emit(text + tail)

    def _scan(self, new_text: str) -> str:
        """Feed decoded text through the stop matcher; returns what may be emitted now."""
        if not new_text:
            return ""
        if not self.stop:
            return self._emit(new_text)
        buffer = self._pending + new_text
        start = len(self._pending)
        for offset, char in enumerate(new_text):
            matched = self._matcher.feed(char)
            if matched:
                end = start + offset + 1
                self._stopped = True
                self._pending = ""
                return self._emit(buffer[: end - matched])
        held = self._matcher.held
        cut = len(buffer) - held
        self._pending = buffer[cut:]
        return self._emit(buffer[:cut])

    def _emit(self, text: str) -> str:
        if text:
            self._pieces.append(text)
            self._emitted_chars += len(text)
        return text
