"""What a loaded model keeps resident, as a user's `top` shows it: the weights in their
form and little else. Each test reads this process's pages from /proc (Linux)."""

from __future__ import annotations

import os
from pathlib import Path
import subprocess
import sys

import numpy as np
import pytest

from ai00_like.rwkv import load_model
from ai00_like.rwkv.batch import StepInput
from ai00_like.rwkv.cpu.skinny import skinny_matmul
from ai00_like.rwkv.formats.pth import write_pth
from ai00_like.rwkv.formats.safetensors import write_safetensors
from ai00_like.rwkv.loader import read_checkpoint
from ai00_like.rwkv.state import StatePool
from ai00_like.rwkv.synthetic import make_checkpoint

from memory_helpers import HAS_PAGEMAP, HAS_SMAPS, mapped_bytes, resident_bytes_of


@pytest.mark.skipif(not hasattr(os, "preadv") or not HAS_PAGEMAP, reason="needs preadv and Linux's pagemap")
@pytest.mark.parametrize("fmt,dtype", [("pth", "bf16"), ("pth", "fp16"), ("st", "fp16"), ("st", "fp32")])
def test_gathering_embedding_rows_maps_none_of_the_file(tmp_path, monkeypatch, fmt, dtype):
    # Read through the mapping, each row maps its whole page-cache folio for the length of
    # a step (16 rows of a 0.1B model: 29 MB of its peak memory); read from the file, none.
    from ai00_like.rwkv import formats
    from ai00_like.rwkv.formats import gather_rows

    tensors = make_checkpoint("7", n_layer=1, n_embd=64, head_size=32, vocab=65536, seed=3)
    path = tmp_path / f"m.{fmt}"
    (write_pth(tensors, path, dtype=dtype) if fmt == "pth" else write_safetensors(tensors, path, dtype=dtype))
    table = read_checkpoint(path, keep_bf16=True).tensors["emb.weight"]
    formats.release_pages(table)  # what reading the file's header and checks left mapped
    before = mapped_bytes(table)  # at most the two pages it shares with its neighbours
    monkeypatch.setattr(formats, "release_pages", lambda arr: None)  # nothing may need releasing
    ids = np.random.default_rng(1).integers(0, 65536, 40)
    rows = gather_rows(table, ids)
    assert mapped_bytes(table) == before <= 2 * 4096
    assert rows.dtype == table.dtype and rows.tobytes() == table[ids].tobytes()
    for wrong in ([65536], [-1]):  # never the bytes of the tensors beside it
        with pytest.raises(IndexError):
            gather_rows(table, np.array(wrong))


def test_a_small_table_is_read_in_place(tmp_path, monkeypatch):
    # preadv lets go of the GIL, and a serving step waited there for the event loop's turn;
    # a table this small may stay mapped whole.
    from ai00_like.rwkv.formats import SMALL_TABLE_BYTES, gather_rows

    tensors = make_checkpoint("7", n_layer=1, n_embd=64, head_size=32, vocab=4096, seed=3)
    write_safetensors(tensors, tmp_path / "m.st", dtype="fp16")
    table = read_checkpoint(tmp_path / "m.st").tensors["emb.weight"]
    assert table.nbytes <= SMALL_TABLE_BYTES

    def no_read(*args):
        raise AssertionError("a small table is read through its mapping")

    monkeypatch.setattr(os, "preadv", no_read, raising=False)
    ids = np.random.default_rng(1).integers(0, 4096, 40)
    assert gather_rows(table, ids).tobytes() == table[ids].tobytes()
    for wrong in ([4096], [-1]):
        with pytest.raises(IndexError):
            gather_rows(table, np.array(wrong))


@pytest.mark.skipif(not HAS_SMAPS, reason="needs Linux's smaps")
@pytest.mark.parametrize("fmt,dtype", [("pth", "bf16"), ("pth", "fp32"), ("st", "fp16")])
def test_quantising_at_load_leaves_none_of_the_file_resident(tmp_path, fmt, dtype):
    # An fp32 file quantised to Int8 at load kept every page it had read resident beside the
    # packed blocks: 943 MiB for the 0.1B shape, where Int8 needs 428.
    tensors = make_checkpoint("7", n_layer=2, n_embd=256, head_size=64, vocab=4096, seed=5)
    path = tmp_path / f"m.{fmt}"
    (write_pth(tensors, path, dtype=dtype) if fmt == "pth" else write_safetensors(tensors, path, dtype=dtype))
    model = load_model(path, device="cpu", max_batch=2, quant=99, quant_type="int8", quant_head=True)
    model.forward([1, 2, 3])
    # What may stay: the vectors and small matrices used in place, and the rows gathered.
    assert resident_bytes_of(path) < 0.1 * path.stat().st_size


