"""The suite's tiers, one folder each, from the inside out:

* engine/   the model code, its kernels and its file loaders (ai00_like/rwkv)
* sampler/  sampling, penalties and grammars (ai00_like/sampler)
* core/     the backend, the middleware and the house rules of the tree
* api/      the HTTP routes through real clients, one server in this process
* system/   whole processes: the command line, HAProxy, Redis, Chromium, the wheel

Helpers shared by several tiers live in support/ (on the path through pyproject.toml).
Everything in system/ is marked `slow`; `scripts/test.sh --fast` leaves those out.
"""

from __future__ import annotations

from pathlib import Path

import pytest

SYSTEM = Path(__file__).resolve().parent / "system"


def pytest_collection_modifyitems(items):
    for item in items:
        if SYSTEM in Path(str(item.fspath)).resolve().parents:
            item.add_marker(pytest.mark.slow)
