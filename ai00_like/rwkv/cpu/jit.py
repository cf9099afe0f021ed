"""What the compiled kernels (skinny.py, wkv_numba.py, the sampler's fused.py) share:
numba, if it is there, the lock around launches, the passing thread for warm-ups, and
the release of LLVM's pages after them.

numba is optional: without it, or with AI00_LIKE_NO_NUMBA=1, `compiler()` is None and the
kernels' callers use numpy and BLAS.
"""

from __future__ import annotations

import ctypes
import functools
import hashlib
import mmap
import os
import platform
import sys
import threading
from pathlib import Path

_ARCH_PRCTL, _ARCH_REQ_XCOMP_PERM, _XFEATURE_XTILEDATA = 158, 0x1023, 18  # Linux's x86-64 numbers

# Reassociation lets LLVM vectorise sums; no-NaN/no-Inf flags are left off so a NaN or Inf
# in the weights or activations propagates as it would through BLAS.
FASTMATH = {"reassoc", "contract", "arcp", "nsz"}

# The most rows of x a decoding step multiplies in the compiled kernels (skinny.py and the
# packed forms'); a prefill chunk's products go to BLAS. Here, beside the other settings
# compiled code shares, because the sampler's kernel picks its threads by it too and must
# not import the engine's kernels for it.
SKINNY_ROWS = 64

# numba's fallback threading layer (workqueue, where neither OpenMP nor TBB is installed)
# aborts the process when two threads launch parallel kernels at once: two models served
# side by side take turns instead.
LAUNCH = threading.Lock()


_mode = threading.local()  # .numpy_only: this thread's steps keep to numpy and BLAS for now


def kernels_on() -> bool:
    """Whether this thread may run the compiled kernels now: numba is there (the callers
    check their kernel is not None) and the thread is not in `numpy_only` (a model serving
    while its kernels compile in the background)."""
    return not getattr(_mode, "numpy_only", False)


class numpy_only:
    """`with numpy_only(on):` this thread's calls take the numpy path where `on` (every
    caller that picks compiled or numpy asks `kernels_on()`); the mode before, after."""

    def __init__(self, on: bool = True):
        self.on = on

    def __enter__(self):
        self.before = getattr(_mode, "numpy_only", False)
        _mode.numpy_only = self.on or self.before
        return self

    def __exit__(self, *exc):
        _mode.numpy_only = self.before


class compiling_ahead:
    """`with compiling_ahead():` this thread's `launch`es compile their kernel for the call's
    types before taking LAUNCH: a background warm-up, whose compiles take seconds to a
    minute cold, so that a model served beside it does not wait for them at the lock."""

    def __enter__(self):
        _mode.compile_ahead = True
        return self

    def __exit__(self, *exc):
        _mode.compile_ahead = False


def launch(kernel, *args):
    """kernel(*args) under LAUNCH (numba's dispatcher compiles on a call's first types)."""
    if getattr(_mode, "compile_ahead", False):
        kernel.compile(tuple(kernel.typeof_pyval(a) for a in args))
    with LAUNCH:
        return kernel(*args)


def read_only(array):
    """A read-only view of `array` (no copy). numba compiles a kernel once per argument type,
    and a writable and a read-only array (a matrix converted at load, one mapped from its
    file) are two types: handing the kernels weights only this way compiles each once."""
    view = array.view()
    view.flags.writeable = False
    return view


@functools.cache
def compiler():
    """`numba.njit` with our options and `numba.prange`, or None."""
    if os.environ.get("AI00_LIKE_NO_NUMBA"):
        return None
    try:
        from numba import get_num_threads, njit, prange
    except ImportError:
        return None
    _prefer_full_width_vectors()
    _cache_by_source()
    # numba starts its threading layer when it compiles a parallel kernel, but a kernel read
    # from its cache can reach the parallel loops it inlines (fused7_layer's `layer` does)
    # before anything started it: they then call through the layer's unset function pointers,
    # a segfault at address 0 (seen at the warm-up of an Int8 model with every kernel cached).
    # Asking for the thread count starts it.
    get_num_threads()
    return functools.partial(njit, parallel=True, fastmath=FASTMATH, cache=True, nogil=True), prange


def warmed_marker(kind: str) -> Path | None:
    """A file in the kernel cache's folder that says a warm-up of `kind` (a model's version
    and precision) has filled the cache; None without numba or a folder of our own."""
    if compiler() is None:
        return None
    from numba.core import config

    return Path(config.CACHE_DIR) / f"warmed-{kind}" if config.CACHE_DIR else None


@functools.cache
def tiles_permitted() -> bool:
    """Whether Linux lets this process use AMX's tile registers (asked once, with
    arch_prctl). It grants them to the whole process on request, and a tile instruction
    run without leave kills it (SIGILL): amx.py uses the tiles only with leave, and the
    kernel cache is named by the answer, so that a kernel compiled with tile instructions
    is never loaded by a process refused them on the same CPU."""
    if platform.system() != "Linux" or platform.machine() != "x86_64":
        return False
    libc = ctypes.CDLL(None, use_errno=True)
    return libc.syscall(_ARCH_PRCTL, _ARCH_REQ_XCOMP_PERM, _XFEATURE_XTILEDATA) == 0


