"""A benchmark's results as a JSON file in bench/results/, stamped with what they were
measured on.

A figure copied from a terminal loses the commit, the machine and the flags it came from;
a file per run keeps them, so runs can be compared across commits and machines (and read
back by a script, not retyped). The file is `<bench>-<YYYY-MM-DD>-<short commit>.json`
(UTC date); a second run of the same benchmark on the same day and commit replaces it.

Every benchmark saves by default; `--no-save` (which each script declares itself, so
that the docs check can read its flags from its source) prints only.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
import sys
from datetime import datetime, timezone
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "bench" / "results"
NO_SAVE_HELP = "print the results only; do not write them to bench/results/"


def save(name: str, results: dict, args, folder: Path = RESULTS) -> Path | None:
    """Write `results` of benchmark `name`, run with the parsed `args`, unless args.no_save;
    returns the file's path."""
    if getattr(args, "no_save", False):
        return None
    now = datetime.now(timezone.utc)
    commit, dirty = git_commit()
    record = {
        "bench": name,
        "date": now.strftime("%Y-%m-%d"),
        "time_utc": now.strftime("%H:%M:%S"),
        "commit": commit,
        "dirty": dirty,
        "machine": machine(),
        "argv": sys.argv[1:],
        "args": dict(vars(args)),
        "results": results,
    }
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / f"{name}-{record['date']}-{commit}.json"
    for n in range(2, 100):  # another run of the same commit that day (another shape, say) is kept
        if not path.exists():
            break
        path = folder / f"{name}-{record['date']}-{commit}-{n}.json"
    # default=str: a Path or a numpy scalar among the arguments or figures.
    path.write_text(json.dumps(record, indent=1, default=str) + "\n", encoding="utf-8")
    # On stderr: stdout's last line stays the results' JSON line, for whoever parses it.
    print(f"results saved to {_shown(path)}", file=sys.stderr)
    return path


def load(path: Path) -> dict:
    """A saved file, as save wrote it."""
    return json.loads(Path(path).read_text(encoding="utf-8"))


def git_commit() -> tuple[str, bool | None]:
    """(short commit, whether tracked files differ from it); ("nogit", None) outside a checkout.

    --no-optional-locks: `git status` would otherwise refresh the index, a write, while
    others may be working in the same checkout. Untracked files do not count as dirty
    (the results folder itself fills with them). A copy of the tree without its .git (as
    the GPU machine gets) names its commit in BENCH_COMMIT."""
    if os.environ.get("BENCH_COMMIT"):
        return os.environ["BENCH_COMMIT"], None
    try:
        head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True)
        status = subprocess.run(["git", "--no-optional-locks", "status", "--porcelain", "--untracked-files=no"],
                                cwd=ROOT, capture_output=True, text=True)
    except OSError:
        return "nogit", None
    if head.returncode != 0 or status.returncode != 0:
        return "nogit", None
    return head.stdout.strip(), bool(status.stdout.strip())


def machine() -> dict:
    """The CPU, its cores and the versions that move figures."""
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:  # not Linux
        usable = os.cpu_count()
    return {
        "cpu": cpu_model(),
        "cores": os.cpu_count(),
        "usable_cores": usable,
        "platform": platform.platform(),
        "python": platform.python_version(),
        "numpy": _version("numpy"),
        "numba": _version("numba"),
    }


def cpu_model() -> str:
    try:
        with open("/proc/cpuinfo", encoding="utf-8") as info:
            for line in info:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def _version(package: str) -> str | None:
    # From the installed metadata: importing numba only to read its version takes seconds.
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:
        return None


def _shown(path: Path) -> str:
    try:
        return str(path.relative_to(ROOT))
    except ValueError:
        return str(path)
