"""Grammar benchmark: the cost of constrained decoding against a batch-1 decode step, same run.

The baseline is one batch-1 decode step of the seeded 0.1B-shaped v7 model (L12, D768,
V65536, fp32; bench/engine.py's shape) on our numpy engine. Against it, per generated token
under a grammar: computing the 65,536-token mask, applying it to the logits and advancing
the matcher — walked along a real document, token by token, with the World tokenizer:

* a JSON schema (response_format json_schema: nested object, enum, bounded numbers, array);
* Ai00's README example grammar (bnf_schema, translated to Lark);
* a tool call (tool_choice auto: free text or a call with JSON arguments).

Plus the one-off costs: the vocabulary index (once per tokenizer), a schema's first compile
and a cached one (per request: a copy of the compiled matcher). Prints a table, then one JSON
line of results and ratios.

    .venv/bin/python bench/grammar.py            # the 0.1B shape
    .venv/bin/python bench/grammar.py --quick    # a smaller model for the baseline
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("OPENBLAS_NUM_THREADS", "2")
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np
import record
from engine import SHAPES  # the seeded checkpoint shapes of bench/engine.py

from ai00_like.api.oai.tools import call_text, compact
from ai00_like.rwkv.tokenizer import default_tokenizer_path, load_tokenizer
from ai00_like.sampler import grammar as grammar_module
from ai00_like.sampler.grammar import compile_grammar, json_rule, vocabulary
from ai00_like.sampler.kbnf import AI00_README_EXAMPLE, kbnf_to_lark

VOCAB = 65536

SCHEMA = {
    "type": "object",
    "properties": {
        "name": {"type": "string", "maxLength": 40},
        "age": {"type": "integer", "minimum": 0, "maximum": 130},
        "role": {"enum": ["admin", "user", "guest"]},
        "score": {"type": "number", "minimum": 0, "maximum": 1},
        "address": {"type": "object", "properties": {"city": {"type": "string"}, "zip": {"type": "string"}},
                    "required": ["city"], "additionalProperties": False},
        "tags": {"type": "array", "items": {"type": "string"}, "maxItems": 8},
    },
    "required": ["name", "age", "role", "tags"],
    "additionalProperties": False,
}
DOCUMENT = compact({"name": "Ada Lovelace", "age": 36, "role": "admin", "score": 0.875,
                    "address": {"city": "London", "zip": "W1"}, "tags": ["math", "engines", "poetry"]})

KBNF_DOCUMENT = '{\n\t"name": "Ada",\n\t"age": 36,\n\t"job": "mathematician"\n}'

TOOL_LARK = "\n".join([
    "start: calls | FREE_TEXT",
    'calls: call ("\\n" call)*',
    "call: call_0",
    "CALL_OPEN: / ?<tool_call>\\{/",
    'call_0: CALL_OPEN "\\"name\\": \\"lookup\\", \\"arguments\\": " args_0 "}</tool_call>"',
    "args_0: " + json_rule(SCHEMA),
    r"FREE_TEXT: /(?s:.+)/ & ~/\s*<tool_call>(?s:.*)/",
])
TOOL_DOCUMENT = " " + call_text("lookup", DOCUMENT)


def decode_step_ms(shape: str) -> float:
    """Best per-step time of batch-1 decode steps of the seeded checkpoint."""
    from ai00_like.rwkv.batch import StepInput
    from ai00_like.rwkv.cpu.model import CpuModel
    from ai00_like.rwkv.info import detect
    from ai00_like.rwkv.synthetic import make_checkpoint

    tensors = make_checkpoint("7", seed=1, **SHAPES[shape])
    model = CpuModel(tensors, detect({k: a.shape for k, a in tensors.items()}), max_batch=1)
    model.step([StepInput(0, [1, 2, 3, 4])])
    times = []
    for i in range(24):
        t = time.perf_counter()
        model.step([StepInput(0, [100 + i], "last")])
        times.append(time.perf_counter() - t)
    return min(times) * 1e3


def per_token_ms(grammar, tokens: list[int]) -> dict:
    """Mask + apply + advance per token along `tokens`, then end-of-text."""
    logits = np.random.default_rng(0).standard_normal(VOCAB).astype(np.float32)
    out = np.empty_like(logits)
    constraint = grammar.start()
    times = []
    for token in tokens + [grammar_module.EOS]:
        t = time.perf_counter()
        allowed = constraint.allowed()
        np.copyto(out, logits)
        np.copyto(out, -np.inf, where=~allowed)
        constraint.advance(token)
        times.append(time.perf_counter() - t)
        assert allowed[token], f"the document leaves the grammar at token {token}"
    return {"tokens": len(times), "mean_ms": float(np.mean(times) * 1e3), "p90_ms": float(np.percentile(times, 90) * 1e3),
            "max_ms": float(np.max(times) * 1e3)}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="a 4-layer D256 model for the baseline step")
    parser.add_argument("--no-save", action="store_true", help=record.NO_SAVE_HELP)
    args = parser.parse_args()
    shape = "quick" if args.quick else "0.1B"

    tokenizer = load_tokenizer(default_tokenizer_path())
    t = time.perf_counter()
    vocabulary(tokenizer, VOCAB)
    index_s = time.perf_counter() - t

    schema_lark = "start: " + json_rule(SCHEMA)
    t = time.perf_counter()
    schema_grammar = compile_grammar(schema_lark, tokenizer, VOCAB)
    first_ms = (time.perf_counter() - t) * 1e3
    t = time.perf_counter()
    for _ in range(100):
        compile_grammar(schema_lark, tokenizer, VOCAB).start()
    cached_ms = (time.perf_counter() - t) * 10  # per request: cache hit plus a matcher copy

    rules, start = kbnf_to_lark(AI00_README_EXAMPLE)
    kbnf_grammar = compile_grammar(f"start: {start}\n{rules}", tokenizer, VOCAB)
    tool_grammar = compile_grammar(TOOL_LARK, tokenizer, VOCAB)

    runs = {
        "json_schema": per_token_ms(schema_grammar, tokenizer.encode(DOCUMENT)),
        "kbnf": per_token_ms(kbnf_grammar, tokenizer.encode(KBNF_DOCUMENT)),
        "tool_call": per_token_ms(tool_grammar, tokenizer.encode(TOOL_DOCUMENT)),
    }
    step = decode_step_ms(shape)

    print(f"vocabulary {VOCAB} tokens; baseline: v7 {shape} batch-1 decode step {step:.2f} ms")
    print(f"vocabulary index (once per tokenizer)      {index_s * 1e3:9.1f} ms")
    print(f"schema compile, first                       {first_ms:9.2f} ms")
    print(f"schema compile, cached (+ matcher copy)     {cached_ms:9.3f} ms")
    print(f"{'per token':28}{'tokens':>8}{'mean ms':>10}{'p90 ms':>10}{'max ms':>10}{'mean/step':>11}")
    for name, r in runs.items():
        print(f"{name:28}{r['tokens']:8d}{r['mean_ms']:10.3f}{r['p90_ms']:10.3f}{r['max_ms']:10.3f}"
              f"{r['mean_ms'] / step:10.2%}")
    results = {
        "shape": shape, "vocab": VOCAB, "decode_step_ms": step, "vocabulary_index_ms": index_s * 1e3,
        "schema_compile_first_ms": first_ms, "schema_compile_cached_ms": cached_ms, "per_token": runs,
        "ratios": {f"{name}_mask_vs_step": r["mean_ms"] / step for name, r in runs.items()},
    }
    print(json.dumps(results))
    record.save("grammar", results, args)


if __name__ == "__main__":
    main()
