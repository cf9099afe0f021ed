"""Training data of the bundled demo model: the King James Bible, as plain text and as chat.

The text comes from Debian's `bible-kjv-text` (the public-domain 1611 King James Version,
read with the `bible` program of `bible-kjv`, which apt installs with it):

    apt-get install -y bible-kjv-text
    bible -f Gen1:1-Rev22:21        # one verse a line: "Ge1:1 In the beginning God ..."

Everything here is deterministic: the same text and seed give the same documents, the same
vocabulary and the same token stream. Used by tools/train_demo.py.
"""

from __future__ import annotations

import ast
import collections
import random
import re
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
WORLD_VOCAB = REPO / "assets" / "tokenizer" / "rwkv_vocab_v20230424.txt"

# The 66 books in the order `bible` prints them; its own abbreviations ("Ge", "1Sm", "SSol")
# are replaced by these names, which are also what a user would type in a question.
BOOKS = [
    "Genesis", "Exodus", "Leviticus", "Numbers", "Deuteronomy", "Joshua", "Judges", "Ruth", "1 Samuel",
    "2 Samuel", "1 Kings", "2 Kings", "1 Chronicles", "2 Chronicles", "Ezra", "Nehemiah", "Esther", "Job",
    "Psalms", "Proverbs", "Ecclesiastes", "Song of Solomon", "Isaiah", "Jeremiah", "Lamentations", "Ezekiel",
    "Daniel", "Hosea", "Joel", "Amos", "Obadiah", "Jonah", "Micah", "Nahum", "Habakkuk", "Zephaniah", "Haggai",
    "Zechariah", "Malachi", "Matthew", "Mark", "Luke", "John", "Acts", "Romans", "1 Corinthians",
    "2 Corinthians", "Galatians", "Ephesians", "Philippians", "Colossians", "1 Thessalonians", "2 Thessalonians",
    "1 Timothy", "2 Timothy", "Titus", "Philemon", "Hebrews", "James", "1 Peter", "2 Peter", "1 John", "2 John",
    "3 John", "Jude", "Revelation",
]

# Whole books held out for evaluation (≈ 3% of the text): never trained on, so the held-out
# loss measures generalisation and the tests can prompt with text the model has not seen.
HELD_OUT = ("Ruth", "Esther", "Jonah", "Micah", "Philippians", "Colossians", "James", "1 Peter", "Jude")

CHAT_FRACTION = 0.3  # of chapters rendered as a chat instead of plain text
WORD = re.compile(r"[A-Za-z]+(?:'[A-Za-z]+)*")
_VERSE_LINE = re.compile(r"^(\d?[A-Za-z]+)(\d+):(\d+) (.+)$")


@dataclass(frozen=True)
class Verse:
    book: str
    chapter: int
    verse: int
    text: str

    @property
    def ref(self) -> str:
        return f"{self.book} {self.chapter}:{self.verse}"


def read_kjv(path: str | Path | None = None) -> list[Verse]:
    """All 31,102 verses, from a dump of `bible -f Gen1:1-Rev22:21` or from `bible` itself."""
    if path is not None:
        raw = Path(path).read_text(encoding="utf-8")
    else:
        if shutil.which("bible") is None:
            raise SystemExit("the `bible` program is missing: apt-get install -y bible-kjv-text "
                             "(or pass --kjv FILE made by `bible -f Gen1:1-Rev22:21 > FILE`)")
        raw = subprocess.run(["bible", "-f", "Gen1:1-Rev22:21"], check=True, capture_output=True,
                             text=True).stdout
    verses, abbrevs = [], []
    for lineno, line in enumerate(raw.splitlines(), 1):
        m = _VERSE_LINE.match(line.strip())
        if not m:
            raise SystemExit(f"{path or 'bible'}:{lineno}: not a verse line: {line[:60]!r}")
        if not abbrevs or abbrevs[-1] != m[1]:
            abbrevs.append(m[1])
        verses.append(Verse(BOOKS[len(abbrevs) - 1], int(m[2]), int(m[3]), " ".join(m[4].split())))
    if len(abbrevs) != len(BOOKS):
        raise SystemExit(f"expected {len(BOOKS)} books, found {len(abbrevs)}")
    return verses


def chapters(verses: list[Verse]) -> list[list[Verse]]:
    out: list[list[Verse]] = []
    for v in verses:
        if not out or (out[-1][0].book, out[-1][0].chapter) != (v.book, v.chapter):
            out.append([])
        out[-1].append(v)
    return out


# ---------------------------------------------------------------------------------------------
# Rendering. A document is one chapter, either plain text (a heading line, then one verse a
# line) or a chat in the server's template, one turn per verse. Neither ever contains "\n\n"
# except as the chat template's separator, so an answer ends exactly at the blank line the
# chat route stops on. Documents are joined by token 0 (end-of-text) in the token stream.


