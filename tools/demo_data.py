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


def crosses_json_opening(token: bytes) -> bool:
    """A token that would join the space after a JSON colon to what follows (' {"', ' [', ' "In').

    The server writes a forced tool call's opening as '<tool_call>{"name": "f", "arguments": '
    and stops the prompt there, after the space. With such tokens in the vocabulary, the same
    text inside the training data always tokenises with the space merged into the next token,
    so the model would never have seen a lone space token in that place and would not continue
    the prompt as it continues its own calls. Without them, both tokenise alike. (' "' alone
    stays: it is what the prompt ends with before a name.)"""
    return token[:2] in (b" {", b" [") or (token[:2] == b' "' and len(token) > 2)


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
    candidates = {i for i, (_, b) in world.items() if len(b) > 1 and not crosses_json_opening(b)}
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


# ---------------------------------------------------------------------------------------------
# Synthetic chats in the RWKV7-G1 format: thinking, short JSON answers and tool calls.
#
# Built from the training books' verses only (never the held-out ones). Each document is one
# chat as the server renders it (ai00_like.api.oai.tools / prompt: the offered tools, earlier
# calls and the Observation turns byte for byte) followed by the model's reply. The server
# gives earlier assistant turns back without their thinking, so only the last reply of a
# document thinks. Every turn is free of "\n\n": a blank line occurs only as the separator.

EFFORTS = ((" think a bit", 1, 1), (" think", 2, 2), (" think a lot", 3, 5), ("", 2, 2))
ORDINALS = ["first", "second", "third", "fourth", "fifth", "sixth", "seventh", "eighth", "ninth", "tenth",
            "eleventh", "twelfth", "thirteenth", "fourteenth", "fifteenth", "sixteenth", "seventeenth",
            "eighteenth", "nineteenth", "twentieth"]
NOT_NAMES = {"God", "LORD", "Lord", "And", "But", "For", "Then", "Now", "The", "Thus", "I", "O", "Behold",
             "Jesus", "Christ", "He", "And", "So", "When", "Therefore", "Israel"}
CITIES = ["Jerusalem", "Babylon", "Damascus", "Nineveh", "Bethlehem", "Jericho", "Samaria", "Tyre", "Sidon",
          "Egypt", "Rome", "Corinth", "Ephesus", "Antioch", "Hebron", "Gaza", "London", "Paris", "Cairo",
          "Athens", "Berlin", "Tokyo", "Lisbon", "Dublin"]
SKIES = ["clear", "cloudy", "rain", "wind", "snow", "hot and dry", "fair"]
NUMBER_WORDS = ["nought", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine", "ten",
                "eleven", "twelve"]


def ordinal(n: int) -> str:
    if n <= len(ORDINALS):
        return ORDINALS[n - 1]
    return f"{n}{'th' if n % 100 in (11, 12, 13) else {1: 'st', 2: 'nd', 3: 'rd'}.get(n % 10, 'th')}"


def compact_json(value) -> str:
    from ai00_like.api.oai.tools import compact

    return compact(value)


def short_text(text: str, rng: random.Random, most: int = 8) -> str:
    """The verse, or its first few words when it is long (a JSON value well under 64 tokens)."""
    words = text.split(" ")
    if len(words) <= most:
        return text
    return " ".join(words[: rng.randint(max(4, most - 3), most)]).rstrip(",;:")


def _names(text: str) -> list[str]:
    words = WORD.findall(text)
    return [w for i, w in enumerate(words) if i > 0 and w[0].isupper() and w not in NOT_NAMES and len(w) > 2
            and not w.isupper()]


