"""What the prefix cache's tiers below memory have in common: the disk (disk_cache.py) and
the store shared by replicas (shared_cache.py).

The scheduler treats every tier alike: `fetch` finds and reads the longest prefix the tier
holds beyond what memory has, on the tier's reader thread, and hands it to a callback (which
posts it into the backend's inbox); `put` queues an entry for the writer thread. So the
backend's step loop never waits for a disk or a network, and a tier differs from another
only in where it finds, reads and writes the bytes (`_find`, `_load`, `_store`, `_drop`).

* Keys: the SHA-256 of the model's key (its weights by content and the engine settings that
  change its floats, loaded.py), the partition and the token ids. The entry's bytes name
  the model too (state_blob.py), so another model's entry is never used.
* An entry's bytes carry a SHA-256 of their payload, checked on every read: a damaged one
  is dropped with a warning, never used.
* Writes queue at most `MAX_PENDING_WRITES`; beyond that an entry is skipped, so that
  entries made faster than the tier takes them cannot pile states up in memory.
* A tier that fails (Redis gone) says so once, is left out for `RETRY_SECONDS`, then tried
  again: the server keeps serving from memory and the other tiers meanwhile.
"""

from __future__ import annotations

import hashlib
import logging
import struct
import threading
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

import numpy as np

from ..response_store.state_blob import decode_state, encode_state

log = logging.getLogger(__name__)

MAGIC = b"ai00pc1\n"
_LENGTH = struct.Struct("<I")
_DIGEST = 32  # bytes of the payload's SHA-256
MAX_PENDING_WRITES = 8
RETRY_SECONDS = 5.0  # a failed tier is left out this long, then tried again


def encode_entry(state, logits: np.ndarray | None, model_key: str) -> bytes:
    """MAGIC, the payload's SHA-256, then the payload: the state blob's length, the blob
    (which names the model), and the logits as little-endian float32 (none for a checkpoint)."""
    blob = encode_state(state, model_key)
    tail = b"" if logits is None else np.ascontiguousarray(logits, dtype="<f4").tobytes()
    payload = _LENGTH.pack(len(blob)) + blob + tail
    return MAGIC + hashlib.sha256(payload).digest() + payload


def decode_entry(data: bytes, model_key: str):
    """(state, logits or None); ValueError for anything damaged or not this model's."""
    head = len(MAGIC) + _DIGEST
    if not data.startswith(MAGIC) or len(data) < head + _LENGTH.size:
        raise ValueError("not a prefix cache entry")
    payload = memoryview(data)[head:]
    if hashlib.sha256(payload).digest() != data[len(MAGIC):head]:
        raise ValueError("its checksum does not match")
    (length,) = _LENGTH.unpack_from(payload, 0)
    state = decode_state(bytes(payload[_LENGTH.size:_LENGTH.size + length]), model_key)
    if state is None:
        raise ValueError("it belongs to another model")
    tail = payload[_LENGTH.size + length:]
    if len(tail) % 4:
        raise ValueError("its logits are truncated")
    logits = np.frombuffer(bytearray(tail), "<f4").astype(np.float32, copy=False) if len(tail) else None
    return state, logits


