"""An embedded store of responses: SQLite for the records, a file per RNN state beside it.

A stored response keeps what the API returns for it (the response and its input items),
the tools it offered, its own turn's tokens (records.py: earlier turns are referenced, not
copied) and, in a state file, the RNN state after the whole conversation.
`previous_response_id` continues from that state: the next turn costs only its own tokens,
however long the conversation is. Three bounds keep the folder from growing without end:
records unused for `ttl` seconds expire, records past `max_record_bytes` go least recently
used first, and past `max_state_bytes` the least recently used states are dropped while
their records stay (a continuation from such a response reads the conversation again).
Saved states (saved.py, `self.saved`) share the database and count toward that cap first.

Nothing half-written is ever stored: a state file is written under a temporary name and
renamed into place before its record is committed; a record whose state file could not be
written (a full disk) is not committed, and its temporary file is removed. A failure to
read or write is raised as StoreUnavailable; one to open the store at start as StoreError.
"""

from __future__ import annotations

import os
import sqlite3
import threading
import time
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from ..rwkv.state import State
from .errors import StoreError, StoreUnavailable
from .folder_lock import lock_folder
from .records import ID, Caller, StoredResponse, blob_of, conversation_tokens, ids_of
from .saved import SavedStates
from .schema import COLUMNS, open_database

_SELECT = f"SELECT {', '.join(COLUMNS)} FROM responses"


