"""The WebGPU RWKV model: the same interface as the numpy `CpuModel` (v4, v5.x, v6, v7; fp32 or
fp16 weights, bf16 files as fp16, Int8/NF4 projections).

One batched step runs every slot's rows as one stack (rwkv-spec §4.2): the embedding rows
are gathered on the CPU, then each layer is a fixed list of compute dispatches over the
stack (blocks.py) — recorded once per step shape and replayed. The activations live in one
buffer of named regions (recorder.py); the recurrent states of all slots in a buffer per
part, slot-first (states.py); the weights as uploaded by buffers.py.
"""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence

import numpy as np

from ..batch import StepInput, StepLayout
from ..info import ModelInfo
from ..norms import layer_norm
from ..quant import QuantisedMatrix, quant_options, quantise_tensors
from ..state import State
from ..weights import LayerWeights, as_float32, embedding_rows, file_precision
from .blocks import Block
from .buffers import Uploader
from .device import Device
from .kernels import EncodedAhead, Kernels
from .recorder import MATVEC_ROWS, WANTED, Recorder, Workspace
from .states import GpuStates

MAX_HEAD_SIZE = 64  # the WKV kernels keep one row of a head's state per thread, N ≤ 64 threads
FORWARD_CHUNK = 256  # tokens per step of `forward`: bounds the activation buffer
PROGRAMS_KEPT = 32  # recorded step shapes kept for reuse
# Vendors whose GPUs decode slower with the subgroup matrix–vector kernels than with the
# workgroup reductions. NVIDIA (an H200, bench/gpu_reference.py): 1.5B batch 1 110 against
# 141 tokens/s, batch 16 597 against 674; the kernels alone 0.51 against 0.58-0.65 × the copy.
SUBGROUPS_SLOWER = (0x10DE,)
log = logging.getLogger(__name__)


