"""Every link and every command in the README, CONTRIBUTING.md and docs/ works.

A reader copies commands out of the documentation and follows its links, so each one is
checked against the thing it names, without running a server or touching the network:

* relative links point at files of the repository, and `#anchors` at headings (GitHub's
  slugs); http(s) links are checked for their form only;
* in ```sh blocks: `ai00-like …` and `python -m ai00_like …` parse with the CLI's own
  argparse parser; `scripts/…`, `bench/…` and `.venv/bin/python FILE` name files that
  exist, and bench scripts' flags are ones their argparse declares (read from the source,
  not imported); `curl` calls a method and path of the server's route table;
* ```toml blocks are valid configs: every key a real key of config.py's Structs.

docs/background/ holds research notes about other projects (Ai00's routes and config, peer
servers): their links are checked, their commands and config blocks are not ours.
"""

from __future__ import annotations

import argparse
import ast
import contextlib
import io
import re
import shlex
import tomllib
import unicodedata
from functools import cache
from pathlib import Path
from urllib.parse import urlsplit

import msgspec
import pytest

ROOT = Path(__file__).resolve().parents[2]
BACKGROUND = ROOT / "docs" / "background"


def documents() -> list[Path]:
    return [ROOT / "README.md", ROOT / "CONTRIBUTING.md", *sorted((ROOT / "docs").rglob("*.md"))]


# ----------------------------------------------------------------------------- Markdown

FENCE = re.compile(r"^ {0,3}(`{3,}|~{3,})\s*([\w+-]*)")


def fenced_blocks(text: str) -> list[tuple[str, str, int]]:
    """(info word, body, line number of the opening fence) of every fenced code block."""
    blocks, lines = [], text.splitlines()
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        fence, info, start = m.group(1), m.group(2).lower(), i + 1
        body = []
        i += 1
        while i < len(lines) and not lines[i].strip().startswith(fence[0] * len(fence)):
            body.append(lines[i])
            i += 1
        blocks.append((info, "\n".join(body), start))
        i += 1
    return blocks


def prose(text: str) -> str:
    """The text outside fenced blocks and inline code, line numbers kept."""
    out, fence = [], None
    for line in text.splitlines():
        m = FENCE.match(line)
        if fence is None and m:
            fence = m.group(1)[0] * len(m.group(1))
            out.append("")
        elif fence is not None:
            if line.strip().startswith(fence):
                fence = None
            out.append("")
        else:
            out.append(re.sub(r"(`+)(?:(?!\1).)+?\1", "", line))
    return "\n".join(out)


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link's text only
    text = text.replace("`", "").strip().lower()
    kept = "".join(c for c in text if c in " -_" or unicodedata.category(c)[0] in "LMN")
    return kept.replace(" ", "-")


def anchors(text: str) -> set[str]:
    found, seen = set(), {}
    for line in prose(text).splitlines():
        m = re.match(r"^ {0,3}#{1,6}\s+(.*?)\s*#*\s*$", line)
        if not m:
            continue
        base = slug(m.group(1))
        n = seen.get(base, 0)
        seen[base] = n + 1
        found.add(base if n == 0 else f"{base}-{n}")
    return found


LINK = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE = re.compile(r"^ {0,3}\[[^\]]+\]:\s*<?(\S+?)>?(?:\s+.*)?$", re.M)


def links(text: str) -> list[tuple[str, int]]:
    found = []
    for number, line in enumerate(prose(text).splitlines(), 1):
        found += [(m.group(1), number) for m in LINK.finditer(line)]
        found += [(m.group(1), number) for m in REFERENCE.finditer(line)]
    return found


def check_link(target: str, source: Path) -> str | None:
    """Why `target`, linked from `source`, is broken; None when it is fine."""
    parts = urlsplit(target)
    if parts.scheme in ("http", "https"):
        try:
            parts.port  # noqa: B018 - raises on a port that is not a number
        except ValueError:
            return f"malformed URL {target!r}"
        if not parts.hostname or any(c.isspace() for c in target):
            return f"malformed URL {target!r}"
        return None
    if parts.scheme == "mailto":
        return None
    if parts.scheme or target.startswith("//"):
        return f"unexpected link scheme in {target!r}"
    path, _, anchor = target.partition("#")
    file = (source.parent / path).resolve() if path else source
    if ROOT not in file.parents and file != ROOT:
        return f"{target!r} leaves the repository"
    if not file.exists():
        return f"{target!r}: no such file"
    if anchor:
        if file.suffix != ".md":
            return f"{target!r}: anchor into a file that is not Markdown"
        if anchor not in anchors(file.read_text(encoding="utf-8")):
            return f"{target!r}: no heading with anchor #{anchor} in {file.relative_to(ROOT)}"
    return None