class ResponseStore:
    def __init__(self, folder: Path, *, max_state_bytes: int, max_record_bytes: int, ttl: int):
        self.folder, self.max_state_bytes = Path(folder), max_state_bytes
        self.max_record_bytes, self.ttl = max_record_bytes, ttl
        self.lock = threading.Lock()
        try:
            (self.folder / "states").mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise StoreError(f"{self.folder}: cannot make the response store's folder: {e.strerror or e}; choose "
                             "another [responses] path, or turn the store off with [responses] store = false") from None
        for where in (self.folder, self.folder / "states"):
            if not os.access(where, os.W_OK):
                raise StoreError(f"{where}: the response store's folder is read-only; make it writable, choose another "
                                 "[responses] path, or turn the store off with [responses] store = false")
        self._folder_lock = lock_folder(self.folder)
        try:
            self.db = open_database(self.folder / "responses.sqlite3")
        except StoreError:
            self._release()
            raise
        try:
            self.saved = SavedStates(self.db, self.lock, self.folder / "saved", self._failing, max_state_bytes)
        except (StoreError, StoreUnavailable):
            self.close()
            raise
        with self._failing("clean up"):
            self._expire()
            self._drop_orphans()

    # ------------------------------------------------------------------ reading

    def get(self, response_id: str, caller: Caller, *, touch: bool = True) -> StoredResponse | None:
        """The record, if it exists, has not expired and `caller` may see it."""
        if not ID.fullmatch(response_id):
            return None
        with self._failing("read"), self.lock:
            row = self.db.execute(f"{_SELECT} WHERE id = ? AND used >= ?", (response_id, self._oldest())).fetchone()
            if row is None:
                return None
            record = _record(row)
            if not record.visible_to(caller):
                return None
            if touch:
                self.db.execute("UPDATE responses SET used = ? WHERE id = ?", (time.time(), response_id))
        return record

    def conversation(self, record: StoredResponse) -> tuple[int, ...] | None:
        """The whole conversation's tokens up to `record`; None when an earlier response of
        it was deleted or has expired."""
        if not record.ancestors:
            return record.tokens
        with self._failing("read"), self.lock:
            marks = ", ".join("?" * len(record.ancestors))
            rows = self.db.execute(f"{_SELECT} WHERE id IN ({marks})", record.ancestors).fetchall()
        found = {r.id: r for r in map(_record, rows)}
        return conversation_tokens([found.get(a) for a in record.ancestors] + [record])

    def state(self, response_id: str, fingerprint: str) -> State | None:
        """The RNN state a stored response ended in, or None once it was dropped or when it
        was made by another model than the one `fingerprint` names."""
        with self._failing("read"), self.lock:
            row = self.db.execute("SELECT fingerprint FROM responses WHERE id = ?", (response_id,)).fetchone()
        if row is None or row[0] != fingerprint:
            return None
        try:
            with np.load(self._state_path(response_id), allow_pickle=False) as parts:
                return State(parts["att_shift"], parts["wkv"], parts["ffn_shift"])
        except (OSError, KeyError, ValueError):  # ValueError: not an id of ours, or not a state file
            return None

    def check(self) -> None:
        """A file beside the server is always there (the shared store's may not be)."""

    # ------------------------------------------------------------------ writing

    def put(self, record: StoredResponse, state: State | None) -> None:
        """Store `record` (and `state`), then apply the bounds."""
        size = self._write_state(record.id, state) if state is not None and self.max_state_bytes > 0 else 0
        try:
            with self._failing("write"), self.lock:
                self.db.execute(
                    f"INSERT OR REPLACE INTO responses ({', '.join(COLUMNS)}) VALUES ({', '.join('?' * len(COLUMNS))})",
                    (record.id, record.model, record.fingerprint, record.created, time.time(), record.response,
                     record.input_items, record.tools, blob_of(record.tokens), blob_of(record.tail), size,
                     record.owner, ",".join(record.ancestors), record.history, record.size))
        except StoreUnavailable:
            self._state_path(record.id).unlink(missing_ok=True)
            raise
        with self._failing("clean up"):
            self._expire()

    def delete(self, response_id: str, caller: Caller) -> bool:
        if self.get(response_id, caller, touch=False) is None:
            return False
        with self._failing("delete from"), self.lock:
            deleted = self.db.execute("DELETE FROM responses WHERE id = ?", (response_id,)).rowcount
        self._state_path(response_id).unlink(missing_ok=True)
        return deleted > 0

    def close(self) -> None:
        with self.lock:
            self.db.close()
        self._release()

    # ------------------------------------------------------------------ housekeeping

    @contextmanager
    def _failing(self, doing: str):
        try:
            yield
        except sqlite3.Error as e:
            raise StoreUnavailable(f"The response store ({self.folder}) could not {doing} its records: {e}") from None

    def _write_state(self, response_id: str, state: State) -> int:
        path = self._state_path(response_id)
        temporary = path.with_suffix(".partial")
        try:
            with open(temporary, "wb") as f:
                np.savez(f, att_shift=state.att_shift, wkv=state.wkv, ffn_shift=state.ffn_shift)
            os.replace(temporary, path)
            return path.stat().st_size
        except OSError as e:
            temporary.unlink(missing_ok=True)
            raise StoreUnavailable(f"The response store ({self.folder}) could not write a state: "
                                   f"{e.strerror or e}") from None

    def _state_path(self, response_id: str) -> Path:
        if not ID.fullmatch(response_id):
            raise ValueError(f"not a response id: {response_id!r}")
        return self.folder / "states" / f"{response_id}.npz"

    def _oldest(self) -> float:
        """Records last used before this have expired."""
        return time.time() - self.ttl

    def _expire(self) -> None:
        """Drop expired records, then the least recently used records past their cap and
        states past theirs."""
        with self.lock:
            gone = [rid for (rid,) in self.db.execute("SELECT id FROM responses WHERE used < ?", (self._oldest(),))]
            rows = self.db.execute("SELECT id, record_bytes FROM responses WHERE used >= ? ORDER BY used DESC",
                                   (self._oldest(),)).fetchall()
            gone += _past_cap(rows, self.max_record_bytes)
            self.db.executemany("DELETE FROM responses WHERE id = ?", [(rid,) for rid in gone])
            rows = self.db.execute(
                "SELECT id, state_bytes FROM responses WHERE state_bytes > 0 ORDER BY used DESC").fetchall()
            dropped = _past_cap(rows, self.max_state_bytes - self._saved_bytes())  # saved states are kept
            self.db.executemany("UPDATE responses SET state_bytes = 0 WHERE id = ?", [(rid,) for rid in dropped])
        for rid in gone + dropped:
            self._state_path(rid).unlink(missing_ok=True)

    def _saved_bytes(self) -> int:
        return self.db.execute("SELECT COALESCE(SUM(bytes), 0) FROM saved_states").fetchone()[0]

    def _drop_orphans(self) -> None:
        """State files without a record (a crash between file and commit) and partial ones.
        Safe only because no other server uses the folder (folder_lock.py)."""
        with self.lock:
            known = {rid for (rid,) in self.db.execute("SELECT id FROM responses WHERE state_bytes > 0")}
        for path in (self.folder / "states").iterdir():
            if path.suffix == ".partial" or path.stem not in known:
                path.unlink(missing_ok=True)

    def _release(self) -> None:
        self._folder_lock.release()


def _past_cap(rows: list[tuple[str, int]], cap: int) -> list[str]:
    """The ids, most recently used first, that do not fit in `cap` bytes."""
    sizes = np.cumsum([size for _, size in rows]) if rows else []
    return [rid for (rid, _), total in zip(rows, sizes) if total > cap]


def _record(row) -> StoredResponse:
    (rid, model, fp, created, _used, response, items, tools, tokens, tail, state_bytes, owner, ancestors,
     history, _size) = row
    return StoredResponse(id=rid, model=model, fingerprint=fp, created=created, response=response, input_items=items,
                          tools=tools, tokens=ids_of(tokens), tail=ids_of(tail), has_state=state_bytes > 0,
                          owner=owner, ancestors=tuple(ancestors.split(",")) if ancestors else (), history=history)
