"""Tokenizers: World greedy matching against the reference, files, streaming, HF wrapper."""

from __future__ import annotations

import importlib.util
import json
import random
from pathlib import Path

import pytest

from ai00_like.rwkv.tokenizer import (
    HFTokenizer,
    StreamDecoder,
    TokenizerError,
    WorldTokenizer,
    default_tokenizer_path,
    load_tokenizer,
    read_world_vocab,
    world_vocab_json,
)

GOLDEN_DIR = Path(__file__).resolve().parents[1] / "golden"


def _load_golden_module():
    path = GOLDEN_DIR / "make_tokenizer_golden.py"
    spec = importlib.util.spec_from_file_location("make_tokenizer_golden", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


golden = _load_golden_module()


@pytest.fixture(scope="module")
def world() -> WorldTokenizer:
    return WorldTokenizer.from_file(default_tokenizer_path())


@pytest.fixture(scope="module")
def vocab() -> dict[int, bytes]:
    return read_world_vocab(default_tokenizer_path())


def naive_greedy(vocab: dict[int, bytes], data: bytes) -> list[int]:
    """Longest match by trying every length: slow, but obviously what §8.2 says."""
    by_bytes = {raw: tid for tid, raw in vocab.items()}
    longest = max(map(len, by_bytes))
    out, i = [], 0
    while i < len(data):
        for n in range(min(longest, len(data) - i), 0, -1):
            tid = by_bytes.get(data[i : i + n])
            if tid is not None:
                out.append(tid)
                i += n
                break
    return out


# --- known ids (rwkv-spec.md §8.4) ------------------------------------------------------------

SPEC_IDS = [
    ("Hello", [33155]),
    (" Hello", [36786]),
    ("\n\n", [261]),
    ("\n", [11]),
    ("User", [24281]),
    (":", [59]),
    ("Assistant", [5585, 41693]),
    (" Assistant", [58683]),
    ("User: hi\n\nAssistant:", [24281, 59, 4571, 261, 5585, 41693, 59]),
    ("你好", [10464, 11685]),
    ("Hello world! 123 😀 café", [33155, 40213, 34, 3485, 52, 33, 3319, 153, 129, 37946]),
    (
        "User: The capital of France is\n\nAssistant: Hello\t世界 x\\y",
        [24281, 59, 20996, 51128, 4706, 44312, 4600, 261, 5585, 41693, 59, 36786, 10, 10267, 14610, 355, 93, 122],
    ),
]


@pytest.mark.parametrize("text,ids", SPEC_IDS)
def test_known_ids_from_spec(world, text, ids):
    assert world.encode(text) == ids
    assert world.decode(ids) == text


def test_world_vocab_shape(world, vocab):
    assert len(vocab) == 65529 and min(vocab) == 1 and max(vocab) == 65529
    assert world.vocab_size == 65530
    assert world.eos_id == 0
    assert all(vocab[b + 1] == bytes([b]) for b in range(256))  # id = byte + 1
    assert max(map(len, vocab.values())) == 128
    assert world.token_bytes(0) == b""  # end-of-text has no text
    assert world.token_bytes(65535) == b""  # the model's padding rows neither


# --- against the reference --------------------------------------------------------------------


def test_golden_ids_from_reference(world):
    entries = json.loads((GOLDEN_DIR / "tokenizer_golden.json").read_text(encoding="utf-8"))
    assert len(entries) >= 200
    mismatches = []
    for e in entries:
        data = golden.entry_bytes(e)
        if world.encode_bytes(data) != e["ids"]:
            mismatches.append(data[:60])
        assert world.decode_bytes(e["ids"]) == data
    assert mismatches == []


def test_matches_naive_greedy_on_mixed_corpus(vocab):
    world = WorldTokenizer(vocab)  # fresh: its piece cache starts empty
    corpus = golden.mixed_corpus(seed=1, size=30_000)
    assert world.encode_bytes(corpus) == naive_greedy(vocab, corpus)
    # The same text again (now served from the cache), and cut at arbitrary places.
    assert world.encode_bytes(corpus) == naive_greedy(vocab, corpus)
    rng = random.Random(2)
    for _ in range(200):
        start = rng.randrange(len(corpus))
        chunk = corpus[start : start + rng.randint(1, 200)]
        assert world.encode_bytes(chunk) == naive_greedy(vocab, chunk)


@pytest.mark.reference
def test_matches_reference_trie_tokenizer(world):
    pytest.importorskip("rwkv")
    import rwkv.rwkv_tokenizer
    from rwkv.rwkv_tokenizer import TRIE_TOKENIZER

    ref_vocab = Path(rwkv.rwkv_tokenizer.__file__).with_name("rwkv_vocab_v20230424.txt")
    # The shipped vocab is the package's copy with LF line ends.
    assert default_tokenizer_path().read_bytes() == ref_vocab.read_bytes().replace(b"\r\n", b"\n")
    ref = TRIE_TOKENIZER(str(ref_vocab))

    corpus = golden.mixed_corpus(seed=12345, size=400_000)
    assert world.encode_bytes(corpus) == ref.encodeBytes(corpus)
    rng = random.Random(3)
    for _ in range(2000):
        start = rng.randrange(len(corpus))
        chunk = corpus[start : start + rng.choice([1, 2, 5, 20, 100, 1000])]
        assert world.encode_bytes(chunk) == ref.encodeBytes(chunk), chunk
    tokens = list(ref.idx2token.values())
    for _ in range(300):  # runs of vocab tokens: the hardest case for greedy boundaries
        data = b"".join(rng.choice(tokens) for _ in range(rng.randint(1, 20)))
        assert world.encode_bytes(data) == ref.encodeBytes(data), data
    text = corpus.decode("utf-8", "replace")
    assert world.encode(text) == ref.encode(text)


# --- round trips and files --------------------------------------------------------------------


def test_round_trip_text_and_bytes(world):
    corpus = golden.mixed_corpus(seed=4, size=50_000)
    assert world.decode_bytes(world.encode_bytes(corpus)) == corpus
    text = corpus.decode("utf-8", "replace")
    assert world.decode(world.encode(text)) == text
    rng = random.Random(5)
    for _ in range(200):
        data = rng.randbytes(rng.randint(0, 64))
        assert world.decode_bytes(world.encode_bytes(data)) == data
    assert world.encode("") == [] and world.decode([]) == ""


def test_decode_of_invalid_utf8_uses_replacement_character(world):
    ids = world.encode_bytes(b"ok \xff\xfe!")
    assert world.decode(ids) == "ok \ufffd\ufffd!"


def test_txt_and_json_vocab_give_the_same_tokenizer(world, vocab):
    json_path = default_tokenizer_path().with_suffix(".json")
    assert read_world_vocab(json_path) == vocab
    # The shipped JSON is exactly what world_vocab_json renders (str when valid UTF-8).
    assert json_path.read_text(encoding="utf-8") == world_vocab_json(vocab)
    raw = json.loads(json_path.read_text(encoding="utf-8"))
    assert raw["33155"] == "Hello" and isinstance(raw[str(0x80 + 1)], list)
    from_json = WorldTokenizer.from_file(json_path)
    corpus = golden.mixed_corpus(seed=6, size=20_000)
    assert from_json.encode_bytes(corpus) == world.encode_bytes(corpus)
    assert from_json.vocab_size == world.vocab_size


def test_load_tokenizer_picks_by_file(tmp_path, vocab):
    assert isinstance(load_tokenizer(default_tokenizer_path()), WorldTokenizer)
    assert isinstance(load_tokenizer(default_tokenizer_path().with_suffix(".json")), WorldTokenizer)
    # Content decides when the extension does not.
    odd = tmp_path / "vocab.dat"
    odd.write_bytes(default_tokenizer_path().read_bytes())
    assert load_tokenizer(odd).encode("Hello") == [33155]
    with pytest.raises(TokenizerError, match="nope.txt.*not found"):
        load_tokenizer(tmp_path / "nope.txt")
    with pytest.raises(TokenizerError, match="nope.json.*not found"):
        load_tokenizer(tmp_path / "nope.json")
    bad = tmp_path / "bad.json"
    bad.write_text('{"1": "a",', encoding="utf-8")
    with pytest.raises(TokenizerError, match=r"bad.json:1: invalid JSON"):
        load_tokenizer(bad)
    binary = tmp_path / "binary.txt"
    binary.write_bytes(b"\xff\xfe\x00garbage")
    with pytest.raises(TokenizerError, match="binary.txt: cannot read"):
        load_tokenizer(binary)


# --- streaming --------------------------------------------------------------------------------


@pytest.mark.parametrize(
    # Common Chinese characters are whole tokens; rare ones, emoji and some Hangul are not.
    "text", ["😀👨‍👩‍👧🇫🇷 ok", "你好，龘靐齉麤生僻字。", "naïve café 🎉 — “quotes” 안녕하세요", "𠀀𪚥 鱻"]
)
def test_stream_decoder_never_splits_a_character(world, text):
    ids = world.encode(text)
    # The point of the test: some token ends inside a multi-byte character.
    pieces = [world.token_bytes(i) for i in ids]
    assert any(_splits_a_character(p) for p in pieces)
    stream = StreamDecoder(world)
    chunks = [stream.push(i) for i in ids]
    chunks.append(stream.flush())
    assert "".join(chunks) == text
    assert all("\ufffd" not in c for c in chunks)
    assert "" in chunks  # some token completed no character by itself


def _splits_a_character(raw: bytes) -> bool:
    try:
        raw.decode("utf-8")
        return False
    except UnicodeDecodeError:
        return True


def test_stream_decoder_replaces_bytes_that_cannot_become_valid(world):
    stream = StreamDecoder(world)
    lead = world.encode_bytes(b"\xe4")  # first byte of a 3-byte character
    assert [stream.push(i) for i in lead] == [""]  # held: it may still complete
    assert "".join(stream.push(i) for i in world.encode("A")) == "\ufffdA"  # it cannot any more
    assert [stream.push(i) for i in world.encode_bytes(b"\xe4\xbd")] == [""]
    assert stream.flush() == "\ufffd"  # the stream ended inside a character
    assert stream.push(0) == ""  # end-of-text adds no text
    assert stream.flush() == ""


# --- subset vocabularies (the demo model's kind) ----------------------------------------------


def _write_subset_vocab(path: Path, extra: list[str | bytes], seed: int = 0) -> dict[int, bytes]:
    rng = random.Random(seed)
    ids = rng.sample(range(1, 100_000), 256 + len(extra))
    tokens = {ids[b]: bytes([b]) for b in range(256)}
    for tid, tok in zip(ids[256:], extra):
        tokens[tid] = tok.encode("utf-8") if isinstance(tok, str) else tok
    # Python literals as in the real file: repr of str when valid UTF-8, of bytes otherwise.
    lines = []
    for tid, tok in rng.sample(sorted(tokens.items()), len(tokens)):  # any order is fine
        try:
            lit = repr(tok.decode("utf-8"))
        except UnicodeDecodeError:
            lit = repr(tok)
        lines.append(f"{tid} {lit} {len(tok)}")
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return tokens


def test_subset_vocab_with_arbitrary_ids(tmp_path):
    extra = ["hello", " world", "hel", "lo w", "你好", "\n\n", "  ", b"\xe4\xbd", "ab", "abcd", "bcde"]
    tokens = _write_subset_vocab(tmp_path / "demo_vocab.txt", extra)
    tk = load_tokenizer(tmp_path / "demo_vocab.txt")
    assert isinstance(tk, WorldTokenizer)
    assert tk.vocab_size == max(tokens) + 1
    rng = random.Random(7)
    samples = ["hello world", "hello\n\n  world  你好", "abcde", "abcdbcde", "helo wlo w"]
    alphabet = ["a", "b", "c", "d", "e", " ", "hel", "lo", "你", "好", "\n"]
    samples += ["".join(rng.choice(alphabet) for _ in range(40)) for _ in range(100)]
    for s in samples:
        ids = tk.encode(s)
        assert ids == naive_greedy(tokens, s.encode())
        assert tk.decode(ids) == s
    assert tk.encode("hello world") == [_id(tokens, "hello"), _id(tokens, " world")]
    # The same vocab through the JSON format.
    (tmp_path / "demo_vocab.json").write_text(world_vocab_json(tokens), encoding="utf-8")
    tk_json = load_tokenizer(tmp_path / "demo_vocab.json")
    assert all(tk_json.encode(s) == tk.encode(s) for s in samples)


def _id(tokens: dict[int, bytes], tok: str) -> int:
    return next(tid for tid, raw in tokens.items() if raw == tok.encode())


# --- malformed vocab files --------------------------------------------------------------------

GOOD_LINES = [f"{b + 1} {bytes([b])!r} 1" for b in range(256)]


@pytest.mark.parametrize(
    "bad_line,message",
    [
        ("300 'abc 3", r"vocab.txt:257: bad token literal"),
        ("300 __import__('os') 3", r"vocab.txt:257: bad token literal"),
        ("300 'abc' 4", r"vocab.txt:257: token is 3 bytes but the line says 4"),
        ("300 b'\\xff\\xfe' 3", r"vocab.txt:257: token is 2 bytes but the line says 3"),
        ("5 'abc' 3", r"vocab.txt:257: duplicate id 5"),
        ("0 'abc' 3", r"vocab.txt:257: id 0 is not allowed"),
        ("x 'abc' 3", r"vocab.txt:257: id and byte length must be integers"),
        ("300 'abc'", r"vocab.txt:257: expected '<id> <literal> <byte length>'"),
        ("300 123 3", r"vocab.txt:257: token literal is a int"),
        ("300 '' 0", r"vocab.txt:257: empty token"),
    ],
)
def test_malformed_vocab_lines_name_file_and_line(tmp_path, bad_line, message):
    path = tmp_path / "vocab.txt"
    path.write_text("\n".join([*GOOD_LINES, bad_line]) + "\n", encoding="utf-8")
    with pytest.raises(TokenizerError, match=message):
        WorldTokenizer.from_file(path)
    with pytest.raises(ValueError):  # TokenizerError is a ValueError for callers that group them
        load_tokenizer(path)


def test_vocab_without_every_single_byte_is_rejected(tmp_path):
    path = tmp_path / "vocab.txt"
    lines = [line for line in GOOD_LINES if not line.startswith(("11 ", "201 "))]  # "\n", 0xc8
    path.write_text("\n".join([*lines, "300 'hello' 5"]) + "\n", encoding="utf-8")
    expected = r"vocab.txt: no single-byte token for 2 byte value\(s\) \(0x0a, 0xc8\)"
    with pytest.raises(TokenizerError, match=expected):
        WorldTokenizer.from_file(path)


@pytest.mark.parametrize(
    "content,message",
    [
        ('{"1": "a", "1": "b"}', r"id '1': duplicate id 1"),
        ('{"one": "a"}', r"id 'one': ids must be integers"),
        ('{"1": [300]}', r"id '1': token must be a string or a list of bytes"),
        ('{"1": 5}', r"id '1': token must be a string or a list of bytes"),
        ('{"1": "a"}', r"no single-byte token for 255 byte value"),
        ("[[1, 2]]", r"expected a JSON object"),
    ],
)
def test_malformed_json_vocab(tmp_path, content, message):
    path = tmp_path / "vocab.json"
    path.write_text(content, encoding="utf-8")
    with pytest.raises(TokenizerError, match=message):
        load_tokenizer(path)
    with pytest.raises(TokenizerError, match="vocab.json"):
        WorldTokenizer.from_file(path)


def test_crlf_vocab_file_reads_the_same(tmp_path, vocab):
    path = tmp_path / "crlf.txt"
    path.write_bytes(default_tokenizer_path().read_bytes().replace(b"\n", b"\r\n"))
    assert read_world_vocab(path) == vocab


# --- Hugging Face tokenizer.json --------------------------------------------------------------

SENTENCES = [
    "The quick brown fox jumps over the lazy dog.",
    "RWKV is an RNN with transformer-level performance.",
    "你好，世界！我们在测试分词器。",
    "Emoji are fun 😀🎉 and so are accents: café, naïve.",
    "def hello():\n    return 'world'\n",
] * 20


@pytest.fixture(scope="module")
def hf_path(tmp_path_factory) -> Path:
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tk = Tokenizer(models.BPE())
    tk.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tk.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=["<|endoftext|>", "<|padding|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tk.train_from_iterator(SENTENCES, trainer)
    path = tmp_path_factory.mktemp("hf") / "tokenizer.json"
    tk.save(str(path))
    return path


def test_hf_tokenizer_matches_the_library(hf_path):
    from tokenizers import Tokenizer

    lib = Tokenizer.from_file(str(hf_path))
    tk = load_tokenizer(hf_path)
    assert isinstance(tk, HFTokenizer)
    assert tk.vocab_size == lib.get_vocab_size(with_added_tokens=True)
    assert tk.eos_id == 0 and HFTokenizer(hf_path, eos_id=1).eos_id == 1
    for text in [*SENTENCES[:5], "unseen words ▁ and 日本語 text\t\r\n  spaces", ""]:
        ids = tk.encode(text)
        assert ids == lib.encode(text, add_special_tokens=False).ids
        assert tk.decode_bytes(ids) == text.encode("utf-8")
        assert tk.decode(ids) == lib.decode(ids) == text
        assert b"".join(tk.token_bytes(i) for i in ids) == text.encode("utf-8")


def test_hf_tokenizer_bytes_and_streaming(hf_path):
    tk = HFTokenizer.from_file(hf_path)
    text = "新的字符 🤖 unseen"
    ids = tk.encode(text)
    assert any(_splits_a_character(tk.token_bytes(i)) for i in ids)  # byte-level pieces
    stream = StreamDecoder(tk)
    chunks = [stream.push(i) for i in ids] + [stream.flush()]
    assert "".join(chunks) == text and all("\ufffd" not in c for c in chunks)
    data = b"ok \xff\xe4 fox \x80"
    assert tk.decode_bytes(tk.encode_bytes(data)) == data
    assert tk.encode_bytes(b"the fox") == tk.encode("the fox")
    assert tk.decode([0, *tk.encode("fox")]) == "fox"  # special tokens add no text


def test_hf_tokenizer_errors(tmp_path):
    bad = tmp_path / "tokenizer.json"
    bad.write_text('{"model": {"type": "Nonsense"}}', encoding="utf-8")
    with pytest.raises(TokenizerError, match="tokenizer.json: cannot load tokenizer.json"):
        load_tokenizer(bad)
    with pytest.raises(TokenizerError, match="not found"):
        HFTokenizer(tmp_path / "missing.json")