class CacheTier:
    """One model's entries in a tier below memory. The backend thread calls available,
    fetch and put; the worker threads call the subclass's `_find`, `_load`, `_store` and
    `_drop`, which raise one of `errors` when the tier cannot be reached."""

    name = ""  # "disk" or "shared": the metrics' label
    write_through = False  # True: written when filled (replicas need it now); False: when evicted or at stop
    errors: tuple[type[BaseException], ...] = ()
    readers = 1  # reader threads: more let a lookup pass a long read

    def __init__(self, model_key: str, min_tokens: int = 0, max_entry_bytes: int = 0):
        self.model_key, self.min_tokens = model_key, min_tokens  # shorter prefixes are cheaper to compute again
        self.max_entry_bytes = max_entry_bytes  # 0: any size
        self._lock = threading.Lock()
        self._pending: set[str] = set()  # digests queued or being written
        self._retry_at = 0.0  # monotonic time before which a failed tier is left out
        self._failing = False
        self._reader = ThreadPoolExecutor(self.readers, thread_name_prefix=f"{self.name}-cache-read")
        self._writer = ThreadPoolExecutor(1, thread_name_prefix=f"{self.name}-cache-write")
        self.hits = self.hit_tokens = self.writes = self.dropped = self.skipped = 0

    # ------------------------------------------------------------------ the backend thread

    def available(self) -> bool:
        return time.monotonic() >= self._retry_at

    def worth_asking(self, partition: str, key: bytes, above: int) -> bool:
        """Whether the tier may hold a prefix of `key` longer than `above`, known without a
        read: a prompt answered no is not held up behind another one's read."""
        return len(key) // 4 >= max(self.min_tokens, above + 1)

    def fetch(self, partition: str, key: bytes, above: int, done: Callable) -> None:
        """On the reader thread: find the longest prefix of `key` (the tokens as int32 bytes, as
        state_cache keys them) longer than `above` that this tier holds, read it, and call
        done(length, state, logits); done(0, None, None) when there is none (or it is damaged)."""
        self._reader.submit(self._fetch, partition, key, above, done)

    def put(self, partition: str, key: bytes, state, logits: np.ndarray | None, *, wait: bool = False) -> None:
        """Write an entry on the writer thread unless it is shorter than `min_tokens`, queued
        already or the tier is failing. Without `wait` it is skipped while too many writes
        wait (the states they hold stay in memory until written)."""
        if len(key) // 4 < self.min_tokens or not self.available():
            return
        digest = self.digest(partition, key)
        with self._lock:
            if digest in self._pending or self._holds(digest):
                return
            if not wait and len(self._pending) >= MAX_PENDING_WRITES:
                self.skipped += 1
                return
            self._pending.add(digest)
        self._writer.submit(self._write, digest, len(key) // 4, state, logits)

    def flush(self) -> None:
        """Wait for the writes queued so far."""
        self._writer.submit(lambda: None).result()

    def close(self) -> None:
        """Finish the writes (the next load finds them), drop the reads no one waits for."""
        self._reader.shutdown(wait=True, cancel_futures=True)
        self._writer.shutdown(wait=True)

    # ------------------------------------------------------------------ the worker threads

    def _fetch(self, partition: str, key: bytes, above: int, done: Callable) -> None:
        found = state = logits = None
        try:
            found = self._find(partition, key, above)  # (length, where) or None
            data = self._load(found[1]) if found is not None else None
            if data is not None:
                state, logits = decode_entry(data, self.model_key)
            self._recovered()
        except ValueError as exc:
            log.warning("prefix cache: dropped %s from the %s tier: %s", found[1], self.name, exc)
            self.dropped += 1
            self._quietly(self._drop, found[1])
        except self.errors as exc:
            self._failed(exc)
        if state is None:
            done(0, None, None)
            return
        self.hits += 1
        self.hit_tokens += found[0]
        done(found[0], state, logits)

    def _write(self, digest: str, length: int, state, logits) -> None:
        try:
            data = encode_entry(state, logits, self.model_key)
            if self.max_entry_bytes and len(data) > self.max_entry_bytes:
                self.skipped += 1
            elif self._store(digest, length, logits is not None, data):
                self.writes += 1
            self._recovered()
        except self.errors as exc:
            self._failed(exc)
        finally:
            with self._lock:
                self._pending.discard(digest)

    def _failed(self, exc: BaseException) -> None:
        self._retry_at = time.monotonic() + RETRY_SECONDS
        if not self._failing:  # once per outage: a log line per request would drown the log
            self._failing = True
            log.warning("prefix cache: the %s tier failed (%s); serving without it, trying again every %.0f s",
                        self.name, exc, RETRY_SECONDS)

    def _recovered(self) -> None:
        if self._failing:
            self._failing = False
            log.warning("prefix cache: the %s tier works again", self.name)

    def _quietly(self, call: Callable, *args) -> None:
        try:
            call(*args)
        except self.errors as exc:
            self._failed(exc)

    # ------------------------------------------------------------------ keys

    def hasher(self, partition: str):
        hasher = hashlib.sha256(self.model_key.encode())
        hasher.update(b"\0" + partition.encode() + b"\0")
        return hasher

    def digest(self, partition: str, key: bytes) -> str:
        hasher = self.hasher(partition)
        hasher.update(key)
        return hasher.hexdigest()

    def digests(self, partition: str, key: bytes, lengths: list[int]) -> dict[int, str]:
        """The digest of each prefix length of `key` in `lengths` (ascending), in one pass."""
        hasher, done, digests = self.hasher(partition), 0, {}
        for length in lengths:
            hasher.update(key[4 * done:4 * length])
            done, digests[length] = length, hasher.copy().hexdigest()
        return digests

    # ------------------------------------------------------------------ a tier's own

    def _holds(self, digest: str) -> bool:
        """Known to hold `digest` without asking anyone (called under the lock)."""
        return False

    def _find(self, partition: str, key: bytes, above: int):
        """(length, where) of the longest prefix of `key` above `above` held, or None; an
        entry of all of `key` must hold logits (the next token is sampled from them)."""
        raise NotImplementedError

    def _load(self, where) -> bytes | None:
        """The entry's bytes, or None when it went meanwhile."""
        raise NotImplementedError

    def _store(self, digest: str, length: int, has_logits: bool, data: bytes) -> bool:
        """Keep the entry; False when it was not written (an error already said why)."""
        raise NotImplementedError

    def _drop(self, where) -> None:
        raise NotImplementedError
