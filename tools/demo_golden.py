"""Regenerate tests/golden/demo_logits.npz: the reference `rwkv` package run on the demo model.

    .venv/bin/pip install torch==2.13.0 rwkv==0.8.32
    nice -n 19 .venv/bin/python tools/demo_golden.py

Run it after every retraining (tests/engine/test_demo_model.py checks that the golden file belongs
to the shipped demo.st). The reference reads the fp16 file's weights widened to fp32, the
same numbers our engine computes with.
"""

from __future__ import annotations

import hashlib
import sys
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from reference import greedy_run

from ai00_like.rwkv.loader import read_checkpoint
from ai00_like.rwkv.tokenizer import load_tokenizer

MODEL = REPO / "assets" / "models" / "demo.st"
VOCAB = REPO / "assets" / "models" / "demo_vocab.txt"
GOLDEN = REPO / "tests" / "golden" / "demo_logits.npz"
PROMPT_TOKENS, STEPS = 100, 64

# Held-out text (Ruth 1:1-4, a book the model never trained on), as the plain documents render it.
PROMPT_TEXT = (
    "Ruth 1\n"
    "Now it came to pass in the days when the judges ruled, that there was a famine in the land. "
    "And a certain man of Bethlehemjudah went to sojourn in the country of Moab, he, and his wife, and his two sons.\n"
    "And the name of the man was Elimelech, and the name of his wife Naomi, and the name of his two sons "
    "Mahlon and Chilion, Ephrathites of Bethlehemjudah. And they came into the country of Moab, and continued there.\n"
    "And Elimelech Naomi's husband died; and she was left, and her two sons.\n"
    "And they took them wives of the women of Moab; the name of the one was Orpah, and the name of the other Ruth: "
    "and they dwelled there about ten years.\n"
)


def file_digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def main() -> None:
    prompt = load_tokenizer(VOCAB).encode(PROMPT_TEXT)[:PROMPT_TOKENS]
    assert len(prompt) == PROMPT_TOKENS, len(prompt)
    tensors = {k: np.asarray(v, dtype=np.float32) for k, v in read_checkpoint(MODEL).tensors.items()}
    logits, tokens = greedy_run(tensors, "7", prompt, STEPS)
    np.savez_compressed(GOLDEN, prompt=np.array(prompt), logits=logits.astype(np.float32), tokens=tokens,
                        model_sha256=np.array(file_digest(MODEL)))
    print(f"{GOLDEN.name}: logits {logits.shape}, greedy {tokens[:8].tolist()}…")


if __name__ == "__main__":
    main()
