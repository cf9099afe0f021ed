"""Names and times as Ollama writes them: model names with tags, RFC 3339 timestamps."""

from __future__ import annotations

import time
from datetime import UTC, datetime

from ..errors import bad_request

LATEST = ":latest"  # Ollama's default tag: clients may add it to any name


def rfc3339(moment: float | None = None) -> str:
    stamp = datetime.fromtimestamp(time.time() if moment is None else moment, UTC)
    return stamp.isoformat().replace("+00:00", "Z")


def served_name(serving, name: str) -> str:
    """The model a request names, `:latest` dropped when no model is called so; a 400 when it names none."""
    if not name:
        raise bad_request("model is required", "model")
    if name.endswith(LATEST) and not any(name in e.served.names() for e in serving.pool.entries.values()):
        return name[: -len(LATEST)]
    return name
