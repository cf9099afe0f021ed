"""The common rows in one compiled pass each: greedy, or Nucleus with a top_k of at most
`MAX_TOP_K`, with Ai00's penalties and nothing else (no mask, grammar, logit_bias or
logprobs). That is every request that sets only OpenAI's usual fields, and the rows the
serving loop samples at every step.

The numpy path (batch.py) makes about eight passes over each 65,536-wide row: copy less
the penalties, max, exp, sum, block maxima, threshold mask, flatnonzero. Here one pass
reads the row once, chunk by chunk, and while a chunk is in L1 it subtracts the
penalties (sparse: the few tokens that have one), updates the maxima of the 1,024
interleaved blocks that topk.py's threshold needs and sums the chunk's exponentials
against the chunk's max (an online softmax). Then only the blocks that can hold a top-k
token are read again. Rows run in parallel.

The cut and the draw are Ai00's, as in draw.py: sort by logit (ties by token id), keep
the first top_k while the mass before a token is at most top_p, raise the kept
probabilities to 1/temperature and draw with the request's uniform. Only the
normaliser's rounding differs from the numpy path (exp by a degree-5 polynomial,
relative error < 2e-7, anything below e^-87 taken as e^-87), so the two paths pick the
same token unless a cut falls within that of top_p.
"""

from __future__ import annotations

import math
import threading

import numpy as np

from ..rwkv.cpu.jit import LAUNCH, SKINNY_ROWS, compiler, in_passing_thread, release_compiler_pages

MAX_TOP_K = 512
BLOCKS = 1024  # the interleaved blocks of topk.py's threshold; also the chunk length
LANES = 16  # running maxima a chunk's max is taken through
# A block needs one token at least for the threshold to hold (the k-th largest block
# maximum is at most the k-th largest logit). Small vocabularies gain the most here: the
# numpy path's fixed cost (about 20 numpy calls a row) is most of their sampling time, the
# demo model's 4,096-wide greedy row 150-250 µs against the kernel's few.
MIN_VOCAB = BLOCKS
# A row whose threshold lets through more candidates than this (ties, flat logits) goes
# back to the numpy path, which has an exact fallback for it.
MAX_CANDIDATES = 4096

# What the kernel reports per row.
DONE, NUMPY = 0, 1


def fits(vocab: int) -> bool:
    """Whether rows of this width can take the compiled path (now: not while a background
    warm-up compiles the kernel)."""
    return _compiled is not None and _ready.is_set() and vocab >= MIN_VOCAB and vocab % BLOCKS == 0


_ready = threading.Event()  # cleared while warm_up(background=True) compiles the kernel
_ready.set()


def sample(rows, penalties, top_k, top_p, temperature, uniform):
    """The kernel over `rows` (1-D float32 arrays), each less its `penalties` (a pair of
    token ids, ascending, and their float32 penalties; or None): returns (tokens, status)
    per row."""
    if len(rows) == 1:
        return sample_one(rows[0], penalties[0], int(top_k[0]), float(top_p[0]), float(temperature[0]),
                          float(uniform[0]))
    kernel, set_threads, get_threads = _compiled
    args = _arguments(rows, penalties, top_k, top_p, temperature, uniform)
    threads = get_threads()
    with LAUNCH:
        # The cores go to numba when the step that made these rows did (ops.threads_for):
        # after a BLAS step, OpenBLAS's threads still spin, and a second numba thread only
        # fights them (measured: 1 row 10x slower on two threads than on one).
        set_threads(threads if 1 < len(rows) <= SKINNY_ROWS else 1)
        try:
            kernel(*args)
        finally:
            set_threads(threads)
    tokens, status = args[-2:]
    return tokens, status


def _arguments(rows, penalties, top_k, top_p, temperature, uniform) -> tuple:
    """The kernel's arguments, the last two (tokens, status) for it to fill."""
    given = [pair if pair is not None else _NONE for pair in penalties]
    pen_start = np.zeros(len(rows) + 1, dtype=np.int64)
    np.cumsum([ids.size for ids, _ in given], out=pen_start[1:])
    pen_ids = np.concatenate([ids for ids, _ in given])
    pen_values = np.concatenate([values for _, values in given])
    tokens = np.empty(len(rows), dtype=np.int64)
    status = np.empty(len(rows), dtype=np.int8)
    # One dtype per argument, whatever the caller's arrays hold (a temperature of 1 from
    # JSON is an int): each other combination would be compiled again, ~10 s.
    return (as_matrix(rows), pen_ids.astype(np.int64, copy=False), pen_values.astype(np.float32, copy=False),
            pen_start, np.asarray(top_k, dtype=np.int64), np.asarray(top_p, dtype=np.float64),
            np.asarray(temperature, dtype=np.float64), np.asarray(uniform, dtype=np.float64), tokens, status)


