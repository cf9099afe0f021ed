"""The suite's tiers, one folder each, from the inside out:

* engine/   the model code, its kernels and its file loaders (ai00_like/rwkv)
* sampler/  sampling, penalties and grammars (ai00_like/sampler)
* core/     the backend, the middleware and the house rules of the tree
* api/      the HTTP routes through real clients, one server in this process
* system/   whole processes: the command line, HAProxy, Redis, Chromium, the wheel

Each tier's fixtures are in its conftest.py; the few that api/ and system/ share are here.
Plain helpers (functions, classes) shared by several tiers live in support/ (on the path
through pyproject.toml); no test module imports another.

Everything in system/ is marked `slow`, and so are the long tests of the other tiers (marked
where they are); `scripts/test.sh --fast` leaves those out.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

TESTS = Path(__file__).resolve().parent
SYSTEM = TESTS / "system"
# The modules that take longest (a minute or more of the whole suite's run on a 2-core
# machine), longest first. pytest-xdist (scripts/test.sh: -n 2 --dist loadfile) hands the
# modules out to its workers in the order collected: these go first, so that at the end no
# worker is left running one of them while the other has nothing to do.
LONGEST = ["engine/test_file_forms.py", "api/test_fuzz.py", "engine/test_gpu.py", "system/test_faults.py",
           "system/test_launcher.py", "engine/test_invariance.py", "system/test_wheel.py", "api/test_prefab.py",
           "system/test_web_page.py", "api/test_many_models.py", "system/test_shared_store.py", "core/test_serving.py"]


def pytest_collection_modifyitems(config, items):
    if "open_webui" not in (config.option.markexpr or ""):  # `-m slow` must not take them in either
        opt_in = [item for item in items if item.get_closest_marker("open_webui") is not None]
        if opt_in:
            config.hook.pytest_deselected(items=opt_in)
            items[:] = [item for item in items if item not in opt_in]
    for item in items:
        if SYSTEM in Path(str(item.fspath)).resolve().parents:
            item.add_marker(pytest.mark.slow)
    if hasattr(config, "workerinput"):  # a pytest-xdist worker: the longest modules first
        def rank(item) -> int:
            where = Path(str(item.fspath)).resolve()
            name = where.relative_to(TESTS).as_posix() if TESTS in where.parents else ""
            return LONGEST.index(name) if name in LONGEST else len(LONGEST)

        items.sort(key=rank)  # stable: each module's tests keep their order


@pytest.fixture(scope="session")
def tiny_model_file(tmp_path_factory) -> Path:
    """api_helpers.write_model's tiny v7 (World vocabulary; narrow and shallow), made once."""
    from api_helpers import write_model  # here: the engine tier need not import the HTTP server

    return write_model(tmp_path_factory.mktemp("tiny") / "tiny.st")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory, tiny_model_file) -> Path:
    """A models folder of the module's own holding tiny.st; its tests may add files to it."""
    folder = tmp_path_factory.mktemp("models")
    shutil.copyfile(tiny_model_file, folder / "tiny.st")
    return folder
