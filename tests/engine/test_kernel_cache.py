"""A second start compiles nothing: every numba kernel the CPU backend and the sampler run
comes from numba's on-disk cache once a first process has compiled it.

A kernel that misses the cache is compiled again at every start: seconds of the server's
start-up, and LLVM's working memory kept in the process (40 MiB on the 0.1B shape). Kernels
nested in a builder function used to miss it every time, since numba keys its cache on
the pickled contents of the kernel's closure, and a compiled function pickles differently
in every process.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from ai00_like.rwkv.cpu.skinny import skinny_matmul
from ai00_like.rwkv.formats.pth import write_pth
from ai00_like.rwkv.synthetic import make_checkpoint

pytestmark = pytest.mark.skipif(skinny_matmul is None, reason="the compiled kernels need numba")

# Loads a bf16 .pth as released at its own precision, with Int8 and with NF4 layers (and an
# Int8 head), runs a prompt, batch 1, 3 and 6 steps on each (6 rows: batched.py's kernel),
# and the fused sampler; then prints each compiled kernel's cache misses.
RUN = """
import json, sys
import numpy as np
from numba.core.dispatcher import Dispatcher
from ai00_like.rwkv import load_model
from ai00_like.rwkv.batch import StepInput
from ai00_like.sampler import fused

for options in (dict(precision="auto"), dict(quant=99, quant_type="int8", quant_head=True),
                dict(quant=99, quant_type="nf4")):
    model = load_model(sys.argv[1], max_batch=6, **options)
    model.forward([5, 17, 300, 42] * 20)
    for rows in (1, 3, 6):
        logits = model.step([StepInput(slot, [slot + 1]) for slot in range(rows)])
fused.warm_up()
fused.sample([np.zeros(fused.MIN_VOCAB, dtype=np.float32)] * 3, [None] * 3, np.full(3, 2), *(np.ones(3) * 0.5,) * 3)
misses = {f"{name}.{attr}": sum(obj.stats.cache_misses.values())
          for name, module in list(sys.modules.items()) if name.startswith("ai00_like")
          for attr, obj in vars(module).items() if isinstance(obj, Dispatcher)}
print(json.dumps(misses))
"""


def _kernel_misses(model_path) -> dict[str, int]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("NUMBA_DEBUG")}
    done = subprocess.run([sys.executable, "-c", RUN, str(model_path)], capture_output=True, text=True, env=env,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_a_second_process_loads_every_kernel_from_the_cache(tmp_path):
    path = tmp_path / "model.pth"
    write_pth(make_checkpoint("7", n_layer=2, n_embd=128, head_size=32, vocab=8192, seed=3), path, "bf16")
    first = _kernel_misses(path)  # compiles whatever the cache does not hold yet
    assert "ai00_like.rwkv.cpu.skinny.skinny_kernel" in first, f"no kernels found: {first}"
    second = _kernel_misses(path)
    assert {name: n for name, n in second.items() if n} == {}


# A kernel of skinny.py (widen_all) whose widening is intrinsics.py's code, compiled into it.
WIDEN = """
import json
import numpy as np
import ai00_like
from ai00_like.rwkv.cpu import skinny
skinny.widen_rows(np.ones((4, 32), dtype=np.float16), np.empty((4, 32), dtype=np.float32))
print(json.dumps([ai00_like.__file__, sum(skinny.widen_all.stats.cache_misses.values()),
                  sum(skinny.widen_all.stats.cache_hits.values())]))
"""


def test_a_change_to_a_module_a_kernel_inlines_compiles_it_again(tmp_path):
    """numba checks a cached kernel against its own file only; an update in place that
    changed only the code it inlines (here intrinsics.py) must not load the old kernel."""
    import shutil
    from pathlib import Path

    import ai00_like

    package = Path(ai00_like.__file__).parent
    shutil.copytree(package, tmp_path / "ai00_like", ignore=shutil.ignore_patterns("__pycache__"))
    env = {k: v for k, v in os.environ.items() if not k.startswith("NUMBA_")}
    env["PYTHONPATH"] = str(tmp_path)

    def run() -> tuple[int, int]:
        done = subprocess.run([sys.executable, "-c", WIDEN], capture_output=True, text=True, env=env, timeout=300,
                              cwd=tmp_path)
        assert done.returncode == 0, done.stderr[-3000:]
        where, misses, hits = json.loads(done.stdout.strip().splitlines()[-1])
        assert Path(where).parent == tmp_path / "ai00_like"  # the copy, not the checkout
        return misses, hits

    assert run() == (1, 0)  # compiled
    assert run() == (0, 1)  # from the cache
    intrinsics = tmp_path / "ai00_like" / "rwkv" / "cpu" / "intrinsics.py"
    intrinsics.write_text(intrinsics.read_text() + "\n# a changed line\n")
    assert run() == (1, 0)  # compiled again
    assert run() == (0, 1)


STARTED = """
from numba.np.ufunc import parallel
from ai00_like.rwkv.cpu import jit
before = parallel._is_initialized
jit.compiler()
print(before, parallel._is_initialized)
"""


def test_the_threading_layer_starts_before_any_kernel_runs():
    """A kernel read from numba's cache can reach parallel loops (fused7_layer's `layer`
    inlines them) before numba has started its threading layer; they then call through its
    unset pointers and the process dies at address 0. That was seen at the warm-up of an Int8
    model whose every kernel was cached; the order that leads there depends on the cache's
    history, so this checks the remedy: setting up the compiler starts the layer."""
    done = subprocess.run([sys.executable, "-c", STARTED], capture_output=True, text=True, timeout=300,
                          env={**os.environ, "AI00_LIKE_NO_NUMBA": ""})
    assert done.returncode == 0, done.stderr[-2000:]
    assert done.stdout.split() == ["False", "True"]