# ----------------------------------------------------------------------------- commands


def shell_commands(body: str) -> list[list[str]]:
    """The simple commands of a shell block, as argument lists (comments, prompts and
    redirections dropped; `&&`, `||`, `;` and `|` split commands)."""
    commands = []
    for line in body.replace("\\\n", " ").splitlines():
        line = line.strip()
        if line.startswith("$ "):
            line = line[2:]
        if not line or line.startswith("#"):
            continue
        lexer = shlex.shlex(line, posix=True, punctuation_chars=";&|<>")
        lexer.whitespace_split = True
        lexer.commenters = "#"
        words, current, skip = list(lexer), [], False
        for word in words:
            if skip:
                skip = False
            elif word in ("&&", "||", ";", "|", "&"):
                commands.append(current)
                current = []
            elif word in (">", ">>", "<", "2>", "&>"):
                skip = True
            else:
                current.append(word)
        commands.append(current)
    return [c for c in commands if c]


@cache
def cli_parser() -> argparse.ArgumentParser:
    from ai00_like.cli import build_parser

    return build_parser()


def parse_quietly(parser: argparse.ArgumentParser, args: list[str]) -> str | None:
    out = io.StringIO()
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(out):
            parser.parse_args(args)
    except SystemExit as e:
        if e.code:
            return out.getvalue().strip() or f"exit status {e.code}"
    return None


@cache
def script_parser(path: Path) -> argparse.ArgumentParser:
    """The argparse parser a script declares, rebuilt from its add_argument calls' literal
    arguments (the script is not imported: benchmarks import heavy things at the top)."""
    parser = argparse.ArgumentParser(prog=path.name, add_help=True, exit_on_error=True)
    builtin_types = {"int": int, "float": float, "str": str}
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr == "add_argument"):
            continue
        names = [a.value for a in node.args if isinstance(a, ast.Constant) and isinstance(a.value, str)]
        kwargs = {}
        for kw in node.keywords:
            if kw.arg in ("action", "nargs"):
                kwargs[kw.arg] = ast.literal_eval(kw.value)
            elif kw.arg == "type" and isinstance(kw.value, ast.Name) and kw.value.id in builtin_types:
                kwargs["type"] = builtin_types[kw.value.id]
            elif kw.arg == "choices":
                with contextlib.suppress(ValueError):
                    kwargs["choices"] = ast.literal_eval(kw.value)
        if names and names[0].startswith("-"):
            parser.add_argument(*names, **kwargs)
        elif names:
            parser.add_argument(names[0], nargs=kwargs.get("nargs", "?"))
    return parser


@cache
def route_table() -> list[tuple[str, re.Pattern]]:
    from ai00_like.api.app import all_routes
    from ai00_like.api.openapi import OPENAPI_PATH

    def pattern(path: str) -> re.Pattern:
        # aiohttp's {name} is one path segment; {name:regex} is that regex.
        pieces = re.split(r"\{\w+(?::([^}]+))?\}", path)
        regex = "".join(re.escape(piece) if n % 2 == 0 else f"(?:{piece or '[^/]+'})"
                        for n, piece in enumerate(pieces))
        return re.compile(regex + "$")

    table = [(route.method, pattern(path)) for path, route in all_routes()]
    table += [("GET", re.compile(re.escape(OPENAPI_PATH) + "$")), ("GET", re.compile("/$"))]  # the web page
    return table


