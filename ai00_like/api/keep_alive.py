"""A request's `keep_alive`, as Ollama reads it: seconds, or a duration ("5m", "1h30m",
"90s", "500ms"); a negative value keeps the model loaded, 0 unloads it once idle."""

from __future__ import annotations

import re

from .errors import bad_request

_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h)")
_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}


def keep_alive_seconds(value: float | str | None) -> float | None:
    """Seconds (-1 for "keep it loaded"), or None when the request did not say; a 400
    naming `keep_alive` for anything that is not a duration."""
    if value is None:
        return None
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return -1.0 if value < 0 else float(value)
    text = str(value).strip()
    try:
        return keep_alive_seconds(float(text))
    except ValueError:
        pass
    negative = text.startswith("-")
    body = text.lstrip("-")
    parts = _PART.findall(body)
    if not body or not parts or "".join(n + u for n, u in parts) != body:
        raise bad_request(f"'keep_alive' must be seconds or a duration such as \"5m\" or \"1h30m\", got {value!r}",
                          "keep_alive")
    return -1.0 if negative else sum(float(n) * _SECONDS[u] for n, u in parts)
