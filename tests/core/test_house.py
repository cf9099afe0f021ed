"""The repository stands on its own, its import graph has no circle and stays shallow, and
no class or function outgrows the size rules.

A user's clone has nothing beside it, so no tracked file may read from or link to a folder
outside the repository; and every module of the package must be importable in an order,
function-level imports included (a late import that dodges a circle still ties two rooms
into one). A class over 200 lines, a function over 80 or one taking more than 12
parameters is several jobs in one, or a bundle of values that should travel together.
"""

from __future__ import annotations

import ast
import re
import subprocess
from pathlib import Path

import pytest

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


def import_depth(graph: dict[str, set[str]]) -> list[str]:
    """The longest chain of imports in `graph`, first importer first: its depth is one less
    than its length. (An edge that closes a circle is not followed; the test above fails
    on circles anyway.)"""
    longest: dict[str, list[str]] = {}

    def chain(node: str, visiting: set[str]) -> list[str]:
        if node not in longest:
            visiting.add(node)
            tails = [chain(nxt, visiting) for nxt in sorted(graph[node]) if nxt not in visiting]
            visiting.discard(node)
            longest[node] = [node] + max(tails, key=len, default=[])
        return longest[node]

    return max((chain(node, set()) for node in sorted(graph)), key=len, default=[])


# Each import a module needs above it is a layer that a change there reaches through: this
# keeps the chain from growing unnoticed. Lower it when a refactoring shortens the chain.
# 21: Ollama's and Anthropic's routes are translations onto chat's planning, one layer above it.
MAX_IMPORT_DEPTH = 21


def test_the_import_graph_stays_shallow():
    longest = import_depth(import_graph())
    assert len(longest) - 1 <= MAX_IMPORT_DEPTH, (
        f"the longest import chain is {len(longest) - 1} imports deep (at most {MAX_IMPORT_DEPTH}):\n"
        + "\n -> ".join(longest))


def test_the_depth_counts_imports_along_the_longest_chain():
    assert import_depth({"a": {"b", "c"}, "b": {"c"}, "c": set(), "d": set()}) == ["a", "b", "c"]
    assert import_depth({"a": {"b"}, "b": {"a"}}) == ["a", "b"]  # a circle is walked once
    assert import_depth({"a": set()}) == ["a"]


# ------------------------------------------------------------------------------------ sizes

MAX_CLASS_LINES, MAX_FUNCTION_LINES, MAX_PARAMETERS = 200, 80, 12
# A compiled kernel takes its arrays one by one (numba has no struct of arrays to pass):
# one that truly needs more parameters says why in a comment starting so, on its `def`
# line or the line above it (above its decorators, where it has them).
MANY_PARAMETERS = "# more than 12 parameters:"
# Areas the size rules are checked in, one test each: a failure then names its area.
SIZED = {"ai00_like, outside rwkv": (PACKAGE, [PACKAGE / "rwkv"]), "ai00_like/rwkv": (PACKAGE / "rwkv", []),
         # bench/.cache: what the benchmarks build (llama.cpp's own venv), not ours.
         "bench": (ROOT / "bench", [ROOT / "bench" / ".cache"])}


def parameter_count(node: ast.FunctionDef | ast.AsyncFunctionDef) -> int:
    args = node.args
    names = [a.arg for a in args.posonlyargs + args.args + args.kwonlyargs]
    names += [a.arg for a in (args.vararg, args.kwarg) if a is not None]
    return len(names) - (1 if names and names[0] in ("self", "cls") else 0)


def oversized(path: Path) -> list[str]:
    """The classes and functions of `path` over the size rules, nested ones counted on their
    own (a nested function's lines count in its parent's too), each as `path:line name: why`."""
    source = path.read_text(encoding="utf-8")
    lines = source.splitlines()
    found = []
    for node in ast.walk(ast.parse(source, str(path))):
        if not isinstance(node, (ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        length = node.end_lineno - node.lineno + 1
        where = f"{path.relative_to(ROOT) if ROOT in path.parents else path}:{node.lineno} {node.name}"
        if isinstance(node, ast.ClassDef):
            if length > MAX_CLASS_LINES:
                found.append(f"{where}: class of {length} lines (at most {MAX_CLASS_LINES})")
            continue
        if length > MAX_FUNCTION_LINES:
            found.append(f"{where}: function of {length} lines (at most {MAX_FUNCTION_LINES})")
        count = parameter_count(node)
        top = min([node.lineno] + [d.lineno for d in node.decorator_list])
        said = {lines[node.lineno - 1], lines[node.lineno - 2] if node.lineno > 1 else "",
                lines[top - 2] if top > 1 else ""}
        if count > MAX_PARAMETERS and not any(MANY_PARAMETERS in line for line in said):
            found.append(f"{where}: {count} parameters (at most {MAX_PARAMETERS}, or a '{MANY_PARAMETERS}' comment)")
    return found


@pytest.mark.parametrize("area", SIZED)
def test_no_class_or_function_is_over_the_size_rules(area):
    folder, left_out = SIZED[area]
    found = [line for path in sorted(folder.rglob("*.py")) if not any(out in path.parents for out in left_out)
             for line in oversized(path)]
    assert not found, f"over the size rules in {area}:\n" + "\n".join(found)


def test_the_size_check_sees_each_rule(tmp_path):
    body = "\n".join(f"    x{i} = {i}" for i in range(MAX_FUNCTION_LINES))
    params = ", ".join(f"p{i}" for i in range(MAX_PARAMETERS + 1))
    twelve = ", ".join(f"p{i}" for i in range(MAX_PARAMETERS))
    path = tmp_path / "sample.py"
    cases = {
        f"def long():\n{body}\n": ["function of 81 lines"],
        "class Big:\n" + "\n".join(f"    a{i} = {i}" for i in range(MAX_CLASS_LINES)) + "\n": ["class of 201 lines"],
        f"def wide({params}):\n    pass\n": ["13 parameters"],
        f"def wide(self, {twelve}):\n    pass\n": [],  # self is not counted
        f"{MANY_PARAMETERS} numba takes arrays one by one\ndef wide({params}):\n    pass\n": [],
        f"def wide({params}):  {MANY_PARAMETERS} numba\n    pass\n": [],
        f"{MANY_PARAMETERS} numba\n@decorated\ndef wide({params}):\n    pass\n": [],
        f"def outer():\n    def wide({params}):\n        pass\n": ["13 parameters"],
    }
    for source, expected in cases.items():
        path.write_text(source)
        found = oversized(path)
        assert len(found) == len(expected) and all(e in f for e, f in zip(expected, found)), (source, found)
