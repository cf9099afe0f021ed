"""Grammar-constrained decoding on llguidance: compiled grammars, and one matcher per choice.

Why llguidance (see bench/grammar.py for the figures): it builds its token index from the
vocabulary's byte strings (our World vocabulary is a greedy longest-match byte trie, not a
BPE, so an engine that only reads HF tokenizers would not fit), computes the mask of a
65,536-token vocabulary in tens of microseconds with the GIL released, speaks Lark (which
KBNF translates into, see kbnf.py) and JSON Schema including inline `%json {…}` inside a
Lark grammar (which tool calling needs), and reports grammar errors as text we can return
in a 400.

What is cached, and why it is cheap per request:

* `vocabulary(tokenizer, vocab)`: the llguidance token index of a tokenizer, built once
  (≈ 0.2 s for 65,536 tokens) and kept while the tokenizer lives.
* `compile_grammar(lark, tokenizer, vocab)`: a checked, ready matcher for a grammar text,
  kept in an LRU; a request's matchers are `deep_copy`s of it (microseconds).

Per step (`GrammarConstraint`): `allowed()` before sampling, `advance(token)` after it.
Once the grammar is complete, or a token it did not allow was forced in (logit_bias can do
that), only end-of-text is allowed, so the reply ends with finish_reason "stop".
"""

from __future__ import annotations

import json
import threading
import weakref
from collections import OrderedDict

import llguidance
import numpy as np

EOS = 0  # RWKV's end-of-text id, in every vocabulary we load
COMPILED_CACHE_SIZE = 256

# JSON the way Python's json.dumps writes it: one space after ',' and ':', no other
# whitespace. Small models happily emit whitespace forever when it is allowed.
JSON_STYLE = {"whitespace_flexible": False, "item_separator": ", ", "key_separator": ": "}


class GrammarError(ValueError):
    """A grammar, schema or tool definition that does not compile; the message says why."""


class _VocabularyWrapper:
    """The attributes llguidance's TokenizerWrapper reads: every id's bytes, and an encoder."""

    def __init__(self, tokenizer, vocab: int):
        size = getattr(tokenizer, "vocab_size", vocab)
        self.eos_token_id = EOS
        self.bos_token_id = None
        # Ids the tokenizer does not know (a model whose head is wider than its vocabulary)
        # have no bytes: llguidance never allows an empty token except as end-of-text.
        self.tokens = [b"" if i == EOS or i >= size else tokenizer.token_bytes(i) for i in range(vocab)]
        self.special_token_ids = [EOS]
        self._tokenizer = tokenizer

    def __call__(self, text: bytes | str) -> list[int]:
        return self._tokenizer.encode_bytes(text if isinstance(text, bytes) else text.encode("utf-8"))


_vocabularies: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_compiled: OrderedDict = OrderedDict()
_lock = threading.Lock()


def vocabulary(tokenizer, vocab: int) -> llguidance.LLTokenizer:
    """The llguidance index of `tokenizer` with `vocab` ids (the model's logits width), cached."""
    with _lock:
        per_size = _vocabularies.setdefault(tokenizer, {})
        if vocab not in per_size:
            wrapper = llguidance.TokenizerWrapper(_VocabularyWrapper(tokenizer, vocab))
            per_size[vocab] = llguidance.LLTokenizer(wrapper, n_vocab=vocab, eos_token=EOS)
        return per_size[vocab]


class Grammar:
    """A compiled grammar for one vocabulary: the template every request's matcher copies."""

    def __init__(self, template: llguidance.LLMatcher, vocab: int, source: str):
        self._template, self.vocab, self.source = template, vocab, source

    def start(self) -> GrammarConstraint:
        return GrammarConstraint(self._template.deep_copy(), self.vocab)


def json_rule(schema: dict, *, lenient: bool = False) -> str:
    """The right-hand side of a Lark rule that accepts the JSON documents of `schema`."""
    options = dict(JSON_STYLE, lenient=lenient)
    with_options = dict(schema)
    with_options["x-guidance"] = {**options, **(schema.get("x-guidance") or {})}
    return "%json " + json.dumps(with_options, ensure_ascii=False)


def compile_grammar(lark: str, tokenizer, vocab: int) -> Grammar:
    """Compile (or find in the cache) a Lark grammar; GrammarError says what is wrong."""
    index = vocabulary(tokenizer, vocab)
    key = (index, lark)  # the index itself (hashed by identity), so its id cannot be reused while cached
    with _lock:
        hit = _compiled.get(key)
        if hit is not None:
            _compiled.move_to_end(key)
            return hit
    text = llguidance.LLMatcher.grammar_from_lark(lark)
    error = llguidance.LLMatcher.validate_grammar(text, index)
    if error:
        raise GrammarError(_first_lines(error))
    template = llguidance.LLMatcher(index, text, log_level=0)
    if template.is_error():
        raise GrammarError(_first_lines(template.get_error()))
    grammar = Grammar(template, vocab, lark)
    with _lock:
        _compiled[key] = grammar
        while len(_compiled) > COMPILED_CACHE_SIZE:
            _compiled.popitem(last=False)
    return grammar


def _first_lines(message: str, limit: int = 6) -> str:
    lines = [line for line in message.strip().splitlines() if line.strip()]
    return "\n".join(lines[:limit])


class GrammarConstraint:
    """One choice's position in its grammar."""

    def __init__(self, matcher: llguidance.LLMatcher, vocab: int):
        self.matcher, self.vocab = matcher, vocab
        self._bits = np.zeros((vocab + 31) // 32, dtype=np.int32)
        self._only_eos = np.zeros(vocab, dtype=bool)
        self._only_eos[EOS] = True

    def allowed(self) -> np.ndarray:
        """bool [vocab]: the tokens the grammar allows next (end-of-text once it may end)."""
        if self.matcher.is_error():
            return self._only_eos
        # Computed straight into our buffer; llguidance drops the GIL while it works.
        self.matcher.unsafe_compute_mask_ptr(self._bits.ctypes.data, self._bits.nbytes)
        return np.unpackbits(self._bits.view(np.uint8), count=self.vocab, bitorder="little").view(bool)

    @property
    def complete(self) -> bool:
        """The text is whole: the grammar allows nothing more but end-of-text."""
        return self.matcher.is_stopped() and not self.matcher.is_error()

    def advance(self, token: int) -> None:
        """The sampled token joins the text. A token the grammar refused leaves the matcher in
        its error state, after which only end-of-text is allowed."""
        if token == EOS or self.matcher.is_error():
            return
        self.matcher.consume_token(int(token))

    def clone(self) -> GrammarConstraint:
        return GrammarConstraint(self.matcher.deep_copy(), self.vocab)