# Loads a bf16 .pth on the CPU and prints what of LLVM stays resident, the logits of a
# prompt, and whether a kernel compiled afterwards (LLVM read back in) still works.
AFTER_LOAD = """
import json, sys
import numpy as np
from numba import njit
from ai00_like.rwkv import load_model
from memory_helpers import resident_bytes_of
from ai00_like.rwkv.batch import StepInput
model = load_model(sys.argv[1], device="cpu", max_batch=8, quant=1, quant_type="int8")
llvm = [resident_bytes_of("libllvmlite.so")]
logits, _ = model.forward([5, 17, 300, 42])
model.forward(list(range(1, 80)))  # a prefill chunk's kernels, loaded after the warm-up
model.step([StepInput(slot, [slot + 1]) for slot in range(8)])  # and a batch of 8's
llvm.append(resident_bytes_of("libllvmlite.so"))
new_kernel = njit(lambda a: (a * 2.0).sum())(np.arange(4.0))
print(json.dumps({"llvm": llvm, "logits": logits.tolist(), "new_kernel": float(new_kernel)}))
"""


@pytest.mark.skipif(skinny_matmul is None or not HAS_SMAPS, reason="needs numba and Linux's smaps")
def test_llvm_leaves_memory_once_the_kernels_are_loaded(tmp_path):
    # LLVM is needed to compile or load a kernel, not to run it: ~70 MiB, a fifth of an NF4
    # 0.1B model's peak. In a process of its own, whose pages no other test has touched.
    path = tmp_path / "m.pth"
    tensors = make_checkpoint("7", n_layer=2, n_embd=128, head_size=32, vocab=1000, seed=6)
    write_pth(tensors, path, "bf16")  # loaded with an Int8 layer: its batch kernel is one more
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(Path(__file__).resolve().parents[1] / "support"), os.environ.get("PYTHONPATH", "")]))
    done = subprocess.run([sys.executable, "-c", AFTER_LOAD, str(path)], capture_output=True, text=True, env=env,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    seen = __import__("json").loads(done.stdout.strip().splitlines()[-1])
    after_load, after_new_kernels = seen["llvm"]
    assert after_load < 4 * 2**20, f"{after_load / 2**20:.0f} MiB of libllvmlite resident after loading"
    assert after_new_kernels < 4 * 2**20, f"{after_new_kernels / 2**20:.0f} MiB after kernels loaded later"
    assert seen["new_kernel"] == 12.0  # LLVM still compiles once it is needed again
    want, _ = load_model(path, device="cpu", quant=1, quant_type="int8").forward([5, 17, 300, 42])
    np.testing.assert_allclose(seen["logits"], want, rtol=0, atol=1e-5 * float(np.std(want)))


@pytest.mark.skipif(not HAS_PAGEMAP, reason="needs Linux's pagemap")
@pytest.mark.parametrize("fmt,dtype", [("pth", "bf16"), ("st", "fp16")])
def test_a_state_slot_takes_memory_once_a_sequence_uses_it(tmp_path, fmt, dtype):
    # 16 slots of a 7B model's states are 0.5 GiB: a server sized for 16 users that serves
    # one holds one slot's states.
    path = tmp_path / f"m.{fmt}"
    tensors = make_checkpoint("7", n_layer=3, n_embd=256, head_size=64, vocab=1000, seed=8)
    (write_pth(tensors, path, dtype=dtype) if fmt == "pth" else write_safetensors(tensors, path, dtype=dtype))
    model = load_model(path, device="cpu", max_batch=16)
    wkv = model.pool.wkv  # [L, slots, H, N, N]: 64 KiB per layer and slot
    assert mapped_bytes(wkv) == 0
    model.step([StepInput(5, [1, 2, 3])])
    per_slot = wkv[:, 5].nbytes
    assert per_slot <= mapped_bytes(wkv) <= per_slot + 3 * 2 * 4096  # slot 5's, and the pages at its ends
    first = model.read_state(5).wkv.copy()
    model.step([StepInput(s, [1, 2, 3]) for s in (0, 15)])
    for slot in (0, 15):  # a batch of two sums in another order than one row alone: float32
        # rounding, about 1e-6 on values up to 0.4 (a CI run met 1.3e-6)
        np.testing.assert_allclose(model.read_state(slot).wkv, first, rtol=1e-4, atol=5e-6)


def test_slots_start_from_a_nonzero_initial_state(tmp_path):
    path = tmp_path / "m.pth"
    write_pth(make_checkpoint("7", n_layer=2, n_embd=128, head_size=32, vocab=1000, seed=9), path, "bf16")
    model = load_model(path, device="cpu")
    initial = model.forward([7, 8, 9])[1]
    pool = StatePool(model.info, 4, initial)
    for slot in range(4):
        assert all(np.array_equal(a, b) for a, b in zip(pool.read(slot).parts(), initial.parts()))
    assert all(not np.any(part) for part in StatePool(model.info, 4).read(3).parts()[:2])