def render_plain(chapter: list[Verse]) -> str:
    head = chapter[0]
    return f"{head.book} {head.chapter}\n" + "".join(v.text + "\n" for v in chapter)


def _topic(text: str, rng: random.Random) -> str | None:
    """A content word of the verse (the longest few lower-case words), for 'a verse about X'."""
    words = sorted({w for w in WORD.findall(text) if w.islower() and len(w) >= 5}, key=lambda w: (-len(w), w))
    return rng.choice(words[:3]) if words else None


def chat_turn(v: Verse, rng: random.Random) -> str:
    kind = rng.random()
    words = v.text.split(" ")
    if kind < 0.5 and len(words) >= 6:
        cut = len(words) // 2
        question = f"Continue the verse: {' '.join(words[:cut])}"
        answer = " ".join(words[cut:])
    elif kind < 0.75 and (topic := _topic(v.text, rng)):
        question, answer = f"Tell me a verse about {topic}.", v.text
    else:
        question, answer = f"What does {v.ref} say?", v.text
    return f"User: {question}\n\nAssistant: {answer}\n\n"


def render_chat(chapter: list[Verse], rng: random.Random) -> str:
    return "".join(chat_turn(v, rng) for v in chapter)


def documents(verses: list[Verse], held_out: bool, seed: int = 0) -> list[str]:
    """The rendered chapters of the training books (held_out=False) or the held-out ones."""
    rng = random.Random(seed)  # one stream over all chapters: the split does not shift renders
    docs = []
    for ch in chapters(verses):
        chat = rng.random() < CHAT_FRACTION
        text = render_chat(ch, rng) if chat else render_plain(ch)
        if (ch[0].book in HELD_OUT) == held_out:
            docs.append(text)
    return docs


def word_list(docs: list[str]) -> list[str]:
    """Lower-cased distinct words of the documents, the chat template's words included."""
    return sorted({w.lower() for d in docs for w in WORD.findall(d)})


# ---------------------------------------------------------------------------------------------
# Vocabulary: a subset of the RWKV World vocabulary, chosen for this corpus.


def read_world_lines(path: Path = WORLD_VOCAB) -> dict[int, tuple[str, bytes]]:
    """{World id: (the line's literal as written, token bytes)}; the literal is kept verbatim so
    the subset file is written in exactly the World format."""
    out = {}
    for line in path.read_text(encoding="utf-8").split("\n"):
        line = line.rstrip("\r")
        if not line:
            continue
        first, last = line.find(" "), line.rfind(" ")
        literal = line[first + 1 : last]
        value = ast.literal_eval(literal)
        out[int(line[:first])] = (literal, value.encode("utf-8") if isinstance(value, str) else value)
    return out


def choose_vocab(docs: list[str], size: int, world: dict[int, tuple[str, bytes]], log=print) -> list[int]:
    """World ids of a vocabulary of `size` entries (id 0, the 256 bytes, size-257 longer tokens).

    Start from the World tokens that full-World greedy tokenisation uses on the corpus, then
    repeatedly re-tokenise with the candidate subset and drop the least used longer tokens:
    a token that is dropped splits into others, whose counts then rise. So the kept tokens are
    those the subset tokeniser itself uses most, and none is left unused.
    """
    from ai00_like.rwkv.tokenizer import WorldTokenizer

    data = [d.encode("utf-8") for d in docs]
    byte_ids = [i for i, (_, b) in world.items() if len(b) == 1]
    assert len(byte_ids) == 256
    candidates = {i for i, (_, b) in world.items() if len(b) > 1}
    want = size - 257
    while True:
        tok = WorldTokenizer({i: world[i][1] for i in (*byte_ids, *candidates)})
        counts = collections.Counter(t for d in data for t in tok.encode_bytes(d))
        used = sorted((i for i in candidates if counts[i] > 0), key=lambda i: (-counts[i], i))
        log(f"vocab: {len(candidates)} candidates, {len(used)} used, {sum(counts.values())} tokens")
        if len(used) <= want:
            if len(used) == len(candidates):
                return sorted([*byte_ids, *used])
            candidates = set(used)
            continue
        # Drop at most a third at a time so that counts can redistribute between rounds.
        keep = max(want, len(used) - max(len(used) // 3, 1))
        candidates = set(used[:keep])


def write_vocab(world_ids: list[int], world: dict[int, tuple[str, bytes]], path: Path) -> None:
    """The subset in the World .txt format, renumbered 1..V-1 (id 0 stays end-of-text). The
    bytes keep ids 1..256 as in World; longer tokens follow in World order."""
    lines = [f"{new} {world[old][0]} {len(world[old][1])}" for new, old in enumerate(world_ids, 1)]
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
