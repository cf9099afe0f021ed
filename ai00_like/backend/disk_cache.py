"""The prefix cache's disk tier: states that outlive memory, a restart and an unload.

A long prompt's state costs seconds of prefill and a few MiB to keep, so the states the
memory cache lets go are written to a folder (`[cache] path`), one file per entry,
and found there again by the next process that serves the same weights.

* Keys: a file's name is the SHA-256 of the model's key (its weights by content and the
  engine settings that change its floats, loaded.py), the partition and the token ids,
  followed by the prefix's length; each model has a folder of its own, and each blob names
  its model too (state_blob.py), so another model's entry is never used.
* Lookups are cheap: an index (digest → length) of the model's folder is read once at open;
  a lookup hashes the prompt once, taking a digest at each length the index holds.
* Files are written under a temporary name and renamed, with a SHA-256 of their payload
  that is checked on every read: a damaged entry is dropped with a warning, never used.
* The folder's bytes stay under `max_bytes`, least recently used first (a hit touches the
  file's mtime); the cap covers every model's entries in the folder.
* Entries are written when they leave memory and when the model stops (state_cache.py),
  never on the step's path; prefixes under `min_tokens` are not written at all.
* Reads and writes run on worker threads: the backend's step loop never waits for the disk.
"""

from __future__ import annotations

import hashlib
import logging
import os
import struct
import threading
import time
import uuid
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np

from ..response_store.state_blob import decode_state, encode_state

log = logging.getLogger(__name__)

MAGIC = b"ai00pc1\n"
SUFFIX = ".pcs"
_LENGTH = struct.Struct("<I")
_DIGEST = 32  # bytes of the payload's SHA-256
MAX_PENDING_WRITES = 8  # beyond it an evicted entry is not written (memory stays bounded)
STALE_TEMP_SECONDS = 3600  # a temporary file this old was left by a process that died


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


