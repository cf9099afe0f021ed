"""Named conversation states (POST /v1/saved_states) in the embedded store.

A saved state is a conversation's whole RNN state, read once and started from many times.
It lives in the same SQLite file as the stored responses (table `saved_states`, schema.py)
with one state blob per state in `saved/` beside it (state_blob.py: it names the model's
fingerprint, so another model's weights never read it). It belongs to the key that saved
it, as a stored response does, and it does not expire: it is kept until it is deleted.
Saved states count toward `[responses] max_state_bytes` first: a save that would take
them past it is refused (StoreFull), and the stored responses' states, which can be
computed again from their tokens, get what the saved ones leave.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import msgspec

from ..rwkv.state import State
from .errors import StoreError, StoreUnavailable
from .records import ID, Caller
from .state_blob import decode_state, encode_state

COLUMNS = ("id", "owner", "name", "model", "fingerprint", "version", "tokens", "bytes", "created", "used", "tools")
_SELECT = f"SELECT {', '.join(COLUMNS)} FROM saved_states"


class StoreFull(RuntimeError):
    """A save past the store's cap on states; the message says what to delete or raise."""


class SavedStateRecord(msgspec.Struct, kw_only=True):
    id: str
    model: str  # the served name of the model that read it
    fingerprint: str  # its weights and settings (identity.fingerprint): only they may use the state
    version: str  # the RWKV version: how its WKV part is laid out, for export
    tokens: int  # how many tokens the state has read
    bytes: int  # the state's size
    created: int
    used: float
    owner: str
    name: str | None = None
    tools: str = ""  # the tools turn it read (api/oai/tools.tools_digest), "" for none

    def visible_to(self, caller: Caller) -> bool:
        return caller.sees_all or self.owner == caller.owner


class SavedStates:
    """The saved states of a ResponseStore: its database, lock and folder, its `_failing`."""

    def __init__(self, db, lock, folder: Path, failing, max_bytes: int):
        self.db, self.lock, self.folder, self._failing, self.max_bytes = db, lock, Path(folder), failing, max_bytes
        try:
            self.folder.mkdir(parents=True, exist_ok=True)
        except OSError as e:
            raise StoreError(f"{self.folder}: cannot make the saved states' folder: {e.strerror or e}") from None
        self._drop_orphans()

    def get(self, state_id: str, caller: Caller) -> SavedStateRecord | None:
        if not ID.fullmatch(state_id):
            return None
        with self._failing("read"), self.lock:
            row = self.db.execute(f"{_SELECT} WHERE id = ?", (state_id,)).fetchone()
        record = _record(row) if row is not None else None
        return record if record is not None and record.visible_to(caller) else None

    def list(self, caller: Caller) -> list[SavedStateRecord]:
        where, args = ("", ()) if caller.sees_all else (" WHERE owner = ?", (caller.owner,))
        with self._failing("read"), self.lock:
            rows = self.db.execute(f"{_SELECT}{where} ORDER BY created, id", args).fetchall()
        return [_record(row) for row in rows]

    def state(self, record: SavedStateRecord) -> State | None:
        """The state, once its record was found; None when its file is gone or damaged."""
        try:
            blob = self._path(record.id).read_bytes()
            return decode_state(blob, record.fingerprint)
        except (OSError, ValueError):
            return None

    def touch(self, state_id: str) -> None:
        with self._failing("write"), self.lock:
            self.db.execute("UPDATE saved_states SET used = ? WHERE id = ?", (time.time(), state_id))

    def total_bytes(self) -> int:
        with self.lock:
            return self.db.execute("SELECT COALESCE(SUM(bytes), 0) FROM saved_states").fetchone()[0]

    def put(self, record: SavedStateRecord, state: State) -> None:
        blob = encode_state(state, record.fingerprint)
        with self._failing("read"):
            kept = self.total_bytes()
        if kept + len(blob) > self.max_bytes:
            raise StoreFull(f"Saved states would take {kept + len(blob)} bytes, past the store's cap of "
                            f"{self.max_bytes} ([responses] max_state_bytes); delete some saved states or raise it")
        path = self._path(record.id)
        temporary = path.with_suffix(".partial")
        try:
            temporary.write_bytes(blob)
            os.replace(temporary, path)
        except OSError as e:
            temporary.unlink(missing_ok=True)
            raise StoreUnavailable(f"The response store ({self.folder}) could not write a state: "
                                   f"{e.strerror or e}") from None
        try:
            with self._failing("write"), self.lock:
                self.db.execute(f"INSERT INTO saved_states ({', '.join(COLUMNS)}) VALUES "
                                f"({', '.join('?' * len(COLUMNS))})", _row(record))
        except StoreUnavailable:
            path.unlink(missing_ok=True)
            raise

    def delete(self, state_id: str, caller: Caller) -> bool:
        if self.get(state_id, caller) is None:
            return False
        with self._failing("delete from"), self.lock:
            deleted = self.db.execute("DELETE FROM saved_states WHERE id = ?", (state_id,)).rowcount
        self._path(state_id).unlink(missing_ok=True)
        return deleted > 0

    def _path(self, state_id: str) -> Path:
        if not ID.fullmatch(state_id):
            raise ValueError(f"not a saved state id: {state_id!r}")
        return self.folder / f"{state_id}.state"

    def _drop_orphans(self) -> None:
        """Files without a record (a crash between file and commit) and partial ones."""
        with self._failing("clean up"), self.lock:
            known = {sid for (sid,) in self.db.execute("SELECT id FROM saved_states")}
        for path in self.folder.iterdir():
            if path.suffix == ".partial" or path.stem not in known:
                path.unlink(missing_ok=True)


def _row(record: SavedStateRecord) -> tuple:
    return tuple(getattr(record, column) for column in COLUMNS)


def _record(row) -> SavedStateRecord:
    return SavedStateRecord(**dict(zip(COLUMNS, row)))