def _cache_by_source() -> None:
    """Keep numba's on-disk cache in a folder named by a digest of every kernel source.

    numba checks a cached kernel against its own file only, while our kernels inline code
    from the others (vector_dots' intrinsics in skinny's block, int8's row widening in
    batched's kernel): after an update that changed only those, every start loaded the old
    compiled kernels. The digest takes in whether the process may use AMX's tiles
    (tiles_permitted). The folder is under NUMBA_CACHE_DIR where that is set (the launcher's
    .cache/numba), else under __pycache__/kernels beside this file. (Where neither can be
    written numba falls back to its per-user folder, checked against the kernel's file only.)
    """
    from numba.core import config

    here = Path(__file__).resolve().parent
    digest = hashlib.sha256()
    for path in sorted([*here.glob("*.py"), here.parent / "norms.py", here.parents[1] / "sampler" / "fused.py"]):
        digest.update(path.name.encode() + b"\0" + path.read_bytes())
    digest.update(b"tiles" if tiles_permitted() else b"")
    base = Path(config.CACHE_DIR) if config.CACHE_DIR else here / "__pycache__" / "kernels"
    config.CACHE_DIR = str(base / digest.hexdigest()[:16])


def _prefer_full_width_vectors() -> None:
    """Let LLVM vectorise with 512-bit registers where the CPU has AVX-512.

    For CPUs with AVX-512, LLVM prefers 256-bit vectors by default, because the first of them
    lowered their clock under 512-bit code. Our kernels are multiply-adds on data in cache,
    where twice the lanes is worth more: the batch-16 products of 16-bit weights ran 15–25%
    faster on one core (bench/engine.py). Set before numba compiles anything (its code
    generator reads it once); AI00_LIKE_VECTOR_BITS=256, or NUMBA_CPU_NAME/NUMBA_CPU_FEATURES
    set by hand, keep LLVM's choice.
    """
    from llvmlite import binding
    from numba.core import config

    if os.environ.get("AI00_LIKE_VECTOR_BITS", "512") != "512" or config.CPU_NAME or config.CPU_FEATURES:
        return
    features = binding.get_host_cpu_features()
    if features.get("avx512f"):
        config.CPU_NAME = binding.get_host_cpu_name()
        config.CPU_FEATURES = features.flatten() + ",-prefer-256-bit"


def in_passing_thread(fn, *args):
    """fn(*args) in a thread that ends with it; its exception, if any, raised here.

    OpenMP (numba's threading layer) keeps a team of worker threads for every thread that
    has launched a parallel kernel, for as long as that thread lives, and once there are
    more workers than cores it stops letting them spin between kernels: a server whose
    loading thread had warmed the kernels up decoded 12% slower in its stepping thread
    (measured at batch 16: 168 sleeps and wake-ups per step). A passing thread's team ends
    with it, leaving the thread that steps the model the only one.
    """
    failure: list[BaseException] = []

    def run():
        try:
            fn(*args)
        except BaseException as exc:  # noqa: BLE001 — re-raised in the caller's thread
            failure.append(exc)

    thread = threading.Thread(target=run, name="ai00-like-warm-up")
    thread.start()
    thread.join()
    if failure:
        raise failure[0]


LLVM_LIBRARY = "libllvmlite.so"


def release_compiler_pages() -> int:
    """Unmap LLVM's code and read-only data from this process once the kernels are loaded;
    the bytes it had resident.

    numba needs LLVM (libllvmlite, about 70 MiB) to compile a kernel or to load one from
    its cache, not to run it. After a model's warm-up its pages only take memory: a
    fifth of an NF4 0.1B model's peak. Only pages the process never wrote are dropped
    (read-only mappings with no private copies), so nothing is lost: the file stays in the
    page cache, and a kernel compiled later reads back in what it needs. Linux only.
    """
    if not sys.platform.startswith("linux") or not hasattr(mmap, "MADV_DONTNEED"):
        return 0
    madvise = ctypes.CDLL(None, use_errno=True).madvise
    madvise.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int)
    released = 0
    for start, end, resident in _unwritten_mappings_of(LLVM_LIBRARY):
        if madvise(start, end - start, mmap.MADV_DONTNEED) == 0:
            released += resident
    return released


def _unwritten_mappings_of(library: str) -> list[tuple[int, int, int]]:
    """(start, end, resident bytes) of the read-only mappings of `library` (a file name) that
    hold no privately written pages, from /proc/self/smaps."""
    found, current = [], None
    try:
        with open("/proc/self/smaps") as smaps:
            for line in smaps:
                fields = line.split()
                if "-" in fields[0] and not fields[0].endswith(":"):  # a mapping's first line
                    path = fields[5] if len(fields) > 5 else ""
                    readonly = "w" not in fields[1]
                    first, last = (int(a, 16) for a in fields[0].split("-"))
                    current = [first, last, 0] if readonly and os.path.basename(path) == library else None
                elif current is not None and fields[0] == "Rss:":
                    current[2] = int(fields[1]) * 1024
                elif current is not None and fields[0] == "Anonymous:":
                    if int(fields[1]) == 0:
                        found.append(tuple(current))
                    current = None
    except OSError:
        return []
    return found