def sample_one(row, penalty, top_k: int, top_p: float, temperature: float, uniform: float):
    """One row (a lone stream's step): the serial row kernel itself. Launching the parallel
    kernel for one row sets numba's thread count twice and packs the batch's arrays, about
    ten times the few µs the row itself takes at a small vocabulary; a serial kernel needs
    neither the thread settings nor the launch lock. Returns (tokens, status) as `sample`."""
    ids, values = penalty if penalty is not None else _NONE
    row = np.ascontiguousarray(row, dtype=np.float32)
    if not row.flags.writeable:  # a read-only array is another type to numba: a compile mid-stream
        row = row.copy()
    token, status = _row_kernel(row, ids.astype(np.int64, copy=False), values.astype(np.float32, copy=False),
                                top_k, top_p, temperature, uniform)
    return (token,), (status,)


_NONE = (np.zeros(0, dtype=np.int64), np.zeros(0, dtype=np.float32))


def as_matrix(rows: list[np.ndarray]) -> np.ndarray:
    """`rows` as one writeable C-contiguous float32 [rows, vocab] array: a view when they
    are consecutive rows of one (as a model step's logits are), else a copy. (A list of
    arrays costs ~20 µs a row to hand to numba.)"""
    base = rows[0].base
    if (isinstance(base, np.ndarray) and base.ndim == 2 and base.dtype == np.float32 and base.flags.c_contiguous
            and base.flags.writeable and base.shape[1] == rows[0].shape[0]):
        start = _address(base)
        first, stride = (_address(rows[0]) - start) // base.strides[0], base.strides[0]
        if all(row.base is base and _address(row) == start + (first + n) * stride for n, row in enumerate(rows)):
            return base[first : first + len(rows)]
    return np.stack(rows).astype(np.float32, copy=False)


def _address(array: np.ndarray) -> int:
    return array.__array_interface__["data"][0]


def warm_up(background: bool = False, after=None) -> None:
    """Compile the kernel (or load it from numba's cache) now, not in the first request's
    step: in a passing thread, for the reason in_passing_thread gives. `background`: return
    at once; `fits` says no (rows take the numpy path) until a thread has called `after()`
    (waiting for the model's own warm-up, whose launches hold jit.LAUNCH while they compile)
    and compiled the kernel, without launching it (so without holding jit.LAUNCH)."""
    if _compiled is None or (background and not _ready.is_set()):
        return
    row = np.zeros(MIN_VOCAB, dtype=np.float32)
    one = np.ones(1)
    if not background:
        in_passing_thread(sample, [row, row], [None, None], np.full(2, 2), one.repeat(2), one.repeat(2),
                          one.repeat(2) * 0.5)
        sample_one(row, None, 2, 1.0, 1.0, 0.5)
        release_compiler_pages()  # what loading the kernel read back in
        return

    def compile_it():
        from numba import typeof

        try:
            if after is not None:
                after()
            args = _arguments([row], [None], np.full(1, 2), one, one, one * 0.5)
            _compiled[0].compile(tuple(typeof(a) for a in args))
            ids, values = _NONE
            _row_kernel.compile(tuple(typeof(a) for a in (row, ids, values, 2, 1.0, 1.0, 0.5)))  # a lone row's
            release_compiler_pages()
        finally:
            _ready.set()

    _ready.clear()
    threading.Thread(target=compile_it, name="ai00-like-sampler-kernel", daemon=True).start()


def compiling() -> bool:
    """Whether a background warm-up is compiling the kernel now."""
    return not _ready.is_set()


# Module-level kernels, compiled below where numba is: numba's on-disk cache keys a kernel
# on its closure's pickled contents, which for a compiled function differ in every
# process, so a kernel nested in a builder was compiled anew at every start.
prange = range


