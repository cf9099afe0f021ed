"""The conformance matrix: every file form users have, on every backend, against the reference.

Released RWKV models are bf16 `.pth` files; Ai00 users bring fp16 `.st` files in the
official or the web-rwkv layout, and quantised "prefab" files. Each form of each version
is written here as such a file and loaded with `load_model` at precision "auto" (the
file's own). The reference package runs on the same weights the file holds, widened to
fp32 (a bf16 file's rounded values, a prefab's dequantised blocks), so every form is exact:
within 1e-3 of the logits' std over a 100-token prompt and 32 greedy steps, with the same
greedy tokens. (How far fp16, Int8 and NF4 are from the fp32 weights they came from is
bench/gpu.py's and docs/models.md's table's business.)
"""

from __future__ import annotations

import functools
import hashlib

import numpy as np
import pytest

import reference
from conformance_cases import CASES, prompt_for
from engine_helpers import NEEDS_GPU, greedy, rel_err

from ai00_like.rwkv import load_model
from ai00_like.rwkv.formats.pth import write_pth
from ai00_like.rwkv.formats.safetensors import write_safetensors
from ai00_like.rwkv.cpu.int8 import PackedInt8
from ai00_like.rwkv.cpu.panels import Int8Panels
from ai00_like.rwkv.loader import read_checkpoint
from ai00_like.rwkv.quant import quantise_tensors
from ai00_like.rwkv.synthetic import make_checkpoint

pytestmark = [
    pytest.mark.reference,
    pytest.mark.skipif(not reference.available(), reason="torch and rwkv are not installed"),
]

TOLERANCE = 1e-3
STEPS = 32
# 128 channels where a version has such a case: Int8 rows of whole blocks stay packed on the CPU.
VERSIONS = ["v4-L2-D64", "v5.0-L2-D64-N32", "v5.1-L2-D64-N32", "v5.2-L3-D128-N64", "v6-L3-D128-N64",
            "v7-L3-D128-N64"]


def _quantised(kind: str):
    return lambda tensors, path: write_safetensors(quantise_tensors(tensors, 2, kind), path)


# form → (file name, writer, the precision "auto" keeps on the numpy backend, quantised at
# load, the head quantised at load too)
FORMS = {
    "bf16.pth": ("model.pth", lambda t, p: write_pth(t, p, "bf16"), "bf16"),
    "bf16.pth, int8 at load": ("model.pth", lambda t, p: write_pth(t, p, "bf16"), "bf16", "int8"),
    "bf16.pth, nf4 at load": ("model.pth", lambda t, p: write_pth(t, p, "bf16"), "bf16", "nf4"),
    "bf16.pth, nf4 and an int8 head at load": ("model.pth", lambda t, p: write_pth(t, p, "bf16"), "bf16", "nf4", True),
    "fp16.pth": ("model.pth", lambda t, p: write_pth(t, p, "fp16"), "fp16"),
    "fp32.pth": ("model.pth", lambda t, p: write_pth(t, p, "fp32"), "fp32"),
    "fp16.st": ("model.st", lambda t, p: write_safetensors(t, p, layout="official", dtype="fp16"), "fp16"),
    "web-rwkv.st": ("model.st", lambda t, p: write_safetensors(t, p, layout="web-rwkv", dtype="fp16"), "fp16"),
    "int8 prefab": ("model.st", _quantised("int8"), "fp16"),
    "nf4 prefab": ("model.st", _quantised("nf4"), "fp16"),
}
DEVICES = ["cpu", pytest.param("gpu", marks=NEEDS_GPU)]


def _quant(form: str) -> str | None:
    return FORMS[form][3] if len(FORMS[form]) > 3 else None


def _quant_head(form: str) -> bool:
    return len(FORMS[form]) > 4 and FORMS[form][4]


@functools.cache
def _file(case: str, form: str, folder) -> str:
    version, kwargs = CASES[case]
    name, write = FORMS[form][:2]
    path = folder / f"{case}-{form.replace(' ', '-')}-{name}"
    write(make_checkpoint(version, **kwargs), path)
    return str(path)


def _digest(tensors: dict[str, np.ndarray], prompt: list[int]) -> str:
    h = hashlib.sha256(np.asarray(prompt, dtype=np.int64).tobytes())
    for name in sorted(tensors):
        h.update(name.encode())
        h.update(tensors[name].tobytes())
    return h.hexdigest()


@functools.cache
def _reference(folder) -> dict[tuple[str, str], tuple[np.ndarray, np.ndarray]]:
    """The reference's logits and tokens for every (case, form), in two subprocesses.
    Forms whose weights widen to the same values (fp16 in .pth and in both .st layouts) are
    run once: the reference's time is most of this module's."""
    out = {}
    for v7 in (False, True):
        keys = [(c, f) for c in VERSIONS for f in FORMS if (CASES[c][0] == "7") == v7]
        jobs: dict[str, tuple] = {}  # digest → job
        digests = []
        for case, form in keys:
            tensors = read_checkpoint(_file(case, form, folder)).tensors
            if _quant(form):  # what the loader will compute with: the file's weights, quantised
                tensors = quantise_tensors(tensors, 99, _quant(form), head=_quant_head(form))
            widened = {k: np.asarray(v, dtype=np.float32) for k, v in tensors.items()}
            prompt = prompt_for(case, CASES[case][1]["vocab"])
            digests.append(_digest(widened, prompt))
            jobs.setdefault(digests[-1], (widened, prompt))
        results = dict(zip(jobs, reference.greedy_runs(list(jobs.values()), v7, STEPS)))
        out.update((key, results[digest]) for key, digest in zip(keys, digests))
    return out


@pytest.fixture(scope="module")
def folder(tmp_path_factory):
    return tmp_path_factory.mktemp("file-forms")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("form", list(FORMS))
@pytest.mark.parametrize("case", VERSIONS)
def test_every_file_form_matches_the_reference(folder, case, form, device):
    want_logits, want_tokens = _reference(folder)[case, form]
    model = load_model(_file(case, form, folder), device, quant=99 if _quant(form) else 0,
                       quant_type=_quant(form) or "none", quant_head=_quant_head(form))
    if device == "cpu":  # "auto" keeps the file's own precision; Int8 stays packed
        assert model.precision == FORMS[form][2]
        packed = isinstance(model.blocks[0].channel_mix.W["key"], (PackedInt8, Int8Panels))  # rows, or panels (AVX-512)
        whole_blocks = model.info.n_embd % 128 == 0
        assert packed == ((form == "int8 prefab" or _quant(form) == "int8") and whole_blocks)
        assert isinstance(model.head, (PackedInt8, Int8Panels)) == (_quant_head(form) and whole_blocks)
    logits, tokens = greedy(model, prompt_for(case, CASES[case][1]["vocab"]), STEPS)
    errors = [rel_err(ours, theirs) for ours, theirs in zip(logits, want_logits)]
    assert max(errors) < TOLERANCE, f"worst step {int(np.argmax(errors))}: {max(errors):.2e}"
    assert tokens == want_tokens.tolist()