class GpuModel:
    device = "gpu"
    max_binding: int | None = None  # bytes; lower than the adapter's limit to test the splitting
    use_subgroups: bool | None = None  # None: where the adapter has them and they are not slower; or forced

    @property
    def subgroups_used(self) -> bool:
        """Whether the matrix–vector kernels reduce within subgroups (recorded steps keep the
        choice they were recorded with)."""
        wanted = self.gpu.adapter.vendor_id not in SUBGROUPS_SLOWER if self.use_subgroups is None else self.use_subgroups
        return self.gpu.subgroups and wanted

    def __init__(self, tensors: Mapping[str, np.ndarray], info: ModelInfo, max_batch: int = 1,
                 initial_state: State | None = None, progress: Callable[[int, int], None] | None = None,
                 adapter: int = 0, precision: str = "fp32", quant: int = 0, quant_type: str = "int8"):
        """`precision` "fp16" keeps the matrices in f16 (activations, states and sums stay f32),
        "fp32" in f32; "auto" keeps an fp32 file's fp32 and an fp16 or bf16 file's 16 bits as
        f16 (the kernels have no bf16: "bf16" is f16 too, with a log line).
        `quant` > 0 stores the projections of the first `quant` layers (not the LoRAs, not
        the head, which only `load_model`'s quant_head makes Int8) as `quant_type` "int8" or
        "nf4" blocks (rwkv-spec §6); projections that
        are already `QuantisedMatrix` (a saved quantised model, or `load_model`'s doing) are
        uploaded as they are."""
        precision, quant, quant_type = quant_options(precision, quant, quant_type)
        precision = gpu_precision(precision, tensors)
        check_gpu_shape(info)
        if quant:
            tensors = quantise_tensors(tensors, quant, quant_type)
        self.info, self.precision = info, precision
        self.tensors = tensors  # as loaded (LoRAs merged, quantised), for saving
        self.gpu = Device(adapter)
        self.adapter = self.gpu.adapter
        self.kernels = Kernels(self.gpu.device)
        self.ahead = EncodedAhead(self.kernels)
        up = Uploader(self.gpu, precision, self.max_binding)
        self.emb = tensors["emb.weight"]  # stays in CPU memory; rows are gathered per step
        vec = lambda name: as_float32(tensors[name]).reshape(-1)
        self.ln0 = (up.vector(vec("blocks.0.ln0.weight")), up.vector(vec("blocks.0.ln0.bias")))
        self.blocks = []
        for i in range(info.n_layer):
            self.blocks.append(Block(LayerWeights(tensors, i), info, up))
            if progress:
                progress(i + 1, info.n_layer + 1)
        self.ln_out = (vec("ln_out.weight"), vec("ln_out.bias"))  # on the CPU too: `forward_hidden`
        self.ln_out_gpu = (up.vector(self.ln_out[0]), up.vector(self.ln_out[1]))
        head = tensors["head.weight"]  # quantised only when asked (quant_head)
        self.head = up.matrix(head if isinstance(head, QuantisedMatrix) else as_float32(head))
        if progress:
            progress(info.n_layer + 1, info.n_layer + 1)

        matrices = [m for block in self.blocks for m in block.matrices()]
        self.weight_bytes = sum(m.nbytes for m in matrices)  # the layers' matrices, as stored
        width = max([info.n_embd, info.ffn] + [max(m.rows, m.cols) for m in matrices])
        self.space = Workspace(up, width, info.vocab)
        self.initial = initial_state if initial_state is not None else State.zeros(info)
        self._max_batch = max_batch
        # One slot more than max_batch: `forward` runs in the last one.
        self.states = GpuStates(up, info, max_batch + 1)
        for slot in range(max_batch + 1):
            self.states.write(slot, self.initial)
        self.programs: OrderedDict[tuple, list] = OrderedDict()

    # ------------------------------------------------------------------ state API

    @property
    def max_batch(self) -> int:
        return self._max_batch

    def initial_state(self) -> State:
        return self.initial.copy()

    def _check_slot(self, slot: int) -> None:
        if not 0 <= slot < self._max_batch:
            raise ValueError(f"slot {slot} is outside the pool of {self._max_batch}")

    def read_state(self, slot: int) -> State:
        self._check_slot(slot)
        return self.states.read(slot)

    def write_state(self, slot: int, state: State) -> None:
        self._check_slot(slot)
        self.states.write(slot, state)

    def reset(self, slot: int) -> None:
        self.write_state(slot, self.initial)

    # ------------------------------------------------------------------ inference

    def forward(self, tokens: Sequence[int], state: State | None = None, full_output: bool = False):
        """logits of the last token (or of every token), and the state after `tokens`.

        Runs in the model's own scratch slot, FORWARD_CHUNK tokens per step; the state passed
        in is not modified.
        """
        scratch = self._max_batch
        self.states.write(scratch, state if state is not None else self.initial)
        chunks = self._chunks(tokens)
        logits = []
        for n, chunk in enumerate(chunks):
            want = "all" if full_output else "last" if n == len(chunks) - 1 else "none"
            (out,) = self._step([StepInput(scratch, chunk, want)], scratch + 1)
            logits.append(out)
        result = np.concatenate(logits) if full_output and logits[0] is not None else logits[-1]
        return result, self.states.read(scratch)

    def forward_hidden(self, tokens: Sequence[int], state: State | None = None):
        """The last layer's normalised output (ln_out, before the head) for every token, and the state."""
        scratch = self._max_batch
        self.states.write(scratch, state if state is not None else self.initial)
        hidden = []
        for chunk in self._chunks(tokens):
            self._step([StepInput(scratch, chunk, "none")], scratch + 1)
            x = self.gpu.device.queue.read_buffer(self.space.act, 0, 4 * len(chunk) * self.info.n_embd)
            hidden.append(np.frombuffer(x, dtype=np.float32).reshape(len(chunk), -1))  # (T, C)
        return layer_norm(np.concatenate(hidden), *self.ln_out), self.states.read(scratch)

    @staticmethod
    def _chunks(tokens: Sequence[int]) -> list:
        tokens = list(tokens)
        return [tokens[i : i + FORWARD_CHUNK] for i in range(0, len(tokens), FORWARD_CHUNK)] or [tokens]

    def step(self, inputs: Sequence[StepInput]) -> list[np.ndarray | None]:
        """One batched forward over the pool's slots; per input its wanted logits or None."""
        return self._step(inputs, self._max_batch)

    def _step(self, inputs: Sequence[StepInput], slots: int) -> list[np.ndarray | None]:
        layout = StepLayout(inputs, self.info.vocab, slots, self._max_batch)
        if not layout.active:
            return layout.results(None)
        rows, wanted = layout.plan.n_rows, len(layout.wanted)
        if self.space.reserve(rows):
            self.programs.clear()  # they bind the buffers just replaced
        self.space.write_plan(layout)
        queue = self.gpu.device.queue
        queue.write_buffer(self.space.act, 0, embedding_rows(self.emb, layout.ids))
        program = self._program(rows, len(layout.active), wanted)
        self.ahead.submit(program)
        if not wanted:
            return layout.results(None)
        if rows <= MATVEC_ROWS:  # a decoding step: the next one is likely the same program
            self.ahead.prepare(program)
        V = self.info.vocab
        logits = np.frombuffer(queue.read_buffer(self.space.logits, 0, 4 * wanted * V), dtype=np.float32)
        return layout.results(logits.reshape(wanted, V).copy())

    # ------------------------------------------------------------------ recorded steps

    def _program(self, rows: int, segments: int, wanted: int) -> list:
        key = (rows, segments, wanted)
        if key in self.programs:
            self.programs.move_to_end(key)
        else:
            self.programs[key] = self._record(rows, segments, wanted)
            if len(self.programs) > PROGRAMS_KEPT:
                self.programs.popitem(last=False)
        return self.programs[key]

    def _record(self, rows: int, segments: int, wanted: int) -> list:
        """The dispatches of one step shape: ln0, the layers, then ln_out and the head only on
        the rows whose logits are wanted (gathered to the top of "z")."""
        rec = Recorder(self.kernels, self.gpu, self.space, self.states, self.info, rows, segments,
                       self.subgroups_used)
        rec.norm("x", "x", self.ln0)
        for block in self.blocks:
            block.record(rec)
        if wanted:
            space = self.space
            rec.dispatch("gather_rows.wgsl", "main", (rec.C, WANTED * space.capacity, rec.off("x"), rec.off("z")),
                         [rec.act, rec.plan], (rec.groups_c, wanted))
            rec.norm("z", "z", self.ln_out_gpu, wanted)
            rec.linear("z", self.head, None, target=space.logits, n_rows=wanted)
        return rec.out


def check_gpu_shape(info: ModelInfo) -> None:
    """Refuse, with the reason, a model the kernels cannot run (before anything is uploaded)."""
    if info.version != "4" and info.head_size > MAX_HEAD_SIZE:
        raise ValueError(f"the GPU backend's WKV kernels take heads of up to {MAX_HEAD_SIZE} channels; this model's "
                         f"are {info.head_size}: use device='cpu'")


def gpu_precision(precision: str, tensors: Mapping[str, np.ndarray]) -> str:
    """What the GPU keeps the matrices in for a requested `precision` (see GpuModel)."""
    if precision == "auto":
        precision = "fp32" if file_precision(tensors) == "fp32" else "fp16"
        if file_precision(tensors) == "bf16":
            log.info("the GPU backend keeps this bf16 model's weights as fp16 (its kernels have no bf16)")
    elif precision == "bf16":
        log.info("the GPU backend keeps the weights as fp16, not bf16 (its kernels have no bf16)")
        precision = "fp16"
    return precision
