"""The numpy (CPU) RWKV model: v4, v5.0/5.1/5.2, v6 and v7, fp32 compute.

`step` runs several slots in one forward (prefill chunks and decode tokens mixed);
`forward` is the plain single-sequence API of the reference package.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Mapping, MutableMapping, Sequence

import numpy as np

from ..batch import BatchPlan, StepInput, StepLayout
from ..info import ModelInfo
from ..norms import layer_norm
from ..state import State, StatePool
from ..weights import as_float32, embedding_rows, file_precision, stored
from . import rounded_bf16
from .arena import Arena
from .blocks import Block, Context
from .forms import PANEL_KINDS, keep_in_panels
from .panel_bf16 import in_panels as bf16_in_panels
from .panel_bf16 import PanelBf16, keeps_bf16_panels
from .fused7 import DecodeLayers
from .jit import compiling_ahead, in_passing_thread, kernels_on, numpy_only, release_compiler_pages, warmed_marker
from .ops import COMPILED_ROWS, SKINNY_ROWS, kernel_set, keeps_16bit, kernel_form, linear, pinned_blas_note, threads_for
from .rounded_bf16 import RoundedBf16
from .setup import prepare
from .skinny import skinny_matmul

HEAD_BLOCK = 2048  # rows of the head per product when decoding a batch
log = logging.getLogger(__name__)


class CpuModel:
    device = "cpu"

    def __init__(self, tensors: MutableMapping[str, np.ndarray], info: ModelInfo, max_batch: int = 1,
                 initial_state: State | None = None, progress: Callable[[int, int], None] | None = None,
                 precision: str = "auto", source: str = "the model", warm_up: str = "now", exact: bool = True):
        """`tensors` in the official layout. The projections and the head are kept in
        `precision` ("auto": as the file stores them, used in place; fp32, fp16 or bf16:
        converted here, layer by layer), everything else as fp32; the products widen 16-bit
        weights as they read them (ops.linear). `progress(done, total)` is called as the
        layers are prepared. `warm_up`: "now" compiles the kernels (or loads them from numba's
        cache) before returning; "background" returns at once and steps on numpy and BLAS
        until a background thread has compiled them (`kernels_ready`), dense weights only
        (the packed forms have no numpy product: they warm up now). Not `exact`, Int8 and
        16-bit products round the activations where the CPU has AVX-512 VNNI or BF16 (vnni.py,
        rounded_bf16.py; fp16 weights to bf16 too), NF4 ones widen to bf16 on AMX's tiles
        (rounded_nf4.py). With AVX-512, Int8 and NF4 matrices become panels in `tensors`
        (forms.Panelled), bf16 ones once built if the model is wide or rounds (panel_bf16.py)."""
        prepare()
        self.info = info
        self.precision = precision = kept_precision(tensors, precision)
        # fp32 matrices go to BLAS as they are; 16-bit and packed ones would need widening.
        self.compiled_rows = SKINNY_ROWS if precision == "fp32" and not _packed(tensors) else COMPILED_ROWS
        self.tensors = tensors  # as loaded (LoRAs merged), for saving; the layers below share them
        # Int8 and NF4 matrices in panels (panels.py), in place: held once.
        self.rounds_activations = keep_in_panels(tensors, exact)
        vec = lambda name: as_float32(tensors[name]).reshape(-1)
        # ln0 is applied to the gathered rows each step rather than folded into a copy of
        # the embedding: the (possibly memory-mapped) embedding is never duplicated.
        self.emb = tensors["emb.weight"]
        self.ln0 = (vec("blocks.0.ln0.weight"), vec("blocks.0.ln0.bias"))
        # The matrices streamed every token go to huge pages where the system has them; a
        # wide model's bf16 ones go in panels instead (panel_bf16.py), numpy's huge pages.
        matrices, bf16_panels = _matrix_forms(precision, info.n_embd, exact)
        arena = None if bf16_panels else Arena.for_tensors(tensors, matrices)
        self.blocks = []
        for i in range(info.n_layer):
            self.blocks.append(Block(tensors, info, i, matrices, arena))
            if progress:
                progress(i + 1, info.n_layer + 1)
        self.ln_out = (vec("ln_out.weight"), vec("ln_out.bias"))
        self.head = kernel_form(stored(tensors["head.weight"], matrices, "head.weight", source, arena))
        if bf16_panels:
            self.head = _bf16_in_panels(self.blocks, self.head, bf16_panels)
            self.rounds_activations |= bf16_panels is RoundedBf16
        if _projections_all(self.blocks, PANEL_KINDS):
            self.compiled_rows = 1 << 30  # every product in the compiled kernels, numba on the cores
        # A decoding step (each row the next token of its own slot) runs each v7 layer as one
        # compiled call.
        self.fused = DecodeLayers.of(self.blocks)
        if progress:
            progress(info.n_layer + 1, info.n_layer + 1)
        self.pool = StatePool(info, max_batch, initial_state)
        self._kernels_loaded: set[tuple] = set()  # the kernel sets (ops.kernel_set) of the steps so far
        if note := pinned_blas_note():
            log.warning(note)
        self._warming: threading.Thread | None = None
        self.kernels_ready = skinny_matmul is None  # whether steps run the compiled kernels
        self.warm_up_seconds: float | None = None
        self.numpy_steps = 0  # the pool's steps run on numpy while the kernels compiled (/metrics)
        marker = warmed_marker(f"v{info.version}-{precision}")
        cold = marker is not None and not marker.exists()  # a warm cache loads the kernels in ~1 s: no switch
        if skinny_matmul is not None and warm_up == "background" and cold and not _packed(tensors):
            # Served by numpy meanwhile: the backend's steps read kernels_ready once each,
            # so a step runs on one path; the warm-up's launches take jit.LAUNCH as any do,
            # and a numpy-only step takes none.
            self._warming = threading.Thread(target=self._warm_up_in_background, name="ai00-like-kernels",
                                             daemon=True)
            self._warming.start()
        elif skinny_matmul is not None:
            # numba compiles each kernel for the argument types it first sees (a read-only
            # mapped weight is a type of its own): a 2-slot step on a scratch pool does it
            # now, from numba's on-disk cache after the first run, not in the first batch
            # of requests; a single row too, for the fused layers.
            in_passing_thread(self._warm_up)
            self.kernels_ready = True
            _mark(marker)

    def _warm_up(self) -> None:
        pool = StatePool(self.info, 2)
        self._step(pool, [StepInput(0, [0]), StepInput(1, [0])], compiled=True)
        self._step(pool, [StepInput(0, [0])], compiled=True)
        # A prompt's chunk too (longer than a fused run: the blocks' WKV kernels), or the
        # first request with a prompt would compile them: 3.5 s for v7, cold.
        self._step(pool, [StepInput(0, [0] * (FUSED_RUN + 1))], compiled=True)

    def _warm_up_in_background(self) -> None:
        start = time.perf_counter()
        try:
            with compiling_ahead():  # compiles outside jit.LAUNCH: a model served beside this one goes on
                self._warm_up()
        except Exception:  # noqa: BLE001 — the numpy path goes on serving
            log.exception("compiling the CPU kernels failed; the model stays on numpy and BLAS")
            return
        release_compiler_pages()
        _mark(warmed_marker(f"v{self.info.version}-{self.precision}"))
        self.warm_up_seconds = time.perf_counter() - start
        self.kernels_ready = True  # the backend's next step runs the compiled kernels
        log.info("the CPU kernels are compiled (%.1f s); steps run them from now on", self.warm_up_seconds)

    def wait_for_kernels(self, timeout: float | None = None) -> bool:
        """Wait for a background warm-up; whether the compiled kernels are in use."""
        if self._warming is not None:
            self._warming.join(timeout)
        return self.kernels_ready

    # ------------------------------------------------------------------ state API

    @property
    def max_batch(self) -> int:
        return self.pool.size

    def initial_state(self) -> State:
        return self.pool.initial.copy()

    def read_state(self, slot: int) -> State:
        return self.pool.read(slot)

    def write_state(self, slot: int, state: State) -> None:
        self.pool.write(slot, state)

    def reset(self, slot: int) -> None:
        self.pool.reset(slot)

    # ------------------------------------------------------------------ inference

    def forward(self, tokens: Sequence[int], state: State | None = None, full_output: bool = False):
        """logits of the last token (or of every token), and the state after `tokens`.

        The state passed in is not modified.
        """
        pool = StatePool(self.info, 1, state.copy() if state is not None else self.pool.initial)
        (logits,) = self._step(pool, [StepInput(0, tokens, "all" if full_output else "last")])
        return logits, pool.read(0)

    def forward_hidden(self, tokens: Sequence[int], state: State | None = None):
        """The last layer's normalised output (ln_out, before the head) for every token, and the state."""
        pool = StatePool(self.info, 1, state.copy() if state is not None else self.pool.initial)
        ids = np.asarray(tokens, dtype=np.intp)
        if not len(ids) or ids.min() < 0 or ids.max() >= self.info.vocab:
            raise ValueError(f"token ids must be in [0, {self.info.vocab}) and at least one")
        with numpy_only(not self.kernels_ready), self._threads(len(ids)):
            x = self._layers(ids, BatchPlan([(0, len(ids))]), pool)
        return layer_norm(x, *self.ln_out), pool.read(0)

    def step(self, inputs: Sequence[StepInput]) -> list[np.ndarray | None]:
        """One batched forward over the pool's slots; per input its wanted logits or None."""
        return self._step(self.pool, inputs)

    def _step(self, pool: StatePool, inputs: Sequence[StepInput], compiled: bool | None = None) -> list[np.ndarray | None]:
        on_numpy = not (self.kernels_ready if compiled is None else compiled)  # read once: one path a step
        if on_numpy and skinny_matmul is not None and pool is self.pool:
            self.numpy_steps += 1
        with numpy_only(on_numpy):
            return self._step_on(pool, inputs)

    def _step_on(self, pool: StatePool, inputs: Sequence[StepInput]) -> list[np.ndarray | None]:
        layout = StepLayout(inputs, self.info.vocab, pool.size, pool.size)
        if not layout.active:
            return layout.results(None)
        with self._threads(len(layout.ids)):
            x = self._layers(layout.ids, layout.plan, pool)  # x: (A, C)
        # ln_out and the head (the largest matrix) only on the rows whose logits are wanted.
        with self._threads(len(layout.wanted)):
            logits = self._head(x[layout.wanted]) if layout.wanted else None  # (wanted, V)
        self._kernels_used((kernel_set(len(layout.ids)), kernel_set(len(layout.wanted))))
        return layout.results(logits)

    def _kernels_used(self, kernels: tuple) -> None:
        """After the first step that ran this set of kernels (loading them, and LLVM with
        them), LLVM's pages can go again (jit.release_compiler_pages)."""
        if kernels not in self._kernels_loaded and skinny_matmul is not None and kernels_on():
            self._kernels_loaded.add(kernels)
            log.debug("released %.0f MiB of LLVM's pages", release_compiler_pages() / 2**20)

    def _threads(self, rows: int):
        return threads_for(rows, self.compiled_rows)

    def _layers(self, ids: np.ndarray, plan: BatchPlan, pool: StatePool) -> np.ndarray:
        """The last layer's output of the step's rows: (A, C) for A = len(ids)."""
        x = layer_norm(embedding_rows(self.emb, ids), *self.ln0)
        if self.fused is not None and kernels_on() and len(ids) <= SKINNY_ROWS and _decoding(plan):
            return self.fused(x, pool.layers(), plan)
        ctx = Context()
        for block, slots in zip(self.blocks, pool.layers()):
            x = block(x, slots, plan, ctx)
        return x

    def _head(self, x: np.ndarray) -> np.ndarray:
        x = layer_norm(x, *self.ln_out)
        if x.shape[0] == 1 or x.shape[0] > SKINNY_ROWS or (skinny_matmul is not None and kernels_on()) \
                or not isinstance(self.head, np.ndarray):
            return linear(x, self.head)
        # Without numba, a few rows against the vocabulary-sized head: in blocks of rows that
        # stay in cache with xᵀ, which OpenBLAS does ~20% faster than in one product.
        xt = np.ascontiguousarray(x.T)
        out = np.empty((self.head.shape[0], x.shape[0]), dtype=np.float32)
        for start in range(0, self.head.shape[0], HEAD_BLOCK):
            np.matmul(self.head[start : start + HEAD_BLOCK], xt, out=out[start : start + HEAD_BLOCK])
        return np.ascontiguousarray(out.T)


