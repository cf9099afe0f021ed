"""The SQLite file of the embedded store: its table, and the upgrade of older files.

`PRAGMA user_version` says which layout a file has. Version 0 (before records had owners
and referenced their earlier turns) is upgraded in place: its records keep the whole
conversation's tokens and no ancestors, which reads the same, and belong to `anonymous`,
so on a server with keys only the admin key sees them (who made them is not known).
Version 2 adds the table of saved states (saved.py), which older servers never read;
version 3 the tools turn each one read (`tools`, '' for the states saved before).
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

from .errors import StoreError

VERSION = 3
COLUMNS = ("id", "model", "fingerprint", "created", "used", "response", "input_items", "tools", "tokens", "tail",
           "state_bytes", "owner", "ancestors", "history", "record_bytes")
_TABLE = """
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
# What version 1 added to version 0's table.
_ADDED = (
    "ALTER TABLE responses ADD COLUMN owner TEXT NOT NULL DEFAULT 'anonymous'",
    "ALTER TABLE responses ADD COLUMN ancestors TEXT NOT NULL DEFAULT ''",
    "ALTER TABLE responses ADD COLUMN history BLOB NOT NULL DEFAULT x''",
    "ALTER TABLE responses ADD COLUMN record_bytes INTEGER NOT NULL DEFAULT 0",
    "UPDATE responses SET record_bytes = length(response) + length(input_items) + length(tools) + length(tokens) "
    "+ length(tail)",
    "CREATE INDEX IF NOT EXISTS responses_used ON responses (used)",
)

# What version 2 added: the saved states (saved.py), kept until deleted.
_SAVED = """
CREATE TABLE IF NOT EXISTS saved_states (
    id TEXT PRIMARY KEY,
    owner TEXT NOT NULL,
    name TEXT,
    model TEXT NOT NULL,
    fingerprint TEXT NOT NULL,
    version TEXT NOT NULL,
    tokens INTEGER NOT NULL,
    bytes INTEGER NOT NULL,
    created INTEGER NOT NULL,
    used REAL NOT NULL,
    tools TEXT NOT NULL DEFAULT ''
)
"""
# What version 3 added to version 2's saved states.
_SAVED_TOOLS = "ALTER TABLE saved_states ADD COLUMN tools TEXT NOT NULL DEFAULT ''"


def open_database(path: Path) -> sqlite3.Connection:
    """The store's database at `path`, made or upgraded; StoreError in one line when the
    file is not a usable database."""
    try:
        db = sqlite3.connect(path, check_same_thread=False, isolation_level=None)
    except sqlite3.Error as e:
        raise StoreError(f"{path}: cannot open the response store: {e}") from None
    try:
        db.execute("PRAGMA journal_mode=WAL")
        version = db.execute("PRAGMA user_version").fetchone()[0]
        if version > VERSION:
            raise StoreError(f"{path}: the response store was written by a newer ai00-like (layout {version}); "
                             "upgrade this one, or choose another [responses] path")
        if version < VERSION:
            _upgrade(db, version)
    except sqlite3.Error as e:
        db.close()
        raise StoreError(f"{path}: not a usable response store ({e}); move the file away to start with an "
                         "empty store, or turn the store off with [responses] store = false") from None
    except StoreError:
        db.close()
        raise
    return db


def _upgrade(db: sqlite3.Connection, version: int) -> None:
    db.execute("BEGIN IMMEDIATE")
    try:
        if version < 1:
            db.execute(_TABLE)
            for statement in _ADDED:
                db.execute(statement)
        if version < 2:
            db.execute(_SAVED)
        else:
            db.execute(_SAVED_TOOLS)
        db.execute("CREATE INDEX IF NOT EXISTS saved_states_owner ON saved_states (owner)")
        db.execute(f"PRAGMA user_version = {VERSION}")
        db.execute("COMMIT")
    except BaseException:
        db.execute("ROLLBACK")
        raise