def check_curl(args: list[str]) -> str | None:
    method, url, data = None, None, False
    i = 0
    while i < len(args):
        arg = args[i]
        if arg in ("-X", "--request"):
            method, i = args[i + 1].upper(), i + 2
            continue
        if arg in ("-d", "--data", "--data-raw", "--data-binary", "--json", "-F", "--form"):
            data, i = True, i + 2
            continue
        if arg in ("-H", "--header", "-o", "--output", "-u", "--user", "--cacert", "-w"):
            i += 2
            continue
        if re.match(r"https?://", arg):
            url = arg
        i += 1
    if url is None:
        return "curl without an http(s) URL"
    method = method or ("POST" if data else "GET")
    path = urlsplit(url).path or "/"
    if any(m == method and p.match(path) for m, p in route_table()):
        return None
    return f"no route {method} {path} in the server's route table"


def check_command(args: list[str]) -> str | None:
    """Why a documented command would not work; None when it would, or is not ours to check."""
    while args and re.match(r"^[A-Za-z_][A-Za-z0-9_]*=", args[0]):
        args = args[1:]  # VAR=value prefixes
    if not args:
        return None
    head, rest = args[0], args[1:]
    if head in ("ai00-like", ".venv/bin/ai00-like"):
        return cli_problem(rest)
    if re.fullmatch(r"(\.venv/bin/)?python3?", head):
        if rest[:2] == ["-m", "ai00_like"]:
            return cli_problem(rest[2:])
        if rest[:2] == ["-m", "pytest"]:
            missing = [a.split("::")[0] for a in rest[2:]
                       if not a.startswith("-") and ("/" in a or a.endswith(".py"))
                       and not (ROOT / a.split("::")[0]).exists()]
            return f"pytest paths that do not exist: {missing}" if missing else None
        if rest and not rest[0].startswith("-"):
            return check_file(rest[0], rest[1:])
        return None
    if head.startswith(("scripts/", "bench/", "tests/", "tools/")):
        return check_file(head, rest)
    if head == "curl":
        return check_curl(rest)
    return None


def cli_problem(args: list[str]) -> str | None:
    problem = parse_quietly(cli_parser(), args)
    return f"ai00-like {' '.join(args)}: {problem}" if problem else None


def check_file(name: str, args: list[str]) -> str | None:
    path = ROOT / name
    if not path.is_file():
        return f"{name}: no such file"
    if name == "scripts/serve.sh":  # passes its arguments on to ai00-like
        return cli_problem(args)
    if name.startswith("bench/") and path.suffix == ".py" and args:
        problem = parse_quietly(script_parser(path), args)
        return f"{name} {' '.join(args)}: {problem}" if problem else None
    return None


# ----------------------------------------------------------------------------- config


def check_toml(body: str) -> str | None:
    from ai00_like.config import Config, ConfigError, parse_config

    try:
        raw = tomllib.loads(body)
    except tomllib.TOMLDecodeError as e:
        return f"not valid TOML: {e}"
    internal = {"base_dir", "source"} & set(raw)
    if internal:
        return f"not keys of config.toml: {sorted(internal)}"
    try:
        msgspec.convert(raw, Config)  # strict: Ai00's ignored keys are not keys to document
        parse_config(body, source="block")  # and the checks beyond the types
    except msgspec.ValidationError as e:
        return f"not a valid config: {e}"
    except ConfigError as e:
        return str(e)
    return None


# ----------------------------------------------------------------------------- the checks


def problems_in(path: Path) -> list[str]:
    text = path.read_text(encoding="utf-8")
    where = path.relative_to(ROOT)
    found = [f"{where}:{line}: {why}" for target, line in links(text) if (why := check_link(target, path))]
    if BACKGROUND in path.parents:
        return found
    for info, body, line in fenced_blocks(text):
        if info in ("sh", "bash", "shell", "console"):
            found += [f"{where}:{line}: {why}" for args in shell_commands(body) if (why := check_command(args))]
        elif info == "toml":
            if why := check_toml(body):
                found.append(f"{where}:{line}: {why}")
        elif info == "python":
            try:
                ast.parse(body)
            except SyntaxError as e:
                found.append(f"{where}:{line}: Python that does not parse: {e}")
    return found


@pytest.mark.parametrize("path", documents(), ids=lambda p: str(p.relative_to(ROOT)))
def test_every_link_and_command_works(path):
    found = problems_in(path)
    assert not found, "\n".join(found)