def _mark(marker) -> None:
    try:
        if marker is not None:
            marker.touch()
    except OSError:
        pass


# The longest run of one slot's tokens a fused decoding step takes: a speculative step's token
# and its draft. Longer runs are prompts, which the blocks run (chunks of more than
# SKINNY_ROWS with OpenBLAS).
FUSED_RUN = 17


def _decoding(plan: BatchPlan) -> bool:
    """Whether a step's segments are all a decoding step's (a token, or a token and its draft)."""
    return len(plan.single_slots) == len(plan.slots) or int((plan.stops - plan.starts).max()) <= FUSED_RUN


def _projections(blocks) -> list:
    return [m for b in blocks for mix in (b.time_mix, b.channel_mix) for m in mix.W.values()]


def _bf16_panel_kind(precision: str, width: int, exact: bool) -> type | None:
    """The panels a bf16 model keeps its matrices in (panel_bf16.py, rounded_bf16.py), or
    None: in rows."""
    rounding = not exact and rounded_bf16.available()
    if not keeps_bf16_panels(precision, width, rounding):
        return None
    return RoundedBf16 if rounding else PanelBf16


def _matrix_forms(precision: str, width: int, exact: bool) -> tuple[str, type | None]:
    """What a model kept in `precision` keeps its matrices in, and their panels' kind
    (`_bf16_panel_kind`): an fp16 model's rounded to bf16 where bf16 products round the
    activations (`exact = false`, rounded_bf16.py), once at load, since no CPU here has a
    product of fp16 weights faster than fp32 FMAs."""
    if precision == "fp16" and _bf16_panel_kind("bf16", width, exact) is RoundedBf16:
        return "bf16", RoundedBf16
    return precision, _bf16_panel_kind(precision, width, exact)