class DiskCache:
    """One model's entries in a cache folder. The backend thread calls find, load and put;
    the worker threads do the reading and writing and call back `done` from there."""

    def __init__(self, root: str | Path, model_key: str, max_bytes: int, min_tokens: int = 0):
        self.root, self.model_key, self.max_bytes = Path(root), model_key, max_bytes
        self.min_tokens = min_tokens  # shorter prefixes are cheaper to compute again than to keep
        self.folder = self.root / model_key[:32]
        self.folder.mkdir(parents=True, exist_ok=True)
        self._lock = threading.Lock()  # the index: the backend thread reads it, the workers change it
        self._index: dict[str, int] = {}  # digest → length (of the prefix it holds)
        self._logits: set[str] = set()  # digests whose entry holds logits (may end a prompt)
        self._lengths: Counter = Counter()
        self._pending: set[str] = set()  # digests being written
        self._reader = ThreadPoolExecutor(1, thread_name_prefix="disk-cache-read")
        self._writer = ThreadPoolExecutor(1, thread_name_prefix="disk-cache-write")
        self.hits = self.hit_tokens = self.writes = self.dropped = 0
        self._scan()

    # ------------------------------------------------------------------ the backend thread

    def find(self, partition: str, key: bytes, above: int = 0) -> int:
        """The longest length L > `above` with tokens[:L] on disk (`key`: the tokens as int32
        bytes, as state_cache keys them), or 0. An entry of the whole prompt must hold logits."""
        n = len(key) // 4
        with self._lock:
            lengths = sorted(length for length in self._lengths if above < length <= n)
        if not lengths:
            return 0
        hasher, done, digests = self._hasher(partition), 0, {}
        for length in lengths:  # one pass over the prompt, a digest at each length
            hasher.update(key[4 * done:4 * length])
            done, digests[length] = length, hasher.copy().hexdigest()
        with self._lock:
            for length in reversed(lengths):
                digest = digests[length]
                if digest in self._index and (length < n or digest in self._logits):
                    return length
        return 0

    def load(self, partition: str, key: bytes, done: Callable) -> None:
        """Read the entry of `key` on the reader thread, then call done(state, logits), or
        done(None, None) when it is gone or damaged."""
        digest = self._digest(partition, key)
        self._reader.submit(self._read, digest, len(key) // 4, done)

    def put(self, partition: str, key: bytes, state, logits: np.ndarray | None, *, wait: bool = False) -> None:
        """Write an entry on the writer thread unless it is shorter than `min_tokens`, on disk
        or being written. Without `wait` it is skipped while too many writes wait, so that
        evictions faster than the disk cannot pile states up in memory."""
        if len(key) // 4 < self.min_tokens:
            return
        digest = self._digest(partition, key)
        with self._lock:
            if digest in self._index or digest in self._pending or (not wait and len(self._pending) >= MAX_PENDING_WRITES):
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

    def _read(self, digest: str, length: int, done: Callable) -> None:
        path = self._path(digest, length)
        try:
            state, logits = decode_entry(path.read_bytes(), self.model_key)
            os.utime(path)  # most recently used: the cap removes it last
        except FileNotFoundError:  # removed by the cap (of another model sharing the folder)
            self._forget(digest)
            done(None, None)
            return
        except (OSError, ValueError) as exc:
            log.warning("prefix cache: dropped %s: %s", path, exc)
            self.dropped += 1
            self._remove(path, digest)
            done(None, None)
            return
        self.hits += 1
        self.hit_tokens += length
        done(state, logits)

    def _write(self, digest: str, length: int, state, logits) -> None:
        path = self._path(digest, length, logits is not None)
        temp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
        try:
            temp.write_bytes(encode_entry(state, logits, self.model_key))
            os.replace(temp, path)  # readers see the whole file or none
        except OSError as exc:
            log.warning("prefix cache: cannot write %s: %s", path, exc)
            temp.unlink(missing_ok=True)
            with self._lock:
                self._pending.discard(digest)
            return
        with self._lock:
            self._pending.discard(digest)
            self._add(digest, length, logits is not None)
        self.writes += 1
        self._enforce_cap()

    def _enforce_cap(self) -> None:
        """Remove the least recently used files of the whole folder until it fits."""
        files, total = [], 0
        for path in self.root.glob(f"*/*{SUFFIX}"):
            try:
                st = path.stat()
            except OSError:
                continue
            files.append((st.st_mtime_ns, st.st_size, path))
            total += st.st_size
        for _, size, path in sorted(files):
            if total <= self.max_bytes:
                break
            self._remove(path, path.name.split(".")[0] if path.parent == self.folder else None)
            total -= size

    # ------------------------------------------------------------------ the index

    def _scan(self) -> None:
        """Index the model's folder (names carry digest and length) and clear stale temporaries."""
        for path in self.folder.iterdir():
            parts = path.name.split(".")
            if path.name.endswith(".tmp"):
                try:
                    if time.time() - path.stat().st_mtime > STALE_TEMP_SECONDS:
                        path.unlink()
                except OSError:
                    pass
            elif len(parts) == 4 and "." + parts[3] == SUFFIX and parts[1].isdigit():
                self._add(parts[0], int(parts[1]), parts[2] == "l")

    def _add(self, digest: str, length: int, has_logits: bool) -> None:
        if digest not in self._index:
            self._index[digest] = length
            self._lengths[length] += 1
        if has_logits:
            self._logits.add(digest)

    def _forget(self, digest: str) -> None:
        with self._lock:
            length = self._index.pop(digest, None)
            self._logits.discard(digest)
            if length is not None:
                self._lengths[length] -= 1
                if not self._lengths[length]:
                    del self._lengths[length]

    def _remove(self, path: Path, digest: str | None) -> None:
        try:
            path.unlink()
        except OSError:
            pass
        if digest is not None:
            self._forget(digest)

    def _path(self, digest: str, length: int, has_logits: bool | None = None) -> Path:
        if has_logits is None:  # an indexed entry: the index knows
            with self._lock:
                has_logits = digest in self._logits
        return self.folder / f"{digest}.{length}.{'l' if has_logits else 's'}{SUFFIX}"

    def _hasher(self, partition: str):
        hasher = hashlib.sha256(self.model_key.encode())
        hasher.update(b"\0" + partition.encode() + b"\0")
        return hasher

    def _digest(self, partition: str, key: bytes) -> str:
        hasher = self._hasher(partition)
        hasher.update(key)
        return hasher.hexdigest()