def sample_rows(logits, pen_ids, pen_values, pen_start, top_k, top_p, temperature, uniform, tokens, status):  # pragma: no cover
    """Row r of `logits` (float32 [rows, vocab]) for request r, less its
    penalties: pen_values at pen_ids, both [pen_start[r]:pen_start[r + 1]]. top_k[r]
    == 1 means greedy. `status[r]` says whether the numpy path must redo row r (a NaN
    or an inf, or too many candidates)."""
    for r in prange(len(logits)):
        i = np.int64(r)
        at, end = pen_start[i], pen_start[i + 1]
        tokens[i], status[i] = sample_row(logits[i], pen_ids[at:end], pen_values[at:end], top_k[i], top_p[i],
                                          temperature[i], uniform[i])


def sample_row(raw, pen_ids, pen_values, k, top_p, temperature, uniform):  # pragma: no cover - compiled by numba
    """One row's (token, status)."""
    vocab, greedy = raw.shape[0], k == 1
    block_max = np.full(BLOCKS, -np.inf, dtype=np.float32)
    block_arg = np.zeros(BLOCKS, dtype=np.int64)  # where each block's max first occurs
    top, total, poison = first_pass(raw, pen_ids, pen_values, greedy, block_max, block_arg)
    best = block_max.max()
    if poison != 0.0 or best == -np.inf:
        return 0, NUMPY
    if greedy:
        return first_best(block_max, block_arg, best, vocab), DONE
    # topk.py's threshold: the k-th largest block maximum is at most the k-th
    # largest logit, and only blocks whose maximum reaches it hold candidates.
    threshold = np.partition(block_max, BLOCKS - k)[BLOCKS - k]
    ids = np.empty(MAX_CANDIDATES + pen_ids.size, dtype=np.int64)
    found = gather(raw, block_max, threshold, ids)
    if found < 0:
        return 0, NUMPY
    values = np.empty(found + pen_ids.size, dtype=np.float32)
    count = penalise(raw, pen_ids, pen_values, threshold, ids, values, found)
    if count == 0:  # (a rounding apart from the first pass)
        return 0, NUMPY
    log_norm = top + math.log(total)
    return cut_and_draw(ids[:count], values[:count], k, log_norm, top_p, temperature, uniform), DONE


def first_pass(raw, pen_ids, pen_values, greedy, block_max, block_arg):  # pragma: no cover - compiled by numba
    """The one read of the whole row: fills `block_max`/`block_arg` and returns (top, total,
    poison), the row's max, the sum of exp(logit - top) (not for greedy rows) and a NaN
    once a NaN or ±inf has gone by."""
    chunk = np.empty(BLOCKS, dtype=np.float32)  # the row less its penalties, a chunk at a time
    lanes = np.empty(LANES, dtype=np.float32)
    # exp(x) = 2^n · 2^f: the polynomial for 2^f goes to `fraction`, 2^n is built in
    # `exponent`'s bits (read back through `power`), so every loop vectorises.
    fraction = np.empty(BLOCKS, dtype=np.float32)
    exponent = np.empty(BLOCKS, dtype=np.int32)
    power = exponent.view(np.float32)
    top, total = -np.inf, 0.0
    poison = np.float32(0.0)
    next_pen = 0
    for base in range(0, raw.shape[0], BLOCKS):
        for j in range(BLOCKS):
            chunk[j] = raw[base + j]
        while next_pen < pen_ids.size and pen_ids[next_pen] < base + BLOCKS:
            chunk[pen_ids[next_pen] - base] -= pen_values[next_pen]
            next_pen += 1
        for j in range(BLOCKS):
            v = chunk[j]
            if v > block_max[j]:
                block_max[j] = v
                block_arg[j] = base + j
            poison += v * np.float32(0.0)
        if greedy:
            continue
        chunk_top = chunk_max(chunk, lanes)
        chunk_sum = exp_sum(chunk, chunk_top, fraction, exponent, power)
        if chunk_top > top:
            total = total * math.exp(top - chunk_top) + chunk_sum
            top = chunk_top
        elif chunk_top > -np.inf:
            total += chunk_sum * math.exp(chunk_top - top)
    return top, total, poison


def chunk_max(chunk, lanes):  # pragma: no cover - compiled by numba
    """The chunk's max through LANES running maxima: a plain running max does not vectorise."""
    lanes[:] = -np.inf
    for i in range(0, BLOCKS, LANES):
        for l in range(LANES):
            lanes[l] = max(lanes[l], chunk[i + l])
    return lanes.max()


