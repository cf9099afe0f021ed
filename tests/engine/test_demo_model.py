"""The bundled demo model (assets/models/demo.st, trained by tools/train_demo.py).

What it must show (issue 5): it loads through the code path of a released model, its
vocabulary is a proper subset of the World vocabulary, our engine computes what the
reference package computes on it, and served through our own core it writes real words and
ends chat answers at the blank line. Assertions are about properties, never about an exact
text, so that a retraining does not break them (the golden logits excepted: they are
regenerated with the model, and the test says so when they are stale).
"""

from __future__ import annotations

import gzip
import hashlib
import json
import re
from pathlib import Path

import numpy as np
import pytest
import reference
from engine_helpers import greedy, rel_err
from serving_helpers import generate, load

from ai00_like.messages import Loaded, ModelSpec
from ai00_like.middleware import Middleware
from ai00_like.rwkv import load_model
from ai00_like.rwkv.loader import read_checkpoint, read_tensors
from ai00_like.rwkv.tokenizer import default_tokenizer_path, load_tokenizer, read_world_vocab
from ai00_like.sampler import Nucleus, SamplingOptions

REPO = Path(__file__).resolve().parents[2]
MODELS = REPO / "assets" / "models"
MODEL, VOCAB, WORDS = MODELS / "demo.st", MODELS / "demo_vocab.txt", MODELS / "demo_words.txt.gz"
GOLDEN = Path(__file__).resolve().parents[1] / "golden" / "demo_logits.npz"
TOLERANCE = 1e-3  # max |Δlogits| / std(logits), the engine's conformance bar

WORD = re.compile(r"[A-Za-z]+(?:'[A-Za-z]+)*")  # as tools/demo_data.py splits the training text

# Openings of verses from the held-out books (Ruth 1:16, Micah 6:8, James 1:17, Jonah 1:17):
# the model never saw these verses, only the language around them.
HELD_OUT_PROMPTS = [
    "And Ruth said, Intreat me not to leave thee, or to return from following after thee: for whither thou goest,",
    "He hath shewed thee, O man, what is good; and what doth the LORD require of thee,",
    "Every good gift and every perfect gift is from above, and cometh down",
    "Now the LORD had prepared a great fish to swallow up Jonah.",
]
CHAT_QUESTIONS = [
    "Tell me a verse about mercy.",
    "What does Ruth 1:16 say?",
    "Continue the verse: Every good gift and every perfect gift",
    "Who was Jonah?",
]


@pytest.fixture(scope="module")
def words() -> set[str]:
    with gzip.open(WORDS, "rt", encoding="utf-8") as f:
        return set(f.read().split())


@pytest.fixture(scope="module")
def middleware():
    mw = Middleware()
    assert isinstance(load(mw, ModelSpec(path=str(MODEL), tokenizer=str(VOCAB), max_batch=4)), Loaded)
    yield mw
    mw.close()


def real_word_share(text: str, known: set[str]) -> tuple[float, int]:
    found = [w.lower() for w in WORD.findall(text)]
    return (sum(w in known for w in found) / len(found) if found else 0.0), len(found)


def chat_prompt(question: str) -> str:
    return f"User: {question}\n\nAssistant:"  # the chat route's default template


# ------------------------------------------------------------------------------ the files


def test_model_file_is_an_official_v7_checkpoint():
    assert MODEL.stat().st_size <= 20 * 1000 * 1000
    info = load_model(MODEL).info  # the same entry point as a released model
    assert info.version == "7" and info.head_size == 64 and info.n_embd == info.n_head * 64
    assert info.vocab == load_tokenizer(VOCAB).vocab_size
    # Official names and shapes (rwkv-spec §1.2): ln0 only in block 0, v0/v1/v2 in every block
    # (unused in block 0), r_k per head, no ffn receptance; stored fp16 in the official layout.
    tensors, layout = read_tensors(MODEL)
    assert layout == "official"
    C, H, N = info.n_embd, info.n_head, info.head_size
    assert "blocks.0.ln0.weight" in tensors and "blocks.1.ln0.weight" not in tensors
    for i in range(info.n_layer):
        b = f"blocks.{i}."
        for name in ("x_r", "x_w", "x_k", "x_v", "x_a", "x_g", "w0", "a0", "v0", "k_k", "k_a"):
            assert tensors[b + "att." + name].shape == (1, 1, C)
        assert tensors[b + "att.v1"].shape[0] == C and tensors[b + "att.v2"].shape[1] == C
        assert tensors[b + "att.r_k"].shape == (H, N)
        assert tensors[b + "ffn.key.weight"].shape == (4 * C, C)
        assert b + "ffn.receptance.weight" not in tensors
        assert tensors[b + "att.key.weight"].dtype == np.float16


def test_vocab_is_a_subset_of_the_world_vocab_with_all_bytes():
    demo = read_world_vocab(VOCAB)
    world = set(read_world_vocab(default_tokenizer_path()).values())
    assert sorted(demo) == list(range(1, len(demo) + 1))  # renumbered 1..V-1; 0 is end-of-text
    assert all(demo[b + 1] == bytes([b]) for b in range(256))  # bytes keep their World ids
    assert all(raw in world for raw in demo.values())
    assert len(set(demo.values())) == len(demo)


