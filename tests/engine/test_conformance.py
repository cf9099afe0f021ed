"""Our engine against the reference `rwkv` package (0.8.32, torch CPU fp32).

The golden files were made by tests/golden/make_golden.py; the `reference` tests run the
package live when torch and rwkv are installed. The golden comparisons run on both
backends: numpy, and the GPU one (fp32 weights) when a WebGPU adapter is there.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import reference
from conformance_cases import CASES, GREEDY_STEPS, prompt_for
from engine_helpers import BACKENDS, greedy, rel_err, synthetic_model

GOLDEN = Path(__file__).resolve().parents[1] / "golden"
TOLERANCE = 1e-3  # max |Δlogits| / std(logits), from the engine issue


@pytest.mark.parametrize("backend", BACKENDS)
@pytest.mark.parametrize("name", sorted(CASES))
def test_matches_golden_logits(name, backend):
    version, kwargs = CASES[name]
    golden = np.load(GOLDEN / f"{name}.npz")
    model = synthetic_model(version, backend=backend, **kwargs)
    assert model.info.version == version
    logits, tokens = greedy(model, golden["prompt"].tolist(), GREEDY_STEPS)
    errors = [rel_err(ours, theirs) for ours, theirs in zip(logits, golden["logits"])]
    assert max(errors) < TOLERANCE, f"worst step {int(np.argmax(errors))}: {max(errors):.2e}"
    assert tokens == golden["tokens"].tolist()


@pytest.mark.parametrize("name", [n for n in sorted(CASES) if n.startswith(("v5.2", "v6", "v7"))])
def test_matches_golden_logits_without_numba(name, numpy_only):
    test_matches_golden_logits(name, "numpy")


def test_golden_prompts_are_the_cases_prompts():
    # Guards the golden files against a silent change of the case list or prompt recipe.
    for name, (_, kwargs) in CASES.items():
        assert np.load(GOLDEN / f"{name}.npz")["prompt"].tolist() == prompt_for(name, kwargs["vocab"])


@pytest.mark.reference
@pytest.mark.skipif(not reference.available(), reason="torch and rwkv are not installed")
@pytest.mark.parametrize("name", ["v4-L2-D64", "v5.0-L2-D64-N32", "v5.1-L2-D64-N32", "v5.2-L3-D128-N64",
                                  "v6-L3-D128-N64", "v7-L3-D128-N64"])
def test_matches_reference_live(name):
    from ai00_like.rwkv.synthetic import make_checkpoint

    version, kwargs = CASES[name]
    kwargs = dict(kwargs, seed=kwargs["seed"] + 1000)  # a checkpoint the golden files never saw
    prompt = prompt_for(name + "/live", kwargs["vocab"])
    want_logits, want_tokens = reference.greedy_run(make_checkpoint(version, **kwargs), version, prompt, 16)
    logits, tokens = greedy(synthetic_model(version, **kwargs), prompt, 16)
    assert max(rel_err(a, b) for a, b in zip(logits, want_logits)) < TOLERANCE
    assert tokens == want_tokens.tolist()
