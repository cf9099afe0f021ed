"""World tokenizer: our WorldTokenizer against the reference rwkv TRIE_TOKENIZER, same run.

    .venv/bin/python bench/tokenizer.py [--size BYTES] [--repeat N]

Encodes the seeded mixed corpus of tests/golden/make_tokenizer_golden.py (English, Chinese,
code, emoji, whitespace runs, random bytes). "cold" is the first encode by a fresh tokenizer
(empty piece cache), "warm" a second encode of the same text. Prints a table, then one JSON line.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import time
from pathlib import Path

import record
from ai00_like.rwkv.tokenizer import WorldTokenizer, default_tokenizer_path

ROOT = Path(__file__).resolve().parents[1]


def mixed_corpus(seed: int, size: int) -> bytes:
    path = ROOT / "tests" / "golden" / "make_tokenizer_golden.py"
    spec = importlib.util.spec_from_file_location("make_tokenizer_golden", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module.mixed_corpus(seed, size)


def timed(fn, *args):
    t = time.perf_counter()
    result = fn(*args)
    return time.perf_counter() - t, result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", type=int, default=1_000_000, help="corpus bytes (default 1 MB)")
    ap.add_argument("--repeat", type=int, default=3, help="best of N timings (default 3)")
    ap.add_argument("--no-save", action="store_true", help=record.NO_SAVE_HELP)
    args = ap.parse_args()

    corpus = mixed_corpus(seed=0, size=args.size)
    txt = default_tokenizer_path()
    rows: list[tuple[str, float, float | None]] = []  # name, seconds, tokens/s

    load_txt = min(timed(WorldTokenizer.from_file, txt)[0] for _ in range(args.repeat))
    load_json = min(timed(WorldTokenizer.from_file, txt.with_suffix(".json"))[0] for _ in range(args.repeat))
    rows += [("ours: load .txt", load_txt, None), ("ours: load .json", load_json, None)]

    cold = warm = float("inf")
    for _ in range(args.repeat):
        tk = WorldTokenizer.from_file(txt)
        t, ours = timed(tk.encode_bytes, corpus)
        cold = min(cold, t)
        warm = min(warm, timed(tk.encode_bytes, corpus)[0])
    n = len(ours)
    rows += [("ours: encode (cold cache)", cold, n / cold), ("ours: encode (warm cache)", warm, n / warm)]
    decode = min(timed(tk.decode_bytes, ours)[0] for _ in range(args.repeat))
    rows.append(("ours: decode_bytes", decode, n / decode))

    result = {
        "bench": "tokenizer",
        "corpus_bytes": len(corpus),
        "tokens": n,
        "ours_load_txt_s": round(load_txt, 4),
        "ours_load_json_s": round(load_json, 4),
        "ours_encode_tokens_per_s": round(n / cold),
        "ours_encode_warm_tokens_per_s": round(n / warm),
        "ours_decode_tokens_per_s": round(n / decode),
    }
    try:
        import rwkv.rwkv_tokenizer as ref_module
    except ImportError:
        print("reference rwkv package not installed: ours only")
    else:
        ref_vocab = str(Path(ref_module.__file__).with_name("rwkv_vocab_v20230424.txt"))
        load_ref, ref = timed(ref_module.TRIE_TOKENIZER, ref_vocab)  # slow: load once
        ref_encode = float("inf")
        for _ in range(args.repeat):
            t, ref_ids = timed(ref.encodeBytes, corpus)
            ref_encode = min(ref_encode, t)
        if ref_ids != ours:
            raise SystemExit("MISMATCH: our ids differ from the reference")
        rows += [("reference: load .txt", load_ref, None), ("reference: encode", ref_encode, n / ref_encode)]
        result |= {
            "ref_load_txt_s": round(load_ref, 4),
            "ref_encode_tokens_per_s": round(n / ref_encode),
            "encode_ratio_ours_over_ref": round(ref_encode / cold, 2),
            "encode_warm_ratio_ours_over_ref": round(ref_encode / warm, 2),
            "identical_ids": True,
        }

    print(f"corpus: {len(corpus):,} bytes -> {n:,} tokens (best of {args.repeat})")
    print(f"{'':28} {'seconds':>9} {'tokens/s':>12}")
    for name, seconds, rate in rows:
        print(f"{name:28} {seconds:9.3f} {'' if rate is None else f'{rate:12,.0f}'}")
    print(json.dumps(result))
    record.save("tokenizer", result, args)


if __name__ == "__main__":
    main()