def naive_greedy(vocab: dict[int, bytes], data: bytes) -> list[int]:
    """Longest match by brute force: the definition WorldTokenizer must meet on any vocab."""
    by_bytes = {raw: tid for tid, raw in vocab.items()}
    longest = max(map(len, by_bytes))
    out, i = [], 0
    while i < len(data):
        n = next(n for n in range(min(longest, len(data) - i), 0, -1) if data[i : i + n] in by_bytes)
        out.append(by_bytes[data[i : i + n]])
        i += n
    return out


def test_world_tokenizer_is_exact_on_the_subset_vocab():
    tok = load_tokenizer(VOCAB)
    vocab = read_world_vocab(VOCAB)
    samples = [
        *HELD_OUT_PROMPTS,
        *(chat_prompt(q) for q in CHAT_QUESTIONS),
        "Thus saith the LORD of hosts; Consider your ways.\n\nUser: Hello\tthere  café 你好 😀 x\\y",
        " ".join(HELD_OUT_PROMPTS) * 3,
    ]
    rng = np.random.default_rng(5)
    for text in samples:
        data = text.encode()
        assert tok.encode(text) == naive_greedy(vocab, data)
        assert tok.decode(tok.encode(text)) == text
    noise = rng.integers(0, 256, 500, dtype=np.uint8).tobytes()
    assert tok.encode_bytes(noise) == naive_greedy(vocab, noise)


# ------------------------------------------------------------------------------ conformance


def test_engine_matches_golden_reference_logits():
    golden = np.load(GOLDEN)
    digest = hashlib.sha256(MODEL.read_bytes()).hexdigest()
    assert str(golden["model_sha256"]) == digest, "demo.st changed: run tools/demo_golden.py"
    logits, tokens = greedy(load_model(MODEL), golden["prompt"].tolist(), len(golden["tokens"]))
    errors = [rel_err(ours, theirs) for ours, theirs in zip(logits, golden["logits"])]
    assert max(errors) < TOLERANCE, f"worst step {int(np.argmax(errors))}: {max(errors):.2e}"
    assert tokens == golden["tokens"].tolist()


@pytest.mark.reference
@pytest.mark.skipif(not reference.available(), reason="torch and rwkv are not installed")
def test_engine_matches_reference_live():
    tok = load_tokenizer(VOCAB)
    prompt = tok.encode(" ".join(HELD_OUT_PROMPTS) * 2)[:100]
    tensors = {k: np.asarray(v, dtype=np.float32) for k, v in read_checkpoint(MODEL).tensors.items()}
    want_logits, want_tokens = reference.greedy_run(tensors, "7", prompt, 64)
    logits, tokens = greedy(load_model(MODEL), prompt, 64)
    assert max(rel_err(a, b) for a, b in zip(logits, want_logits)) < TOLERANCE
    assert tokens == want_tokens.tolist()


# ------------------------------------------------------------------------------ served


def test_greedy_continuations_of_held_out_text_are_real_words(middleware, words):
    replies = [generate(middleware, p, max_tokens=48) for p in HELD_OUT_PROMPTS]
    for prompt, reply in zip(HELD_OUT_PROMPTS, replies):
        result = reply.wait()
        assert result.failed is None
        share, count = real_word_share(result.text[0], words)
        assert count >= 10, f"{prompt!r} → {result.text[0]!r}"
        assert share >= 0.9, f"{share:.0%} real words: {prompt!r} → {result.text[0]!r}"


# Greedy picks after the chat route's default repetition penalties (Ai00's 0.3/0.3): without
# any penalty a model this small can loop on a phrase ("nor my judgments, nor my judgments, …")
# and never reach the blank line, as greedy decoding of small models does.
CHAT_GREEDY = SamplingOptions(sampler=Nucleus(temperature=0))


def test_chat_answers_end_at_the_blank_line(middleware, words):
    replies = [generate(middleware, chat_prompt(q), options=CHAT_GREEDY, max_tokens=200, stop=("\n\n",))
               for q in CHAT_QUESTIONS]
    for question, reply in zip(CHAT_QUESTIONS, replies):
        result = reply.wait()
        answer = result.text[0]
        assert result.finish == ["stop"], f"{question!r} → {answer!r}"
        assert "\n\n" not in answer
        share, count = real_word_share(answer, words)
        assert count >= 3 and share >= 0.9, f"{question!r} → {answer!r}"


def test_sampled_chat_answers_also_stop(middleware):
    # The chat route's default sampler (Ai00's: top_p 0.5, penalties 0.3) with seeds.
    for seed in range(4):
        options = SamplingOptions(sampler=Nucleus(), seed=seed)
        result = generate(middleware, chat_prompt(CHAT_QUESTIONS[0]), options=options, max_tokens=200,
                          stop=("\n\n",)).wait()
        assert result.finish == ["stop"], f"seed {seed} → {result.text[0]!r}"