def test_the_documents_are_found():
    names = {str(p.relative_to(ROOT)) for p in documents()}
    assert {"README.md", "CONTRIBUTING.md", "docs/api.md", "docs/background/rwkv-spec.md"} <= names


def test_the_readme_keeps_its_two_commands():
    blocks = [body.strip() for info, body, _ in fenced_blocks((ROOT / "README.md").read_text()) if info == "sh"]
    assert "scripts/serve.sh" in blocks and "scripts/test.sh" in blocks


# ------------------------------------------------------------- the checker, on bad input


def test_a_broken_link_is_found(tmp_path):
    source = ROOT / "docs" / "x.md"
    assert check_link("api.md", source) is None
    assert check_link("no-such-page.md", source)
    assert check_link("../README.md#quick-start", source) is None
    assert "no heading" in check_link("../README.md#no-such-section", source)
    assert check_link("https://github.com/BlinkDL/RWKV-LM", source) is None
    assert check_link("https://", source)
    assert check_link("http://localhost:3000", source) is None
    assert check_link("http://localhost:port/x", source)
    assert check_link("ftp://example.com/x", source)
    assert check_link("../../outside.md", source)


def test_links_are_read_from_prose_only():
    text = "See [a](a.md) and [b][1].\n\n[1]: b.md\n\n```sh\n[c](c.md)\n```\n`[d](d.md)`\n"
    assert [t for t, _ in links(text)] == ["a.md", "b.md"]


def test_slugs_follow_github():
    assert slug("The Responses API") == "the-responses-api"
    assert slug("`[listen]` keys, and more!") == "listen-keys-and-more"
    assert slug("numba's on-disk cache") == "numbas-on-disk-cache"
    assert anchors("# A\n## A\n```\n# not a heading\n```\n") == {"a", "a-1"}


def test_an_unknown_flag_is_found():
    assert check_command(["ai00-like", "pull", "--list"]) is None
    assert check_command(["ai00-like", "--port", "8000", "--ip", "0.0.0.0"]) is None
    assert "unrecognized" in check_command(["ai00-like", "pull", "--no-such-flag"])
    assert check_command(["ai00-like", "convert", "a.pth", "--dtype", "int3"])
    assert check_command(["scripts/serve.sh", "--port", "8000"]) is None
    assert check_command(["scripts/serve.sh", "--bogus"])
    assert check_command([".venv/bin/python", "bench/engine.py", "--quick"]) is None
    assert check_command([".venv/bin/python", "bench/engine.py", "--no-such-flag"])
    assert check_command([".venv/bin/python", "bench/no_such_bench.py"])
    assert check_command(["scripts/no_such_script.sh"])
    assert check_command([".venv/bin/python", "-m", "pytest", "tests/no_such_test.py"])


def test_an_unknown_route_is_found():
    assert check_command(["curl", "http://127.0.0.1:65530/v1/models/demo"]) is None
    assert check_command(["curl", "http://h:1/v1/responses/resp_1/input_items"]) is None
    assert check_command(["curl", "-X", "POST", "http://h:1/admin/models/unload"]) is None
    assert check_command(["curl", "http://h:1/v1/chat/completions", "-d", "{}"]) is None
    assert "no route GET /v1/chat/completions" in check_command(["curl", "http://h:1/v1/chat/completions"])
    assert check_command(["curl", "http://h:1/v1/no/such/route"])
    assert check_command(["curl", "-X", "DELETE", "http://h:1/v1/models"])


def test_shell_lines_split_into_commands():
    body = "# a comment\n$ FOO=1 ai00-like --port 1 && curl http://h/health | head  # done\nx \\\n  y > out.txt\n"
    assert shell_commands(body) == [["FOO=1", "ai00-like", "--port", "1"], ["curl", "http://h/health"], ["head"],
                                    ["x", "y"]]


def test_an_unknown_config_key_is_found():
    assert check_toml('[model]\nname = "demo.st"\nmax_batch = 4\n') is None
    assert check_toml('[model]\nmax_batchh = 4\n')
    assert check_toml('[listen]\nport = "many"\n')
    assert check_toml('[model]\nstop = ["\\n"]\n')  # an Ai00 key we only tolerate
    assert check_toml('[store]\nurl = "http://not-redis"\n')
    assert check_toml('base_dir = "."\n')
    assert check_toml('[model\n')