def _bf16_in_panels(blocks, head, kind: type):
    """The blocks' projections put in panels of `kind` in place (panel_bf16.in_panels), and
    the head's. Rounded, the v7 LoRA factors too: in rows they took a fifth of a 1.5B
    prefill on AMX's tiles (0.52 of 2.5 s, against 0.08); a factor whose inputs are not
    whole blocks (1.5B's 96-wide decay and α LoRAs) padded with zeros, as the rounded
    products pad x (in rows, the two took 0.14 s of a 2.4 s prefill)."""
    for block in blocks:
        for mix in (block.time_mix, block.channel_mix):
            mix.W = {name: bf16_in_panels(matrix, kind) for name, matrix in mix.W.items()}
        if kind is RoundedBf16 and (lora := getattr(block.time_mix, "lora", None)) is not None:
            block.time_mix.lora = {name: bf16_in_panels(matrix, kind, padded=True) for name, matrix in lora.items()}
    return bf16_in_panels(head, kind)


def _projections_all(blocks, kind: type) -> bool:
    return all(isinstance(m, kind) for m in _projections(blocks))


def _packed(tensors: Mapping[str, np.ndarray]) -> bool:
    from ..quant import QuantisedMatrix

    return any(isinstance(t, QuantisedMatrix) for t in tensors.values())


def kept_precision(tensors: Mapping[str, np.ndarray], precision: str) -> str:
    """What the numpy backend keeps the matrices in for a requested `precision`."""
    precision = file_precision(tensors) if precision == "auto" else precision
    if precision != "fp32" and not keeps_16bit():
        log.info("the numpy backend keeps %s weights as fp32: its 16-bit kernels need numba", precision)
        precision = "fp32"
    return precision