def test_sampling_with_a_seed_is_reproducible(middleware):
    def run(seed):
        options = SamplingOptions(sampler=Nucleus(temperature=1.0, top_p=0.9), seed=seed)
        return generate(middleware, HELD_OUT_PROMPTS[0], options=options, max_tokens=32).wait().tokens[0]

    first = run(7)
    assert len(first) == 32
    assert run(7) == first
    assert run(8) != first  # the seed is what makes it repeat, not a lack of randomness


# ------------------------------------------------------------------------------ G1 formats
# The demo model also trained on synthetic chats in the RWKV7-G1 formats (tools/demo_data.py):
# thinking, short JSON answers, tool calls. Served unconstrained (no grammar), greedy after the
# chat route's default penalties, on questions about held-out verses, most replies must come
# out well-formed (tools/demo_eval.py measures the rates over 50 prompts; see the model card).

G1_THINK = re.compile(r" <think>\n[^\n].*\n</think>\n\S.*", re.S)
G1_CALL = re.compile(r" ?(?:<think>\n.*?</think>\n)?<tool_call>(.*)</tool_call>", re.S)
THINK_QUESTIONS = ["What does Ruth 1:16 say? think", "Tell me a verse about mercy. think a bit",
                   "In which book is this verse: Every good gift and every perfect gift think a lot",
                   "What does Micah 6:8 say? think"]
JSON_QUESTIONS = ["What does Ruth 1:16 say? Answer in JSON.", "Give Jonah 1:17 as JSON.",
                  "Give the book and chapter of this verse as JSON: Every good gift and every perfect gift",
                  "How often is the word fish in Jonah 1:17? Answer in JSON."]
_S, _I = {"type": "string"}, {"type": "integer"}
G1_TOOLS = {
    "find_verse": ("Find a verse by book, chapter and verse.", {"book": _S, "chapter": _I, "verse": _I}),
    "get_weather": ("Get the weather of a city.", {"city": _S}),
    "add_numbers": ("Add two numbers.", {"a": _I, "b": _I}),
    "count_verses": ("Count the verses of a book.", {"book": _S}),
}
TOOL_REQUESTS = [("Look up Genesis 1:3.", "find_verse"), ("What is the weather in Jerusalem?", "get_weather"),
                 ("What is 12 plus 30?", "add_numbers"), ("How many verses hath Exodus?", "count_verses")]


def tool_prompt(request: str) -> tuple[str, set[str]]:
    """The chat route's prompt for `request` with all G1_TOOLS offered."""
    from ai00_like.api.oai.prompt import render_chat
    from ai00_like.api.oai.tools import with_tools
    from ai00_like.api.oai.types import ChatMessage, FunctionDef, ToolDef

    tools = [ToolDef(function=FunctionDef(name=n, description=d, parameters={
        "type": "object", "properties": p, "required": list(p)})) for n, (d, p) in G1_TOOLS.items()]
    return render_chat(with_tools([ChatMessage(role="user", content=request)], tools)).prompt, set(G1_TOOLS)


def replies(middleware, prompts: list[str], max_tokens: int) -> list[tuple[str, str]]:
    sent = [generate(middleware, p, options=CHAT_GREEDY, max_tokens=max_tokens, stop=("\n\n",)) for p in prompts]
    out = []
    for reply in sent:
        result = reply.wait()
        assert result.failed is None
        out.append((result.text[0], result.finish[0]))
    return out


def test_g1_thinking_closes_and_answers(middleware):
    got = replies(middleware, [chat_prompt(q) for q in THINK_QUESTIONS], 200)
    good = [finish == "stop" and bool(G1_THINK.fullmatch(text)) for text, finish in got]
    assert sum(good) >= 3, got
    # Thinking switched off ("fake think"): the answer follows the empty block at once.
    got = replies(middleware, [chat_prompt(q.rsplit(" think", 1)[0]) + " <think>\n</think" for q in THINK_QUESTIONS], 200)
    good = [finish == "stop" and text.startswith(">\n") and bool(text[2:].strip()) for text, finish in got]
    assert sum(good) >= 3, got


def test_g1_json_answers_parse(middleware):
    got = replies(middleware, [chat_prompt(q) for q in JSON_QUESTIONS], 64)
    parsed = []
    for text, _ in got:
        try:
            parsed.append(json.loads(text))
        except ValueError:
            parsed.append(None)
    assert sum(isinstance(p, dict) for p in parsed) >= 3, got


def test_g1_tool_calls_name_an_offered_tool(middleware):
    prompts = [tool_prompt(request) for request, _ in TOOL_REQUESTS]
    got = replies(middleware, [p for p, _ in prompts], 100)
    right = 0
    for (text, finish), (_, offered), (_, want) in zip(got, prompts, TOOL_REQUESTS):
        m = G1_CALL.fullmatch(text)
        try:
            call = json.loads(m.group(1)) if m else None
        except ValueError:
            call = None
        ok = isinstance(call, dict) and call.get("name") in offered and isinstance(call.get("arguments"), dict)
        right += ok and call["name"] == want
    assert right >= 3, got
