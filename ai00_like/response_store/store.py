"""An embedded store of responses: SQLite for the records, a file per RNN state beside it.

A stored response keeps what the API returns for it (the response and its input items),
the tools it offered, the conversation's tokens up to its end and, in a state file, the
RNN state after them. `previous_response_id` continues from that state: the next turn
costs only its own tokens, however long the conversation is. States are the bulk of the
store; when their bytes pass the cap, the least recently used states are dropped, their
records kept, and a continuation from such a response prefills its stored tokens again.

Nothing half-written is ever stored: a state file is written under a temporary name and
renamed into place before its record is committed, and a record whose state file could
not be written is not committed at all.
"""

from __future__ import annotations

import os
import re
import sqlite3
import threading
import time
from pathlib import Path

import msgspec
import numpy as np

from ..rwkv.state import State

ID = re.compile(r"[A-Za-z0-9_]{1,128}")  # ours are resp_<hex>; anything else names no stored response
SCHEMA = """
CREATE TABLE IF NOT EXISTS responses (
    id TEXT PRIMARY KEY,
    model TEXT NOT NULL,
    fingerprint TEXT NOT NULL,
    created INTEGER NOT NULL,
    used REAL NOT NULL,
    response BLOB NOT NULL,
    input_items BLOB NOT NULL,
    tools BLOB NOT NULL,
    tokens BLOB NOT NULL,
    tail BLOB NOT NULL,
    state_bytes INTEGER NOT NULL
)
"""


class StoredResponse(msgspec.Struct, kw_only=True):
    """A record: JSON bodies as bytes, token ids as tuples."""

    id: str
    model: str
    fingerprint: str  # the weights and settings that made it (generation.fingerprint)
    created: int
    response: bytes  # the Response object, as GET returns it
    input_items: bytes  # a JSON list of the input items, as GET …/input_items returns them
    tools: bytes  # the tools offered, as JSON
    tokens: tuple[int, ...]  # the conversation's tokens the state holds
    tail: tuple[int, ...]  # tokens generated after them, not yet read by the model
    has_state: bool = False


def _ids(blob: bytes) -> tuple[int, ...]:
    return tuple(np.frombuffer(blob, dtype="<u4").tolist())


def _blob(ids: tuple[int, ...]) -> bytes:
    return np.asarray(ids, dtype="<u4").tobytes()


class ResponseStore:
    def __init__(self, folder: Path, max_state_bytes: int):
        self.folder, self.max_state_bytes = Path(folder), max_state_bytes
        (self.folder / "states").mkdir(parents=True, exist_ok=True)
        self.lock = threading.Lock()
        self.db = sqlite3.connect(self.folder / "responses.sqlite3", check_same_thread=False, isolation_level=None)
        self.db.execute("PRAGMA journal_mode=WAL")
        self.db.execute(SCHEMA)
        self._drop_orphans()

    # ------------------------------------------------------------------ reading

    def get(self, response_id: str, *, touch: bool = True) -> StoredResponse | None:
        if not ID.fullmatch(response_id):
            return None
        with self.lock:
            row = self.db.execute(
                "SELECT id, model, fingerprint, created, response, input_items, tools, tokens, tail, state_bytes "
                "FROM responses WHERE id = ?", (response_id,)).fetchone()
            if row is None:
                return None
            if touch:
                self.db.execute("UPDATE responses SET used = ? WHERE id = ?", (time.time(), response_id))
        rid, model, fp, created, response, items, tools, tokens, tail, state_bytes = row
        return StoredResponse(id=rid, model=model, fingerprint=fp, created=created, response=response,
                              input_items=items, tools=tools, tokens=_ids(tokens), tail=_ids(tail),
                              has_state=state_bytes > 0)

    def state(self, response_id: str, fingerprint: str) -> State | None:
        """The RNN state a stored response ended in, or None once it was dropped or when it
        was made by another model than the one `fingerprint` names."""
        record = self.get(response_id, touch=False)
        if record is None or record.fingerprint != fingerprint:
            return None
        try:
            path = self._state_path(response_id)
            with np.load(path, allow_pickle=False) as parts:
                return State(parts["att_shift"], parts["wkv"], parts["ffn_shift"])
        except (OSError, KeyError, ValueError):  # ValueError: not an id of ours, or not a state file
            return None

    def check(self) -> None:
        """A file beside the server is always there (the shared store's may not be)."""

    # ------------------------------------------------------------------ writing

    def put(self, record: StoredResponse, state: State | None) -> None:
        """Store `record` (and `state`), then drop the oldest states beyond the cap."""
        size = 0
        if state is not None and self.max_state_bytes > 0:
            path = self._state_path(record.id)
            temporary = path.with_suffix(".partial")
            with open(temporary, "wb") as f:
                np.savez(f, att_shift=state.att_shift, wkv=state.wkv, ffn_shift=state.ffn_shift)
            os.replace(temporary, path)
            size = path.stat().st_size
        try:
            with self.lock:
                self.db.execute(
                    "INSERT OR REPLACE INTO responses VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
                    (record.id, record.model, record.fingerprint, record.created, time.time(), record.response,
                     record.input_items, record.tools, _blob(record.tokens), _blob(record.tail), size))
        except sqlite3.Error:
            self._state_path(record.id).unlink(missing_ok=True)
            raise
        self._evict()

    def delete(self, response_id: str) -> bool:
        if not ID.fullmatch(response_id):
            return False
        with self.lock:
            deleted = self.db.execute("DELETE FROM responses WHERE id = ?", (response_id,)).rowcount
        self._state_path(response_id).unlink(missing_ok=True)
        return deleted > 0

    def close(self) -> None:
        with self.lock:
            self.db.close()

    # ------------------------------------------------------------------ housekeeping

    def _state_path(self, response_id: str) -> Path:
        if not ID.fullmatch(response_id):
            raise ValueError(f"not a response id: {response_id!r}")
        return self.folder / "states" / f"{response_id}.npz"

    def _evict(self) -> None:
        with self.lock:
            rows = self.db.execute(
                "SELECT id, state_bytes FROM responses WHERE state_bytes > 0 ORDER BY used DESC").fetchall()
            total, dropped = 0, []
            for rid, size in rows:
                total += size
                if total > self.max_state_bytes:
                    dropped.append(rid)
            for rid in dropped:
                self.db.execute("UPDATE responses SET state_bytes = 0 WHERE id = ?", (rid,))
        for rid in dropped:
            self._state_path(rid).unlink(missing_ok=True)

    def _drop_orphans(self) -> None:
        """State files without a record (a crash between file and commit) and partial ones."""
        with self.lock:
            known = {rid for (rid,) in self.db.execute("SELECT id FROM responses WHERE state_bytes > 0")}
        for path in (self.folder / "states").iterdir():
            if path.suffix == ".partial" or path.stem not in known:
                path.unlink(missing_ok=True)
