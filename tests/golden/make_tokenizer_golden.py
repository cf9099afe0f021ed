"""Write tests/golden/tokenizer_golden.json: tricky strings and their ids from the reference.

    .venv/bin/python tests/golden/make_tokenizer_golden.py

Needs the reference package (`pip install rwkv==0.8.32`); the golden file lets the default test
run check our World tokenizer against it without the package. `mixed_corpus()` is also the
seeded corpus of the live reference test and of bench/tokenizer.py.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

HERE = Path(__file__).resolve().parent
GOLDEN = HERE / "tokenizer_golden.json"

_ENGLISH = (
    "the of and to in is that it was for on are with as I his they be at one have this from or "
    "had by word but what some we can out other were all there when up use your how said an each "
    "she which do their time if will way about many then them write would like so these her long "
    "make thing see him two has look more day could go come did number sound no most people my "
    "over know water than call first who may down side been now find Eiffel tower Paris RWKV model"
).split()
_CHINESE = (
    "我们的是在一不了有和人这中大为上个国以要他时来用们生到作地于出就分对成会可主发年"
    "动同工也能下过子说产种面而方后多定行学法所民得经十三之进着等部度家电力里如水化高"
    "自二理起小物现实加量都两体制机当使点从业本去把性好应开它合还因由其些然前外天政四"
    "日那社义事平形相全表间样与关各重新线内数正心反你明看原"
)
_OTHER_SCRIPTS = [
    "こんにちは、世界。カタカナとひらがな",
    "안녕하세요 세계",
    "Привет, мир! Съешь же ещё этих мягких французских булок",
    "مرحبا بالعالم",
    "नमस्ते दुनिया",
    "สวัสดีชาวโลก",
    "Ελληνικά κείμενα",
    "naïve café résumé São Paulo Zürich Ångström",
]
_CODE = [
    "def f(x):\n    return x * 2\n",
    "for (int i = 0; i < n; ++i) {\n\t\ta[i] = b[i];\n}\n",
    "    if not ok:\n        raise ValueError('bad')\n\n",
    '{"key": [1, 2, 3], "v": null, "s": "a\\"b"}\n',
    "<div class=\"x\">&nbsp;</div>\r\n",
    "SELECT * FROM t WHERE id = 42;\n",
    "fn main() { println!(\"{}\", 1 + 2); }\n",
    "https://example.com/a/b?c=d&e=f#g\n",
]
_EMOJI = ["😀", "🎉", "👍🏽", "❤️", "🇫🇷", "🤖", "✨", "🔥", "👨‍👩‍👧", "1️⃣", "🏳️‍🌈"]


def mixed_corpus(seed: int, size: int) -> bytes:
    """About `size` bytes of English, Chinese, other scripts, code, emoji, whitespace runs and
    random (often invalid UTF-8) bytes, reproducible from `seed`."""
    rng = random.Random(seed)
    parts: list[bytes] = []
    total = 0
    while total < size:
        k = rng.random()
        if k < 0.35:
            words = " ".join(rng.choice(_ENGLISH) for _ in range(rng.randint(1, 40)))
            s = words.capitalize() + rng.choice([". ", ".\n", ", ", "!\n\n", "? ", ";", ""])
        elif k < 0.55:
            s = "".join(rng.choice(_CHINESE) for _ in range(rng.randint(1, 60)))
            s += rng.choice(["。", "，", "\n", "！", ""])
        elif k < 0.62:
            s = rng.choice(_OTHER_SCRIPTS) + rng.choice([" ", "\n", ""])
        elif k < 0.75:
            s = rng.choice(_CODE)
        elif k < 0.81:
            s = "".join(rng.choice(_EMOJI) for _ in range(rng.randint(1, 8)))
        elif k < 0.88:
            s = rng.choice([" ", "\n", "\t", "\r\n", " \n"]) * rng.randint(1, 70)
        elif k < 0.93:
            s = str(rng.randint(0, 10 ** rng.randint(1, 12))) + rng.choice([" ", ".", ",", "%", ""])
        else:
            parts.append(rng.randbytes(rng.randint(1, 24)))
            total += len(parts[-1])
            continue
        parts.append(s.encode("utf-8"))
        total += len(parts[-1])
    return b"".join(parts)


def tricky_strings() -> list[bytes]:
    """Hand-picked edge cases: whitespace runs, every byte, invalid UTF-8, long tokens, ..."""
    out: list[bytes] = [
        b"",
        "Hello".encode(),
        " Hello".encode(),
        "User: hi\n\nAssistant:".encode(),
        "User: The capital of France is\n\nAssistant: Hello\t世界 x\\y".encode(),
        "Hello world! 123 😀 café".encode(),
        "你好".encode(),
        "System: You are helpful.\n\nUser: 2+2?\n\nAssistant: <think".encode(),
        "The Eiffel tower is in Paris.".encode(),
        bytes(range(256)),
        bytes(range(255, -1, -1)),
        b"\x00\x00\x00",
        b"\xff\xfe\xfd",
        b"\x80\x81\xbf",  # continuation bytes without a lead
        "€".encode()[:2],  # truncated 3-byte character
        "😀".encode()[:3] + b"A",  # truncated 4-byte character, then ASCII
        b"\xc0\xaf\xe0\x80\xaf",  # overlong encodings
        b"\xed\xa0\x80",  # an encoded surrogate
        b"\xf5\x80\x80\x80",  # beyond U+10FFFF
        "é".encode() + "é".encode("latin-1"),
        "e\u0301 n\u0303 a\u0308".encode(),  # combining marks
        "a\u200bb\u200dc\ufeffd".encode(),  # zero-width characters
        "\u2028\u2029\x85".encode(),  # unusual line separators
        "1,000,000.00 3.14159 2023-04-24 0x1F 1e-9".encode(),
        "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa".encode(),
        b"=" * 200,
        b"-" * 130,
        b"." * 67,
        b"#" * 40 + b" Title\n\n",
        b"\r\n" * 33,
        b"\t" * 17 + b"x",
        b" \n" * 20,
        "。。。！！？？".encode(),
        "“quotes” ‘single’ «guillemets» —dash– …".encode(),
    ]
    out += [b" " * n for n in (*range(1, 18), 31, 32, 33, 63, 64, 65, 100, 127, 128, 129, 300)]
    out += [b"\n" * n for n in (*range(1, 13), 16, 33, 100)]
    out += [b" " * n + b"x" for n in (1, 2, 3, 4, 7, 8, 15, 16, 17, 33)]
    out += [b"\n" * n + b" " * m + b"if" for n, m in ((1, 4), (2, 4), (1, 8), (3, 2), (2, 12))]
    out += [s.encode() for s in _OTHER_SCRIPTS]
    out += [s.encode() for s in _CODE]
    out += ["".join(_EMOJI).encode()]
    return out


def longest_tokens(vocab: dict[int, bytes], count: int) -> list[bytes]:
    """The longest tokens of the vocab, bare and glued to neighbours they might merge with."""
    longest = sorted(vocab.values(), key=lambda t: (-len(t), t))[:count]
    out = []
    for t in longest:
        out += [t, b"x" + t, t + t[:7], t[: len(t) // 2] + b" " + t[len(t) // 2 :]]
    return out


def golden_inputs(vocab: dict[int, bytes]) -> list[bytes]:
    rng = random.Random(20230424)
    inputs = tricky_strings() + longest_tokens(vocab, 6)
    corpus = mixed_corpus(seed=7, size=60_000)
    while len(inputs) < 200:
        start = rng.randrange(len(corpus))
        inputs.append(corpus[start : start + rng.choice([1, 2, 3, 8, 40, 300, 800])])
    # Strings of random vocab tokens: greedy matching must not merge across them wrongly.
    tokens = sorted(vocab.values())
    for _ in range(10):
        inputs.append(b"".join(rng.choice(tokens) for _ in range(rng.randint(2, 30))))
    return inputs


def entry(data: bytes, ids: list[int]) -> dict:
    try:
        return {"text": data.decode("utf-8"), "ids": ids}
    except UnicodeDecodeError:
        return {"hex": data.hex(), "ids": ids}


def entry_bytes(e: dict) -> bytes:
    return e["text"].encode("utf-8") if "text" in e else bytes.fromhex(e["hex"])


def main() -> None:
    import rwkv.rwkv_tokenizer  # the reference; only this script and the live test need it

    vocab_file = Path(rwkv.rwkv_tokenizer.__file__).with_name("rwkv_vocab_v20230424.txt")
    ref = rwkv.rwkv_tokenizer.TRIE_TOKENIZER(str(vocab_file))
    vocab = dict(ref.idx2token)
    entries = [entry(data, ref.encodeBytes(data)) for data in golden_inputs(vocab)]
    with open(GOLDEN, "w", encoding="utf-8") as f:
        f.write("[\n" + ",\n".join(json.dumps(e, ensure_ascii=False) for e in entries) + "\n]\n")
    print(f"wrote {len(entries)} entries to {GOLDEN}")


if __name__ == "__main__":
    main()
