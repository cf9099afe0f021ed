"""The repository stands on its own and its import graph has no circle.

A user's clone has nothing beside it, so no tracked file may read from or link to a folder
outside the repository; and every module of the package must be importable in an order,
function-level imports included (a late import that dodges a circle still ties two rooms
into one).
"""

from __future__ import annotations

import ast
import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PACKAGE = ROOT / "ai00_like"

# Spelled in pieces so that this file does not match itself.
FOLDER = "sha" + "red"  # the folder of design notes beside a developer's checkout
OUTSIDE = re.compile(
    re.escape("..") + r"[/\\]" + FOLDER  # a relative path to it
    + "|" + f"""["']{FOLDER}["']""" + r"\s*/"  # a path built as Path(...) / "<folder>" / ...
    + "|" + FOLDER + r"/(docs|openai|hooks)\b"  # its subfolders, from any root
)


def tracked_files() -> list[Path]:
    out = subprocess.run(["git", "ls-files", "-z"], cwd=ROOT, capture_output=True)
    if out.returncode == 0:
        return [ROOT / name for name in out.stdout.decode().split("\0") if name]
    # Not a git checkout (an unpacked archive): every file but the ones setup and tests make.
    made = {".venv", ".git", ".pytest_cache", "__pycache__", ".cache", "build", "dist"}
    return [p for p in ROOT.rglob("*") if not made & set(p.relative_to(ROOT).parts)]


def test_no_tracked_file_refers_outside_the_repository():
    offenders = []
    for path in tracked_files():
        if not path.is_file() or path.stat().st_size > 2_000_000:
            continue  # large data files: the vocabulary, the demo model's weights
        text = path.read_bytes().decode("utf-8", errors="ignore")
        for number, line in enumerate(text.splitlines(), 1):
            if OUTSIDE.search(line):
                offenders.append(f"{path.relative_to(ROOT)}:{number}: {line.strip()[:120]}")
    assert not offenders, "files that point outside the repository:\n" + "\n".join(offenders)


def test_the_check_sees_each_form():
    # The patterns above, on lines of the kinds that were once in this repository.
    assert OUTSIDE.search(f"The design is in `../{FOLDER}/docs/design.md`.")
    assert OUTSIDE.search(f'Path(__file__).parents[2] / "{FOLDER}" / "openai" / "x.yaml"')
    assert OUTSIDE.search(f"/work/{FOLDER}/openai/openapi-subset.yaml")
    assert not OUTSIDE.search(f'memory {FOLDER} by all slots; "{FOLDER}" as a word')


# ---------------------------------------------------------------------------------- imports


def module_name(path: Path) -> str:
    parts = list(path.relative_to(ROOT).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imported_modules(path: Path, modules: set[str]) -> set[str]:
    """Every module of the package that `path` imports, wherever the import statement sits."""
    name = module_name(path)
    package = name if path.name == "__init__.py" else name.rpartition(".")[0]
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            targets = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - (node.level - 1)]
                base = ".".join(anchor + ([base] if base else []))
            # `from pkg import mod` imports the module; `from mod import name` the module only.
            targets = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names]
        else:
            continue
        found.update(t for t in targets if t in modules and t != name)
    return found


def import_graph() -> dict[str, set[str]]:
    paths = sorted(PACKAGE.rglob("*.py"))
    modules = {module_name(p) for p in paths}
    return {module_name(p): imported_modules(p, modules) for p in paths}


def circles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(graph[node]):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(graph):
        if node not in index:
            visit(node)
    return found


def test_the_import_graph_has_no_circle():
    found = circles(import_graph())
    assert not found, "import circles (function-level imports counted):\n" + "\n".join(" <-> ".join(c) for c in found)


def test_the_circle_finder_finds_a_late_import(tmp_path):
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}
    assert circles(graph) == [["a", "b", "c"]]
    # And the graph sees imports inside functions.
    graph = import_graph()
    assert "ai00_like.rwkv" in graph["ai00_like.middleware"] or any(
        m.startswith("ai00_like.rwkv") for m in graph["ai00_like.middleware"])
