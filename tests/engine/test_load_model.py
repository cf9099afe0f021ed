"""load_model: the library entry point, from real files."""

from __future__ import annotations

import numpy as np
import pytest

from ai00_like.rwkv import load_model
from ai00_like.rwkv.cpu.model import CpuModel
from ai00_like.rwkv.formats.pth import write_pth
from ai00_like.rwkv.formats.safetensors import write_safetensors
from ai00_like.rwkv.loader import read_checkpoint
from ai00_like.rwkv.model import Model
from ai00_like.rwkv.synthetic import make_checkpoint

from memory_helpers import mapped_bytes


@pytest.mark.parametrize("fmt,dtype", [("pth", "bf16"), ("st", "fp16"), ("st", "fp32")])
def test_any_storage_gives_the_model_of_its_widened_weights(tmp_path, fmt, dtype):
    tensors = make_checkpoint("7", n_layer=3, n_embd=64, head_size=32, vocab=300, seed=2)
    path = tmp_path / f"m.{fmt}"
    (write_pth(tensors, path, dtype=dtype) if fmt == "pth" else write_safetensors(tensors, path, dtype=dtype))
    calls = []
    model = load_model(path, progress=lambda done, total: calls.append((done, total)))
    assert isinstance(model, Model)
    eager = read_checkpoint(path)  # every tensor widened to float32 up front
    reference = CpuModel({k: np.array(v, dtype=np.float32) for k, v in eager.tensors.items()}, eager.info)
    tokens = [5, 17, 250, 3, 99]
    ours, theirs = model.forward(tokens)[0], reference.forward(tokens)[0]
    # The same weights, summed in another order: 16-bit products widen as they read.
    assert np.abs(ours - theirs).max() < 1e-5 * theirs.std()
    assert calls[-1] == (4, 4) and [d for d, _ in calls] == sorted(d for d, _ in calls)
    # "auto": the file's own precision, the projections and head kept in it.
    assert model.precision == dtype
    kept = model.blocks[1].time_mix.W["key"]
    assert kept.itemsize == (4 if dtype == "fp32" else 2) and model.head.itemsize == kept.itemsize


@pytest.mark.skipif(not __import__("os").path.exists("/proc/self/pagemap"), reason="needs Linux's pagemap")
@pytest.mark.parametrize("fmt,dtype", [("pth", "fp32"), ("st", "fp16")])
def test_a_prompt_does_not_leave_the_embedding_resident(tmp_path, fmt, dtype):
    # A 64k × 64 embedding (16 MB in fp32): each of a prompt's rows would otherwise map at
    # least a page of its neighbours, or a whole 2 MB folio of the page cache.
    tensors = make_checkpoint("7", n_layer=1, n_embd=64, head_size=32, vocab=65536, seed=3)
    path = tmp_path / f"m.{fmt}"
    (write_pth(tensors, path, dtype=dtype) if fmt == "pth" else write_safetensors(tensors, path, dtype=dtype))
    model = load_model(path, device="cpu", max_batch=2)
    prompt = np.random.default_rng(0).integers(0, 65536, 300).tolist()
    logits, _ = model.forward(prompt)
    assert mapped_bytes(model.emb) <= 64 * 4096  # a few pages at most, not 300 rows' worth
    expected = CpuModel(make_checkpoint("7", n_layer=1, n_embd=64, head_size=32, vocab=65536, seed=3),
                        model.info).forward(prompt)[0]
    np.testing.assert_allclose(logits, expected, rtol=0, atol=2e-2 if dtype == "fp16" else 1e-5)


THREADS_AFTER_LOADING_IN_A_LIVING_THREAD = """
import os, sys, threading, time
from ai00_like.rwkv import load_model
threads = lambda: len(os.listdir("/proc/self/task"))
load_model(sys.argv[1], device="cpu", max_batch=2).step([(0, [1]), (1, [2])])  # this thread's workers
before = threads()
loaded, release = threading.Event(), threading.Event()
def load_and_stay():
    load_model(sys.argv[1], device="cpu", max_batch=2)
    loaded.set()
    release.wait()
loader = threading.Thread(target=load_and_stay)
loader.start()
assert loaded.wait(120)
deadline = time.monotonic() + 10  # a finished thread's workers leave a moment after it
while threads() - 1 != before and time.monotonic() < deadline:
    time.sleep(0.05)
print(before, threads() - 1)  # not counting the loader itself
release.set()
"""


@pytest.mark.skipif(not __import__("os").path.exists("/proc/self/task"), reason="counts Linux's threads")
def test_a_model_loaded_in_a_living_thread_leaves_no_kernel_workers_behind(tmp_path):
    # OpenMP keeps worker threads for every thread that launched a parallel kernel while it
    # lives; a second team beside the stepping thread's made decoding 12% slower. Counted in
    # a process of its own, where no other test's threads come and go.
    import subprocess
    import sys

    path = tmp_path / "m.st"
    write_safetensors(make_checkpoint("7", n_layer=1, n_embd=64, head_size=32, vocab=300, seed=4), path)
    out = subprocess.run([sys.executable, "-c", THREADS_AFTER_LOADING_IN_A_LIVING_THREAD, str(path)],
                         capture_output=True, text=True, timeout=300, check=False)
    assert out.returncode == 0, out.stderr
    before, during = map(int, out.stdout.split())
    # No new workers; fewer is no fault (a busy machine's idle workers may have left meanwhile).
    assert during <= before


def test_free_memory_is_the_smaller_of_the_machine_and_the_containers(tmp_path):
    from ai00_like.rwkv.memory import available_bytes

    (tmp_path / "proc").mkdir()
    (tmp_path / "proc/meminfo").write_text("MemTotal: 8000000 kB\nMemAvailable:    4000000 kB\n")
    assert available_bytes(tmp_path) == 4000000 * 1024
    v2 = tmp_path / "sys/fs/cgroup"
    v2.mkdir(parents=True)
    (v2 / "memory.max").write_text("max\n")  # no limit
    (v2 / "memory.current").write_text("1000\n")
    assert available_bytes(tmp_path) == 4000000 * 1024
    (v2 / "memory.max").write_text(f"{2 * 2**30}\n")  # a container of 2 GiB, 1 GiB used
    (v2 / "memory.current").write_text(f"{2**30}\n")
    assert available_bytes(tmp_path) == 2**30
    (v2 / "memory.max").unlink()
    v1 = v2 / "memory"
    v1.mkdir()
    (v1 / "memory.limit_in_bytes").write_text("9223372036854771712\n")  # v1's "no limit"
    (v1 / "memory.usage_in_bytes").write_text("5\n")
    assert available_bytes(tmp_path) == 4000000 * 1024
    (v1 / "memory.limit_in_bytes").write_text(f"{3 * 2**30}\n")
    assert available_bytes(tmp_path) == 3 * 2**30 - 5
    assert available_bytes(tmp_path / "nothing") is None
