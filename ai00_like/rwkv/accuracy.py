"""How far a model (fp16, Int8, NF4) is from a reference (fp32) on the same tokens.

The measure of the precision table in docs/models.md and of the tests that hold it: the reference
decodes greedily from a prompt; the model is fed the same prompt and the reference's tokens
(so one near-tie cannot send it down another path and make every later step incomparable),
and at each of the steps we compare logits and greedy choices.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def greedy(model, prompt: Sequence[int], steps: int) -> tuple[np.ndarray, list[int]]:
    """Logits after the prompt and after each greedy step ([steps + 1, V]), and the greedy tokens."""
    logits, state = model.forward(prompt)
    rows, tokens = [logits], []
    for _ in range(steps):
        tokens.append(int(np.argmax(logits)))
        logits, state = model.forward([tokens[-1]], state)
        rows.append(logits)
    return np.stack(rows), tokens


def rel_err(got: np.ndarray, want: np.ndarray) -> float:
    """max |Δ| relative to the spread of the reference logits (rwkv-spec §5)."""
    return float(np.abs(np.asarray(got) - want).max() / np.asarray(want).std())


def against_reference(model, prompt: Sequence[int], reference_logits: np.ndarray, tokens: Sequence[int]):
    """(worst relative logit error over the steps, share of steps whose greedy token equals the
    reference's) with `model` fed `prompt` and then the reference's greedy `tokens`."""
    tokens = list(tokens)
    got = model.forward(list(prompt) + tokens, full_output=True)[0][len(prompt) - 1 :]
    worst = max(rel_err(g, w) for g, w in zip(got, reference_logits))
    agreement = float(np.mean(np.argmax(got[:-1], axis=1) == np.asarray(tokens)))
    return worst, agreement
