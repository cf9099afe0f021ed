"""The prefix cache's disk tier: states that outlive memory, a restart and an unload.

A long prompt's state costs seconds of prefill and a few MiB to keep, so the states the
memory cache lets go are written to a folder (`[cache] path`), one file per entry,
and found there again by the next process that serves the same weights.

* Keys (cache_tier.py): a file's name is the entry's digest followed by the prefix's length;
  each model has a folder of its own, and each entry names its model too.
* Lookups are cheap: an index (digest → length) of the model's folder is read once at open;
  a lookup hashes the prompt once, taking a digest at each length the index holds.
* Files are written under a temporary name and renamed, so a reader sees a whole file or
  none; a damaged one is dropped (cache_tier.py).
* The folder's bytes stay under `max_bytes`, least recently used first (a hit touches the
  file's mtime); the cap covers every model's entries in the folder.
* Entries are written when they leave memory and when the model stops (state_cache.py),
  never on the step's path; prefixes under `min_tokens` are not written at all.
"""

from __future__ import annotations

import logging
import os
import time
import uuid
from collections import Counter
from pathlib import Path

from .cache_tier import CacheTier

log = logging.getLogger(__name__)

SUFFIX = ".pcs"
STALE_TEMP_SECONDS = 3600  # a temporary file this old was left by a process that died


class DiskCache(CacheTier):
    """One model's entries in a cache folder."""

    name = "disk"

    def __init__(self, root: str | Path, model_key: str, max_bytes: int, min_tokens: int = 0):
        super().__init__(model_key, min_tokens)
        self.root, self.max_bytes = Path(root), max_bytes
        self.folder = self.root / model_key[:32]
        self.folder.mkdir(parents=True, exist_ok=True)
        # The index: the backend thread reads it (find), the workers change it; under self._lock.
        self._index: dict[str, int] = {}  # digest → length (of the prefix it holds)
        self._logits: set[str] = set()  # digests whose entry holds logits (may end a prompt)
        self._lengths: Counter = Counter()
        self.bytes = 0  # the whole folder's, as of the latest write (every model's entries)
        self._scan()
        self.bytes = self._enforce_cap()

    def find(self, partition: str, key: bytes, above: int = 0) -> int:
        """The longest length L > `above` with tokens[:L] on disk, or 0."""
        found = self._find(partition, key, above)
        return found[0] if found is not None else 0

    # ------------------------------------------------------------------ CacheTier's

    def worth_asking(self, partition: str, key: bytes, above: int) -> bool:
        return self.find(partition, key, above) > 0  # the index is here: exact, and cheap

    def _holds(self, digest: str) -> bool:
        return digest in self._index

    def _find(self, partition: str, key: bytes, above: int):
        n = len(key) // 4
        with self._lock:
            lengths = sorted(length for length in self._lengths if above < length <= n)
        if not lengths:
            return None
        digests = self.digests(partition, key, lengths)
        with self._lock:
            for length in reversed(lengths):
                digest = digests[length]
                if digest in self._index and (length < n or digest in self._logits):
                    return length, self._path(digest, length)
        return None

    def _load(self, path: Path) -> bytes | None:
        try:
            data = path.read_bytes()
            os.utime(path)  # most recently used: the cap removes it last
        except FileNotFoundError:  # removed by the cap (of another model sharing the folder)
            self._forget(path.name.split(".")[0])
            return None
        except OSError as exc:
            raise ValueError(str(exc)) from None  # unreadable: dropped like a damaged one
        return data

    def _store(self, digest: str, length: int, has_logits: bool, data: bytes) -> bool:
        path = self._path(digest, length, has_logits)
        temp = path.with_name(f".{path.name}.{uuid.uuid4().hex[:8]}.tmp")
        try:
            temp.write_bytes(data)
            os.replace(temp, path)  # readers see the whole file or none
        except OSError as exc:
            log.warning("prefix cache: cannot write %s: %s", path, exc)
            temp.unlink(missing_ok=True)
            return False
        with self._lock:
            self._add(digest, length, has_logits)
        self.bytes = self._enforce_cap()
        return True

    def _drop(self, path: Path) -> None:
        self._remove(path, path.name.split(".")[0])

    # ------------------------------------------------------------------ the folder

    def _enforce_cap(self) -> int:
        """Remove the least recently used files of the whole folder until it fits; its bytes."""
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
        return total

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
        if has_logits is None:  # an indexed entry: the index knows (callers hold the lock)
            has_logits = digest in self._logits
        return self.folder / f"{digest}.{length}.{'l' if has_logits else 's'}{SUFFIX}"
