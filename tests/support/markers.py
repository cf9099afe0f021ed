"""Marking tests from a tier's conftest.py, by name, without touching their modules."""

from __future__ import annotations

from pathlib import Path

import pytest


def mark_slow(items, folder: Path, names: dict[str, set[str]]) -> None:
    """Mark `slow` each test of `folder` whose module and name (`test_x`, or with its
    parameters `test_x[a-b]`) are listed in `names`: {"test_module.py": {"test_x", ...}}."""
    for item in items:
        path = Path(str(item.fspath))
        if path.parent != folder:
            continue
        listed = names.get(path.name, ())
        if item.name in listed or getattr(item, "originalname", item.name) in listed:
            item.add_marker(pytest.mark.slow)
