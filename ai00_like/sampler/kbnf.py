"""Ai00's KBNF grammars (`bnf_schema`) translated into the Lark dialect llguidance reads.

KBNF as Ai00 accepts it (kbnf 0.5, ai00-reference §5.8)::

    start ::= json_object;                      (* rules end with ';' *)
    json_object ::= "{\\n" members "\\n}";
    content ::= #"\\\\w*";                        (* #"…" is a regular expression *)
    item ::= 'a' | ("b" c)? | [d] | {e} | f* | g+ | except!('"');

Terminals are '…' or "…" with backslash escapes; `#"…"` (also `#e`, `#ex` for the
complement: any text that does not contain a match) are regular expressions; `[x]` is
optional and `{x}` repeats zero or more times (EBNF), as `x?` and `x*`; `except!(S)` is any
non-empty text that does not contain S (a string, or a rule made of strings). The start rule
is `start`. Names become lowercase Lark rule names under a prefix, so any KBNF name works
and none clashes with the rules we put around a grammar (tool calls, a leading space).

Differences that remain: llguidance lexes terminals greedily, where kbnf parses byte by
byte; a grammar whose regular expression could swallow the terminal after it (`#"[a-z]*"
"x"`) accepts less here than in Ai00.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from .grammar import GrammarError

# Ai00's README example grammar in its own dialect, what `bnf_schema` must accept: the rules
# ai00-reference §5.8 quotes (start, json_object, content) as written there, the rest in its style.
AI00_README_EXAMPLE = r'''start::=json_object;
json_object::="{\n"object_members"\n}";
object_members::=json_member | json_member",\n"object_members;
json_member::="\t"json_key": "json_value;
json_key::='"' ("name" | "age" | "job") '"';
json_value::=json_string | json_number;
json_string::='"'content'"';
content::=#"\\w*";
json_number::=#"[0-9]+";
'''

_TOKEN = re.compile(
    r"""
    (?P<ws>\s+|\(\*.*?\*\))
  | (?P<define>::=)
  | (?P<regex>\#(?:ex|e|s|sx)?(?P<rq>["'])(?:\\.|(?!(?P=rq)).)*(?P=rq))
  | (?P<string>(?P<q>["'])(?:\\.|(?!(?P=q)).)*(?P=q))
  | (?P<except>except!)
  | (?P<name>[A-Za-z_][A-Za-z0-9_]*)
  | (?P<punct>[|;()\[\]{}?*+,])
  | (?P<number>[0-9]+)
    """,
    re.VERBOSE | re.DOTALL,
)

_ESCAPES = {"n": "\n", "t": "\t", "r": "\r", "0": "\0", "\\": "\\", '"': '"', "'": "'", "/": "/", "b": "\b",
            "f": "\f"}


@dataclass
class _Tok:
    kind: str
    text: str
    pos: int


def kbnf_to_lark(source: str, prefix: str = "k_") -> tuple[str, str]:
    """(Lark rules, the name of the translated start rule). Raises GrammarError on bad input."""
    parser = _Parser(source, prefix)
    return parser.translate(), parser.rule_name("start")


def _unescape(body: str, where: str) -> str:
    out, i = [], 0
    while i < len(body):
        c = body[i]
        if c != "\\":
            out.append(c)
            i += 1
            continue
        if i + 1 >= len(body):
            raise GrammarError(f"{where}: a string ends with a lone backslash")
        e = body[i + 1]
        if e in _ESCAPES:
            out.append(_ESCAPES[e])
            i += 2
        elif e == "x" and re.fullmatch(r"[0-9a-fA-F]{2}", body[i + 2 : i + 4]):
            out.append(chr(int(body[i + 2 : i + 4], 16)))
            i += 4
        elif e == "u" and re.fullmatch(r"[0-9a-fA-F]{4}", body[i + 2 : i + 6]):
            out.append(chr(int(body[i + 2 : i + 6], 16)))
            i += 6
        else:
            # Kept as written: inside a regular expression \w, \d, \. and friends mean themselves.
            out.append(body[i : i + 2])
            i += 2
    return "".join(out)


def _lark_string(text: str) -> str:
    return json.dumps(text, ensure_ascii=False)


def _lark_regex(pattern: str) -> str:
    return "/" + pattern.replace("/", "\\/") + "/"


def _not_containing(pattern: str) -> str:
    """A Lark token expression: non-empty text that contains no match of `pattern`."""
    return f"/(?s:.+)/ & ~{_lark_regex(f'(?s:.*)(?:{pattern})(?s:.*)')}"


class _Parser:
    def __init__(self, source: str, prefix: str):
        self.source, self.prefix = source, prefix
        self.tokens = self._tokenize(source)
        self.i = 0
        self.names: dict[str, str] = {}
        self.strings_of: dict[str, list[str] | None] = {}  # rule → its strings, for except!(rule)
        self.lexemes: list[str] = []  # extra rules: tokens (Lark allows `&` and `~` only there), up-to rules
        self.pending: list[tuple[int, str, str]] = []  # except!(rule): (lexeme index, rule, kind), filled at the end
        self.except_names: dict[str, int] = {}  # rule → where except! names it

    def where(self, pos: int) -> str:
        line = self.source.count("\n", 0, pos) + 1
        column = pos - (self.source.rfind("\n", 0, pos) + 1) + 1
        return f"bnf_schema line {line} column {column}"

    def _tokenize(self, source: str) -> list[_Tok]:
        tokens, pos = [], 0
        while pos < len(source):
            m = _TOKEN.match(source, pos)
            if m is None:
                raise GrammarError(f"{self.where(pos)}: unexpected {source[pos:pos + 10]!r}")
            kind = m.lastgroup
            if kind in ("rq", "q"):
                kind = "regex" if m.group("regex") else "string"
            if kind != "ws":
                tokens.append(_Tok(kind, m.group(0), pos))
            pos = m.end()
        return tokens

    def rule_name(self, name: str) -> str:
        if name not in self.names:
            self.names[name] = f"{self.prefix}{name.lower()}_{len(self.names)}"
        return self.names[name]

    def peek(self) -> _Tok | None:
        return self.tokens[self.i] if self.i < len(self.tokens) else None

    def take(self, text: str | None = None, kind: str | None = None) -> _Tok:
        tok = self.peek()
        if tok is None:
            wanted = f"'{text}'" if text else kind
            raise GrammarError(f"bnf_schema: the grammar ends where {wanted} was expected")
        if (text is not None and tok.text != text) or (kind is not None and tok.kind != kind):
            wanted = f"'{text}'" if text else f"a {kind}"
            raise GrammarError(f"{self.where(tok.pos)}: expected {wanted}, found {tok.text!r}")
        self.i += 1
        return tok

    def translate(self) -> str:
        rules, defined, used = [], {}, {}
        while self.peek() is not None:
            name = self.take(kind="name")
            self.take("::=")
            self.current_strings: list[str] | None = []
            body = self.alternation(used)
            self.take(";")
            if name.text in defined:
                raise GrammarError(f"{self.where(name.pos)}: rule '{name.text}' is defined twice")
            defined[name.text] = name.pos
            self.strings_of[name.text] = self.current_strings
            rules.append(f"{self.rule_name(name.text)}: {body}")
        if "start" not in defined:
            raise GrammarError("bnf_schema: there is no 'start' rule (the grammar begins at 'start')")
        for name, pos in used.items():
            if name not in defined:
                raise GrammarError(f"{self.where(pos)}: rule '{name}' is used but never defined")
        for rule, pos in self.except_names.items():
            texts = self.strings_of.get(rule)
            if not texts or not all(texts):
                raise GrammarError(f"{self.where(pos)}: except!({rule}) needs '{rule}' to be an alternation of "
                                   "non-empty strings")
        for index, rule, kind in self.pending:
            pattern = "|".join(re.escape(t) for t in self.strings_of[rule])
            name = self.lexemes[index].split(":", 1)[0]
            self.lexemes[index] = (f"{name}[suffix={_lark_regex(pattern)}]: /(?s:.+)/" if kind == "suffix"
                                   else f"{name}: {_not_containing(pattern)}")
        return "\n".join(rules + self.lexemes)

    def lexeme(self, expression: str) -> str:
        name = f"{self.prefix.upper()}LEXEME_{len(self.lexemes)}"
        self.lexemes.append(f"{name}: {expression}")
        return name

    def alternation(self, used) -> str:
        parts = [self.sequence(used)]
        while (tok := self.peek()) is not None and tok.text == "|":
            self.take("|")
            parts.append(self.sequence(used))
        return " | ".join(parts)

    def sequence(self, used) -> str:
        items = []  # (Lark text, what the atom was: ("string", text), ("name", name), ("except", tok), None)
        while (tok := self.peek()) is not None and tok.text not in ("|", ";", ")", "]", "}", ","):
            items.append(self.factor(used))
        if not items:
            where = self.where(tok.pos) if tok is not None else "bnf_schema"
            raise GrammarError(f"{where}: an empty alternative (write '\"\"' for the empty text)")
        if len(items) > 1:
            self.current_strings = None  # not a plain string any more
        out, i = [], 0
        while i < len(items):
            text, what = items[i]
            if what and what[0] == "except" and i + 1 < len(items) and items[i + 1][1] == what[1]:
                out.append(self.up_to(what[1]))  # except!(X) X: the text, then the first X
                i += 2
                continue
            if what and what[0] == "except":
                text = self.lexeme_for(what[1])
            out.append(text)
            i += 1
        return " ".join(out)

    def up_to(self, what) -> str:
        """A rule for `except!(X) X`: any text up to and including the first X. A lexeme for
        except!(X) alone would end greedily at "…</b" before the X "</b>" and fail."""
        name = f"{self.prefix}up_to_{len(self.lexemes)}"
        if what[0] == "string":
            self.lexemes.append(f"{name}[suffix={_lark_string(what[1])}]: /(?s:.+)/")
        else:
            self.pending.append((len(self.lexemes), what[1], "suffix"))
            self.lexemes.append(name)
        return name

    def lexeme_for(self, what) -> str:
        if what[0] == "string":
            return self.lexeme(_not_containing(re.escape(what[1])))
        self.pending.append((len(self.lexemes), what[1], "lexeme"))
        return self.lexeme("")

    def factor(self, used) -> tuple[str, tuple | None]:
        atom, what = self.atom(used)
        tok = self.peek()
        if tok is not None and tok.text in ("?", "*", "+"):
            self.take()
            self.current_strings = None
            if what and what[0] == "except":
                atom = self.lexeme_for(what[1])
            return f"({atom}){tok.text}", None
        return atom, what

    def atom(self, used) -> str:
        tok = self.take()
        if tok.kind == "string":
            text = _unescape(tok.text[1:-1], self.where(tok.pos))
            if self.current_strings is not None:
                self.current_strings.append(text)
            return (_lark_string(text) if text else '""'), ("string", text)
        self.current_strings = None
        if tok.kind == "name":
            used.setdefault(tok.text, tok.pos)
            return self.rule_name(tok.text), ("name", tok.text)
        if tok.kind == "except":
            return "", ("except", self.excepted())
        return self.group(tok, used), None

    def group(self, tok: _Tok, used) -> str:
        if tok.kind == "regex":
            flags, body = re.fullmatch(r"#(ex|e|sx|s)?[\"'](.*)[\"']", tok.text, re.DOTALL).groups()
            pattern = _unescape(body, self.where(tok.pos))
            try:
                re.compile(pattern)
            except re.error as e:
                raise GrammarError(f"{self.where(tok.pos)}: invalid regular expression {pattern!r}: {e}") from None
            if flags == "ex":  # complement: text that does not contain a match
                return self.lexeme(_not_containing(pattern))
            return _lark_regex(pattern)
        if tok.text == "(":
            inner = self.alternation(used)
            self.take(")")
            return f"({inner})"
        if tok.text == "[":
            inner = self.alternation(used)
            self.take("]")
            return f"({inner})?"
        if tok.text == "{":
            inner = self.alternation(used)
            self.take("}")
            return f"({inner})*"
        raise GrammarError(f"{self.where(tok.pos)}: unexpected {tok.text!r}")

    def excepted(self) -> tuple[str, str]:
        """except!(X): ("string", X) or ("name", rule of strings)."""
        self.take("(")
        tok = self.take()
        if tok.kind not in ("string", "name"):
            raise GrammarError(f"{self.where(tok.pos)}: except! takes a string or a rule of strings")
        if (nxt := self.peek()) is not None and nxt.text == ",":
            raise GrammarError(f"{self.where(nxt.pos)}: except! with a repetition limit is not supported")
        self.take(")")
        if tok.kind == "name":  # the rule may come later: resolved once every rule is read
            self.except_names.setdefault(tok.text, tok.pos)
            return ("name", tok.text)
        text = _unescape(tok.text[1:-1], self.where(tok.pos))
        if not text:
            raise GrammarError(f"{self.where(tok.pos)}: except! of an empty string excludes everything")
        return ("string", text)