def exp_sum(chunk, chunk_top, fraction, exponent, power):  # pragma: no cover - compiled by numba
    """The sum of exp(v - chunk_top) over the chunk, by the degree-5 polynomial."""
    for j in range(BLOCKS):
        t = max(chunk[j] - chunk_top, np.float32(-87.0)) * np.float32(1.442695)
        n = np.floor(t)
        f = t - n
        p = np.float32(1.8775767e-3)
        p = p * f + np.float32(8.9893397e-3)
        p = p * f + np.float32(5.5826318e-2)
        p = p * f + np.float32(2.4015361e-1)
        p = p * f + np.float32(6.9315308e-1)
        fraction[j] = p * f + np.float32(9.9999994e-1)
        exponent[j] = (np.int32(n) + 127) << 23
    chunk_sum = np.float32(0.0)
    for j in range(BLOCKS):
        chunk_sum += fraction[j] * power[j]
    return chunk_sum


def first_best(block_max, block_arg, best, vocab):  # pragma: no cover - compiled by numba
    """The first token with the highest logit (greedy)."""
    first = vocab
    for b in range(BLOCKS):
        if block_max[b] == best:
            first = min(first, block_arg[b])
    return first


def gather(raw, block_max, threshold, ids):  # pragma: no cover - compiled by numba
    """Into ids[:n], ascending, the tokens whose raw logit reaches `threshold`; returns n, or
    -1 when there are more than MAX_CANDIDATES."""
    count = 0
    for b in range(BLOCKS):
        if block_max[b] >= threshold:
            for j in range(b, raw.shape[0], BLOCKS):
                if raw[j] >= threshold:
                    if count == MAX_CANDIDATES:
                        return -1
                    ids[count] = j
                    count += 1
    ids[:count] = np.sort(ids[:count])
    return count


def penalise(raw, pen_ids, pen_values, threshold, ids, values, found):  # pragma: no cover - compiled by numba
    """The `found` candidates were chosen by their logits before the penalties: sets their
    `values` less the penalties, and appends those a negative penalty lifts over the
    threshold (candidates that fall below it stay: the cut takes the best k of them
    anyway). Returns how many there are now."""
    for i in range(found):
        values[i] = raw[ids[i]]
    count, i = found, 0
    for q in range(pen_ids.size):
        token = pen_ids[q]
        while i < found and ids[i] < token:
            i += 1
        if i < found and ids[i] == token:
            values[i] = raw[token] - pen_values[q]
        elif raw[token] - pen_values[q] >= threshold:
            ids[count] = token
            values[count] = raw[token] - pen_values[q]
            count += 1
    return count


def cut_and_draw(ids, values, k, log_norm, top_p, temperature, uniform):  # pragma: no cover - compiled by numba
    """Ai00's cut and draw over the candidates (`values` their logits, log_norm the log of
    the row's softmax normaliser)."""
    by_id = np.argsort(ids, kind="mergesort")  # ascending ids, then a stable sort by logit
    ids = ids[by_id]
    values = values[by_id]
    order = np.argsort(-values, kind="mergesort")
    best_logit = values[order[0]]
    cumulative = np.empty(min(k, ids.size), dtype=np.float64)
    mass_before, kept = 0.0, 0
    for i in range(min(k, ids.size)):
        v = values[order[i]]
        p = math.exp(v - log_norm)
        if mass_before > top_p or p <= 0.0:
            break
        weight = math.exp((v - best_logit) / temperature)
        cumulative[kept] = weight + (cumulative[kept - 1] if kept else 0.0)
        mass_before += p
        kept += 1
    target = uniform * cumulative[kept - 1]
    picked = 0
    while picked < kept - 1 and cumulative[picked] <= target:
        picked += 1
    return ids[order[picked]]


_tools = compiler()
if _tools is not None:
    from numba import get_num_threads, set_num_threads

    njit, prange = _tools
    # Inlined into sample_row (numba's IR inlining), as the one function they were.
    inline = njit(parallel=False, inline="always")
    first_pass, chunk_max, exp_sum = inline(first_pass), inline(chunk_max), inline(exp_sum)
    first_best, gather, penalise, cut_and_draw = inline(first_best), inline(gather), inline(penalise), inline(cut_and_draw)
    sample_row = njit(parallel=False)(sample_row)
    _compiled = njit(sample_rows), set_num_threads, get_num_threads
    _row_kernel = sample_row
else:
    _compiled = _row_kernel = None