class G1Maker:
    """Renders the G1 examples; one deterministic random stream for all of them."""

    def __init__(self, verses: list[Verse], seed: int):
        self.rng = random.Random(seed * 7919 + 17)
        self.verses = [v for v in verses if v.book not in HELD_OUT]
        self.books = [b for b in BOOKS if b not in HELD_OUT]
        self.by_book: dict[str, list[Verse]] = collections.defaultdict(list)
        self.word_count: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
        self.first_ref: dict[str, Verse] = {}
        self.name_count: collections.Counter = collections.Counter()
        for v in self.verses:
            self.by_book[v.book].append(v)
            for w in WORD.findall(v.text):
                self.word_count[v.book][w.lower()] += 1
                self.first_ref.setdefault(w.lower(), v)
            for n in set(_names(v.text)):
                self.name_count[n] += 1
        self.names = sorted(n for n, c in self.name_count.items() if c >= 8)
        self.chapters = chapters(self.verses)

    # -------------------------------------------------------------- small helpers

    def verse(self) -> Verse:
        return self.rng.choice(self.verses)

    def topic(self, v: Verse) -> str:
        return _topic(v.text, self.rng) or self.rng.choice([w.lower() for w in WORD.findall(v.text)])

    def think_block(self, lines: list[str]) -> str:
        return "<think>\n" + "\n".join(lines) + "\n</think>\n"

    def effort(self) -> tuple[str, int]:
        suffix, lo, hi = self.rng.choices(EFFORTS, weights=(2, 3, 2, 2))[0]
        return suffix, self.rng.randint(lo, hi)

    # -------------------------------------------------------------- questions with reasons

    def question(self) -> tuple[str, str, list[str]]:
        """(question, answer, reasoning lines, most useful first) about one training verse."""
        rng, v = self.rng, self.verse()
        words = v.text.split(" ")
        first = " ".join(words[:3]).rstrip(",;:")
        kind = rng.random()
        if kind < 0.3:
            q, a = f"What does {v.ref} say?", v.text
            lines = [f"The verse is in {v.book}, the {ordinal(v.chapter)} chapter.",
                     f"The man asketh for the {ordinal(v.verse)} verse thereof.",
                     f"It beginneth with the words {first}.",
                     "I shall say the words of the verse as they are written.",
                     f"The book of {v.book} is in the Bible; the verse is {v.ref}."]
        elif kind < 0.55:
            t = self.topic(v)
            q, a = f"Tell me a verse about {t}.", v.text
            lines = [f"The man asketh of the word {t}; I shall seek a verse that speaketh of {t}.",
                     f"There is such a verse in {v.book}, the {ordinal(v.chapter)} chapter.",
                     f"It is {v.ref}, and it beginneth {first}.",
                     f"The word {t} is in it, so it will serve.",
                     "I shall give the verse whole."]
        elif kind < 0.75 and len(words) >= 6:
            cut = len(words) // 2
            q, a = f"Continue the verse: {' '.join(words[:cut])}", " ".join(words[cut:])
            lines = [f"These are the words of {v.ref}.",
                     f"The verse goeth on after the word {words[cut - 1].strip(',;:.')}.",
                     "I shall give the rest of the verse and no more.",
                     f"It is in the book of {v.book}.",
                     f"The rest hath {len(words) - cut} words."]
        elif kind < 0.88:
            snippet = short_text(v.text, rng, 9)
            q = f"In which book is this verse: {snippet}"
            a = f"It is in {v.book}, the {ordinal(v.chapter)} chapter; it is {v.ref}."
            lines = [f"The verse that beginneth {first} is in the book of {v.book}.",
                     f"It is the {ordinal(v.chapter)} chapter, the {ordinal(v.verse)} verse.",
                     f"So the verse is {v.ref}.",
                     "I shall name the book and the chapter.",
                     f"The book of {v.book} hath {len(self.by_book[v.book])} verses."]
        else:
            w = rng.choice([x for x in WORD.findall(v.text) if len(x) >= 3] or ["the"]).lower()
            n = sum(x.lower() == w for x in WORD.findall(v.text))
            times = "once" if n == 1 else "twice" if n == 2 else f"{NUMBER_WORDS[n] if n < 13 else n} times"
            q = f"How often is the word {w} in {v.ref}?"
            a = f"The word {w} is in {v.ref} {times}."
            lines = [f"The verse {v.ref} saith: {short_text(v.text, rng, 10)}",
                     f"I shall count the word {w} in it.",
                     f"It is there {times}.",
                     f"The verse is in {v.book}, the {ordinal(v.chapter)} chapter.",
                     "So I shall give the count."]
        return q, a, lines

    def plain_turn(self) -> str:
        """An earlier exchange of a chat, as the server renders history: no thinking."""
        q, a, _ = self.question()
        return f"User: {q}\n\nAssistant: {a}\n\n"

    def think_turn(self) -> str:
        q, a, lines = self.question()
        style = self.rng.random()
        if style < 0.7:  # thinking, its length set by the effort suffix
            suffix, n = self.effort()
            if q.startswith("Continue the verse"):  # a suffix would read as part of the verse
                suffix, n = "", 2
            reply = self.think_block(lines[:n]) + a
            q += suffix
        elif style < 0.85:  # "fake think": thinking switched off by an empty block
            reply = "<think>\n</think>\n" + a
        else:  # the plain form, no think block at all
            reply = a
        return f"User: {q}\n\nAssistant: {reply}\n\n"

    # -------------------------------------------------------------- JSON answers

    def json_turn(self, last: bool = True) -> str:
        rng, v = self.rng, self.verse()
        kind = rng.random()
        if kind < 0.3:
            q = rng.choice([f"What does {v.ref} say? Answer in JSON.", f"Give {v.ref} as JSON.",
                            f"What does {v.ref} say? Reply in JSON."])
            value = {"book": v.book, "chapter": v.chapter, "verse": v.verse, "text": short_text(v.text, rng)}
            why = [f"The man asketh for {v.ref} in JSON.", "I shall give the book, the chapter, the verse and the text."]
        elif kind < 0.5:
            q = f"Give the book and chapter of this verse as JSON: {short_text(v.text, rng, 9)}"
            value = {"book": v.book, "chapter": v.chapter}
            why = [f"The words are in {v.book}, the {ordinal(v.chapter)} chapter.", "I shall write the book and chapter."]
        elif kind < 0.65:
            w = rng.choice([x for x in WORD.findall(v.text) if len(x) >= 3] or ["the"]).lower()
            n = sum(x.lower() == w for x in WORD.findall(v.text))
            q = f"How often is the word {w} in {v.ref}? Answer in JSON."
            value = {"word": w, "count": n}
            why = [f"I shall count the word {w} in {v.ref}.", f"It is there {n} times."]
        elif kind < 0.75:
            q = rng.choice([f"Answer in JSON: what is the first word of {v.ref}?",
                            f"Answer in JSON: how many words hath {v.ref}?"])
            value = {"answer": WORD.findall(v.text)[0] if "first" in q else len(v.text.split(" "))}
            why = [f"The verse {v.ref} beginneth {' '.join(v.text.split(' ')[:3])}.", "I shall give the answer alone."]
        elif kind < 0.88 and (names := _names(v.text)):
            name = rng.choice(names)
            q = rng.choice([f"Name a man or a place of {v.ref} in JSON, with a reason.",
                            f"Who is named in {v.ref}? Answer in JSON with a reason."])
            value = {"name": name, "reason": f"{name} is named in {v.ref}."}
            why = [f"The verse {v.ref} nameth {name}.", "I shall give the name and the reason."]
        else:
            t = self.topic(v)
            q = f"Tell me a verse about {t} as JSON."
            value = {"topic": t, "ref": v.ref, "text": short_text(v.text, rng)}
            why = [f"The man asketh of {t}; {v.ref} speaketh of it.", "I shall write the topic, the place and the words."]
        answer = compact_json(value)
        if last and rng.random() < 0.25:
            suffix, n = self.effort()
            return f"User: {q}{suffix}\n\nAssistant: {self.think_block(why[:max(1, min(n, 2))])}{answer}\n\n"
        return f"User: {q}\n\nAssistant: {answer}\n\n"

    # -------------------------------------------------------------- tool calls

    def tool_pool(self):
        s, i = {"type": "string"}, {"type": "integer"}

        def obj(**props):
            return {"type": "object", "properties": props, "required": list(props)}

        return {
            "find_verse": ("Find a verse by book, chapter and verse.", obj(book=s, chapter=i, verse=i)),
            "count_word": ("Count a word in a book.", obj(word=s, book=s)),
            "search_word": ("Find the first verse with a word.", obj(word=s)),
            "get_chapter": ("Get the start of a chapter.", obj(book=s, chapter=i)),
            "lookup_name": ("Tell where a name is found.", obj(name=s)),
            "get_weather": ("Get the weather of a city.", obj(city=s)),
            "count_verses": ("Count the verses of a book.", obj(book=s)),
            "add_numbers": ("Add two numbers.", obj(a=i, b=i)),
            "send_message": ("Send a short message to a man.", obj(to=s, text=s)),
            "daily_verse": ("Give the verse of the day.", {"type": "object", "properties": {}}),
        }

    def tool_task(self, name: str):
        """(user request, arguments, observation text, answer) for one call of `name`."""
        rng = self.rng
        if name == "find_verse":
            v = self.verse()
            req = rng.choice([f"Find {v.ref} for me.", f"What does {v.ref} say?", f"Look up {v.ref}.",
                              f"Fetch the verse {v.ref}."])
            obs = v.text if len(v.text.split(" ")) <= 20 else short_text(v.text, rng, 16)
            ans = rng.choice([f"{v.ref} saith: {short_text(v.text, rng, 12)}", f"It saith: {short_text(v.text, rng, 12)}"])
            return req, {"book": v.book, "chapter": v.chapter, "verse": v.verse}, obs, ans
        if name == "count_word":
            book = rng.choice(self.books)
            w = rng.choice([w for w, c in self.word_count[book].most_common(300) if len(w) >= 4])
            n = self.word_count[book][w]
            req = rng.choice([f"How many times is the word {w} in {book}?", f"Count the word {w} in {book}."])
            return req, {"word": w, "book": book}, compact_json({"word": w, "book": book, "count": n}), \
                f"The word {w} is found {n} times in {book}."
        if name == "search_word":
            v = self.verse()
            w = self.topic(v)
            first = self.first_ref[w]
            req = rng.choice([f"Search for the word {w}.", f"Where is the word {w} first found?",
                              f"Find a verse with the word {w}."])
            obs = f"{first.ref} {short_text(first.text, rng, 12)}"
            return req, {"word": w}, obs, f"The word {w} is first found in {first.ref}."
        if name == "get_chapter":
            ch = rng.choice(self.chapters)
            head = ch[0]
            req = rng.choice([f"Show me {head.book} chapter {head.chapter}.", f"Get {head.book} {head.chapter}.",
                              f"How doth {head.book} {head.chapter} begin?"])
            obs = f"{head.book} {head.chapter} ({len(ch)} verses): {short_text(head.text, rng, 12)}"
            return req, {"book": head.book, "chapter": head.chapter}, obs, \
                f"{head.book} {head.chapter} hath {len(ch)} verses, and it beginneth: {short_text(head.text, rng, 8)}"
        if name == "lookup_name":
            n = rng.choice(self.names)
            first = self.first_ref[n.lower()]
            req = rng.choice([f"Who is {n}?", f"Look up the name {n}.", f"Where is {n} named?"])
            obs = compact_json({"name": n, "verses": self.name_count[n], "first": first.ref})
            return req, {"name": n}, obs, f"{n} is named in {self.name_count[n]} verses, first in {first.ref}."
        if name == "get_weather":
            city = rng.choice(CITIES)
            sky, temp = rng.choice(SKIES), rng.randint(-5, 38)
            req = rng.choice([f"What is the weather in {city}?", f"Is it raining in {city}?",
                              f"Tell me the weather of {city} today."])
            obs = compact_json({"city": city, "sky": sky, "temperature": temp})
            return req, {"city": city}, obs, f"In {city} the sky is {sky}, and it is {temp} degrees."
        if name == "count_verses":
            book = rng.choice(self.books)
            n = len(self.by_book[book])
            req = rng.choice([f"How many verses hath {book}?", f"Count the verses of {book}."])
            return req, {"book": book}, str(n), f"The book of {book} hath {n} verses."
        if name == "add_numbers":
            a, b = rng.randint(1, 999), rng.randint(1, 999)
            req = rng.choice([f"What is {a} and {b} together?", f"Add {a} and {b}.", f"What is {a} plus {b}?"])
            return req, {"a": a, "b": b}, str(a + b), f"{a} and {b} make {a + b}."
        if name == "send_message":
            to = rng.choice(self.names)
            text = rng.choice(["Peace be unto thee", "Come up hither", "I am well", "Fear not",
                               "The feast is ready", "Go in peace", "Be of good cheer", "Arise and come"])
            req = rng.choice([f"Send a message to {to}: {text}", f"Tell {to}: {text}"])
            return req, {"to": to, "text": text}, compact_json({"sent": True}), f"The message is sent unto {to}."
        assert name == "daily_verse"
        v = self.verse()
        req = rng.choice(["Give me the verse of the day.", "What is the verse of the day?"])
        return req, {}, f"{v.ref} {short_text(v.text, rng, 12)}", f"The verse of the day is {v.ref}: {short_text(v.text, rng, 10)}"

    def tool_example(self):
        """(offered ToolDefs, the function to call, request, arguments, observation, answer)."""
        from ai00_like.api.oai.types import FunctionDef, ToolDef

        rng, pool = self.rng, self.tool_pool()
        names = sorted(pool)
        target = rng.choice(names)
        others = rng.sample([n for n in names if n != target], rng.choices((0, 1, 2), weights=(3, 4, 3))[0])
        offered = others + [target]
        rng.shuffle(offered)
        tools = [ToolDef(function=FunctionDef(name=n, description=pool[n][0], parameters=pool[n][1])) for n in offered]
        return (tools, target, *self.tool_task(target))

    def tool_doc(self) -> str:
        from ai00_like.api.oai.prompt import render_chat
        from ai00_like.api.oai.tools import call_text, with_tools
        from ai00_like.api.oai.types import ChatMessage, FunctionCallIn, ToolCallIn

        rng = self.rng
        tools, target, req, args, obs, ans = self.tool_example()
        call = call_text(target, compact_json(args))
        chat = [ChatMessage(role="user", content=req)]
        if rng.random() < 0.3:
            # Think first, then call. The reply ends at the call (the client runs the tool and
            # asks again, and that prompt shows the call without the thinking), so the
            # document ends here.
            what = {"find_verse": "a verse", "count_word": "a count", "search_word": "a word",
                    "get_chapter": "a chapter", "lookup_name": "a name", "get_weather": "the weather",
                    "count_verses": "the number of verses", "add_numbers": "a sum",
                    "send_message": "a message", "daily_verse": "the verse of the day"}[target]
            lines = [f"The man asketh for {what}; the {target} function can do it."]
            if args and rng.random() < 0.5:
                lines.append("I shall call it with " + ", ".join(f"{k} {v}" for k, v in args.items()) + ".")
            reply = self.think_block(lines) + call
        else:
            chat += [ChatMessage(role="assistant", content=None, tool_calls=[
                         ToolCallIn(function=FunctionCallIn(name=target, arguments=compact_json(args)))]),
                     ChatMessage(role="tool", content=obs)]
            reply = ans
            if rng.random() < 0.15:  # the answer after the observation may think a little too
                reply = self.think_block([f"The {target} function hath answered; I shall tell the man."]) + ans
        prompt = render_chat(with_tools(chat, tools)).prompt
        assert prompt.endswith("\n\nAssistant:")
        return f"{prompt} {reply}\n\n"


G1_KINDS = ("think", "json", "tools")


def g1_documents(verses: list[Verse], n_docs: int, seed: int = 0) -> list[tuple[str, str]]:
    """`n_docs` (kind, text) documents, a third of each kind: a thinking chat or a JSON chat (0 or
    1 earlier exchange without thinking, then the exchange that may think), or one tool-call
    exchange (the tools offered first)."""
    maker = G1Maker(verses, seed)
    out = []
    for i in range(n_docs):
        kind = G1_KINDS[i % 3]
        if kind == "tools":
            text = maker.tool_doc()
        else:
            earlier = maker.plain_turn if kind == "think" else lambda: maker.json_turn(last=False)
            text = "".join(earlier() for _ in range(maker.rng.randint(0, 1)))
            text += maker.think_turn() if kind == "think" else maker.json_turn()
        for turn in text.split("\n\n")[:-1]:
            assert turn and "\n\n" not in turn, turn
        out.append((kind, text))
    return out
