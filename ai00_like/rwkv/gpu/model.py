"""The WebGPU RWKV model: the same interface as the numpy `CpuModel` (v4, v5.x, v6, v7; fp32 or
fp16 weights, Int8/NF4 projections).

One batched step runs every slot's rows as one stack (rwkv-spec §4.2): the embedding rows
are gathered on the CPU, then each layer is a fixed list of compute dispatches over the
stack — layer norm, token shift (the plan buffer says which slot each row belongs to),
mixing, the projections, the WKV recurrence per segment — recorded once per step shape
and replayed. The activations live in one buffer of named regions; the recurrent states of
all slots in three buffers, slot-first so a slot's state is one contiguous range.
"""

from __future__ import annotations

import math
from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import wgpu

from ..batch import BatchPlan, StepInput
from ..cpu.ops import GN_EPS, LN_EPS, layer_norm
from ..formats import gather_rows
from ..info import ModelInfo
from ..quant import ALIGN, QuantisedMatrix, quant_options, quantise_tensors
from ..state import State, StatePool, wkv_shape
from ..weights import LayerWeights, as_float32
from .device import Device
from .kernels import Kernels

# Regions of the activation buffer, each `capacity` rows of the widest vector. The six
# mixed inputs of the v7 time mix are consecutive, in the order of its coefficients (rwkvag).
REGIONS = ("x", "z", "prev", "xr", "xw", "xk", "xv", "xa", "xg",
           "r", "w", "k", "v", "a", "b", "g", "y", "t", "vfirst", "h")
MAX_HEAD_SIZE = 64  # the WKV kernels keep one row of a head's state per thread, N ≤ 64 threads
FORWARD_CHUNK = 256  # tokens per step of `forward`: bounds the activation buffer
MATVEC_ROWS = 16  # up to this many rows go through the matrix–vector kernels (a decoding batch)
TILE_N = 4  # weight rows per thread of the tiled kernel; bench/gpu.py compares tile shapes


def matmul_tile(rows: int) -> tuple:
    """The tiled kernel's constants: TM × TILE_N outputs per thread, a block of 16·TM rows —
    no taller than the rows need (up to 4)."""
    return (("TM", min(4, 1 << max(0, (rows - 1) // 16).bit_length())), ("TN", TILE_N),
            ("ROWS", 8 if rows <= 8 else MATVEC_ROWS))


def matvec_group_rows(entry: str, subgroup_width: int) -> int:
    """Outputs per workgroup of the subgroup matrix–vector kernels: for each subgroup of their
    64 invocations 8 (matvec8_subgroup) or 4 (matvec8_rows_subgroup, for every row of x)."""
    return (8 if entry == "matvec8_subgroup" else 4) * max(1, 64 // max(1, subgroup_width))


PROGRAMS_KEPT = 32  # recorded step shapes kept for reuse
BYTES_PER_WEIGHT = {"fp32": 4, "fp16": 2, "int8": 1.04, "nf4": 0.54}  # with the block scales
WEIGHT_ACCESS = {  # matmul.wgsl's weight reads per storage format
    "fp32": "weights_f32.wgsl", "fp16": "weights_f16.wgsl", "int8": "weights_int8.wgsl", "nf4": "weights_nf4.wgsl"}
STORAGE = wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_DST | wgpu.BufferUsage.COPY_SRC

NONE, TANH, SIGMOID, RELU2, SILU = 0, 1, 2, 3, 4  # activations fused into the products


@dataclass(frozen=True)
class Part:
    """Consecutive rows of a matrix in one buffer (with their own quantisation blocks)."""

    buffer: object
    first: int
    rows: int
    scales: object = None  # the block scales of int8 / nf4


@dataclass(frozen=True)
class Matrix:
    """A [rows, cols] weight matrix on the GPU in one of the WEIGHT_ACCESS formats, split by
    rows into parts when it is larger than the adapter lets one binding be."""

    parts: tuple[Part, ...]
    rows: int
    cols: int
    format: str

    @property
    def nbytes(self) -> int:
        return sum(p.buffer.size + (p.scales.size if p.scales is not None else 0) for p in self.parts)


class GpuModel:
    device = "gpu"
    max_binding: int | None = None  # bytes; lower than the adapter's limit to test the splitting
    use_subgroups = True  # where the adapter has them (off: to compare, in tests and bench/gpu.py)

    def __init__(self, tensors: Mapping[str, np.ndarray], info: ModelInfo, max_batch: int = 1,
                 initial_state: State | None = None, progress: Callable[[int, int], None] | None = None,
                 adapter: int = 0, precision: str = "fp32", quant: int = 0, quant_type: str = "int8"):
        """`precision` "fp16" keeps the matrices in f16 (activations, states and sums stay f32).
        `quant` > 0 stores the projections of the first `quant` layers (not the LoRAs, not
        the head) as `quant_type` "int8" or "nf4" blocks (rwkv-spec §6); projections that
        are already `QuantisedMatrix` (a saved quantised model, or `load_model`'s doing) are
        uploaded as they are."""
        precision, quant, quant_type = quant_options(precision, quant, quant_type)
        check_gpu_shape(info)
        self.precision = precision
        if quant:
            tensors = quantise_tensors(tensors, quant, quant_type)
        self.info = info
        self.tensors = tensors  # as loaded (LoRAs merged, quantised), for saving
        self.gpu = Device(adapter)
        self.adapter = self.gpu.adapter
        self.kernels = Kernels(self.gpu.device)
        self.emb = tensors["emb.weight"]  # stays in CPU memory; rows are gathered per step

        upload = self._upload
        vec = lambda name: as_float32(tensors[name]).reshape(-1)
        self.ln0 = (upload(vec("blocks.0.ln0.weight")), upload(vec("blocks.0.ln0.bias")))
        load_layer = {"4": self._layer4, "6": self._layer6, "7": self._layer7}.get(info.version, self._layer5)
        self.layers = []
        for i in range(info.n_layer):
            layer = load_layer(LayerWeights(tensors, i), i)
            layer["ln1"] = (upload(vec(f"blocks.{i}.ln1.weight")), upload(vec(f"blocks.{i}.ln1.bias")))
            layer["ln2"] = (upload(vec(f"blocks.{i}.ln2.weight")), upload(vec(f"blocks.{i}.ln2.bias")))
            self.layers.append(layer)
            if progress:
                progress(i + 1, info.n_layer + 1)
        self.ln_out = (vec("ln_out.weight"), vec("ln_out.bias"))
        self.ln_out_gpu = (upload(self.ln_out[0]), upload(self.ln_out[1]))
        self.head = self._matrix(as_float32(tensors["head.weight"]))  # never quantised
        if progress:
            progress(info.n_layer + 1, info.n_layer + 1)

        matrices = [m for layer in self.layers for m in layer.values() if isinstance(m, Matrix)]
        matrices += [m for layer in self.layers for m in layer.get("maa_w2", {}).values()]
        self.weight_bytes = sum(m.nbytes for m in matrices)  # the layers' matrices, as stored
        self.width = max([info.n_embd, info.ffn] + [max(m.rows, m.cols) for m in matrices])
        # The pool has one slot more than max_batch: `forward` runs in the last one.
        self.pool = StatePool(info, 1, initial_state)  # holds the initial state only
        self._max_batch = max_batch
        slots = max_batch + 1
        L = info.n_layer
        self.shift_floats = L * info.n_embd
        self.wkv_floats = L * int(np.prod(wkv_shape(info)))
        self.att_shift = self._buffer(slots * self.shift_floats)
        self.ffn_shift = self._buffer(slots * self.shift_floats)
        self.wkv = self._buffer(slots * self.wkv_floats)
        for slot in range(slots):
            self._write_slot(slot, self.pool.initial)
        self.capacity = 0
        self.programs: OrderedDict[tuple, list] = OrderedDict()


    # ------------------------------------------------------------------ weights per version
    # Matrices as [out, in] buffers (the LoRA matrices, stored [in, out], transposed once);
    # the small vectors of a block packed into one buffer in the order its kernel reads them.

    def _lora(self, w: LayerWeights, name: str):
        return self._matrix(np.ascontiguousarray(w.matrix(name).T))

    def _linears(self, w: LayerWeights, prefix: str, names) -> dict:
        """The projections of a block: the matrices quantisation applies to."""
        stored = lambda n: w.tensors[f"{w.prefix}{prefix}{n}.weight"]
        return {f"{prefix}{n}": self._matrix(m if isinstance(m := stored(n), QuantisedMatrix) else w.matrix(
            f"{prefix}{n}.weight")) for n in names}

    def _layer4(self, w: LayerWeights, i: int) -> dict:
        return {
            "mix": self._upload(1.0 - np.stack([w.vector(f"att.time_mix_{q}") for q in "rkv"])),
            "wkv": self._upload(np.concatenate([-np.exp(w.vector("att.time_decay")), w.vector("att.time_first")])),
            **self._linears(w, "att.", ("receptance", "key", "value", "output")),
            **self._channel_mix4(w),
        }

    def _channel_mix4(self, w: LayerWeights) -> dict:
        """v4/v5 channel mix: x = z·μ + p·(1−μ) = z + (p − z)(1 − μ), in region order r, k."""
        return {"ffn_mix": self._upload(1.0 - np.stack([w.vector("ffn.time_mix_r"), w.vector("ffn.time_mix_k")])),
                **self._linears(w, "ffn.", ("receptance", "key", "value"))}

    def _per_channel(self, values: np.ndarray) -> np.ndarray:
        """v5.0/5.1 keep decay and bonus per head, 5.2 per channel: as one value per channel."""
        H, N = self.info.n_head, self.info.head_size
        return np.broadcast_to(values.reshape(H, -1), (H, N)).reshape(-1)

    def _layer5(self, w: LayerWeights, i: int) -> dict:
        gated = self.info.version != "5.0"
        bonus = w.matrix("att.time_faaaa") if w.has("att.time_faaaa") else np.exp(w.matrix("att.time_first"))
        mix = 1.0 - np.stack([w.vector(f"att.time_mix_{q}") for q in ("rkvg" if gated else "rkv")])
        return {
            "gated": gated,
            "mix": self._upload(mix),
            "wkv": self._upload(np.concatenate([self._per_channel(bonus),
                                                self._per_channel(-np.exp(w.matrix("att.time_decay")))])),
            "ln_x": (self._upload(w.vector("att.ln_x.weight")), self._upload(w.vector("att.ln_x.bias"))),
            **self._linears(w, "att.", ("receptance", "key", "value", "output") + (("gate",) if gated else ())),
            **self._channel_mix4(w),
        }

    def _layer6(self, w: LayerWeights, i: int) -> dict:
        C = self.info.n_embd
        maa_w2 = w.matrix("att.time_maa_w2")  # [5, Dm, C], slices in the order w, k, v, r, g
        maa = {q: w.vector(f"att.time_maa_{q}") for q in "wkvrg"}
        return {
            "maa_x": self._upload(w.vector("att.time_maa_x")),
            # in region order r, w, k, v, (a: unused), g
            "maa": self._upload(np.stack([maa["r"], maa["w"], maa["k"], maa["v"], np.zeros(C, np.float32), maa["g"]])),
            "maa_w1": self._lora(w, "att.time_maa_w1"),
            "maa_w2": {q: self._matrix(np.ascontiguousarray(maa_w2[n].T)) for n, q in enumerate("wkvrg")},
            "decay_w1": self._lora(w, "att.time_decay_w1"),
            "decay_w2": self._lora(w, "att.time_decay_w2"),
            "wkv": self._upload(np.concatenate([w.vector("att.time_faaaa"), w.vector("att.time_decay")])),
            "ln_x": (self._upload(w.vector("att.ln_x.weight")), self._upload(w.vector("att.ln_x.bias"))),
            **self._linears(w, "att.", ("receptance", "key", "value", "gate", "output")),
            "ffn_mix": self._upload(np.stack([w.vector("ffn.time_maa_r"), w.vector("ffn.time_maa_k")])),
            **self._linears(w, "ffn.", ("receptance", "key", "value")),
        }

    def _layer7(self, w: LayerWeights, i: int) -> dict:
        C = self.info.n_embd
        layer = {
            "mix": self._upload(np.stack([w.vector(f"att.x_{q}") for q in "rwkvag"])),
            "prepare": self._upload(np.concatenate([
                w.vector("att.w0"), w.vector("att.a0"), w.vector("att.v0") if i else np.zeros(C, np.float32),
                w.vector("att.k_k"), w.vector("att.k_a")])),
            "out_vecs": self._upload(np.concatenate([w.vector("att.ln_x.weight"), w.vector("att.ln_x.bias"),
                                                     w.vector("att.r_k")])),
            "ffn_mix": self._upload(w.vector("ffn.x_k")),
            **self._linears(w, "att.", ("receptance", "key", "value", "output")),
            **self._linears(w, "ffn.", ("key", "value")),
        }
        # block 0's value-residual LoRA exists in files but is unused
        for n in ("w1", "w2", "a1", "a2", "g1", "g2") + (("v1", "v2") if i else ()):
            layer[n] = self._lora(w, f"att.{n}")
        return layer

    # ------------------------------------------------------------------ buffers

    def _buffer(self, floats: int):
        return self.gpu.device.create_buffer(size=max(4, 4 * floats), usage=STORAGE)

    def _upload(self, array: np.ndarray):
        """float32 values, padded with zeros to 16 bytes (the kernels read some as vec4)."""
        data = np.ascontiguousarray(array, dtype=np.float32).reshape(-1)
        data = np.pad(data, (0, -len(data) % 4))
        return self.gpu.device.create_buffer_with_data(data=data, usage=STORAGE)

    def _matrix(self, weights: np.ndarray | QuantisedMatrix) -> Matrix:
        """A [M, K] matrix in the model's precision, or in its quantised format."""
        fmt = weights.kind if isinstance(weights, QuantisedMatrix) else self.precision
        rows, cols = weights.shape
        limit = self.gpu.limits["max-storage-buffer-binding-size"]
        if self.max_binding:
            limit = min(limit, self.max_binding)
        row_bytes = cols * BYTES_PER_WEIGHT[fmt]
        per_part = max(1, int(limit // row_bytes) - 1)  # one row of slack for padding and scales
        if fmt in ("int8", "nf4"):  # parts begin at a block boundary
            step = ALIGN // math.gcd(cols, ALIGN)
            per_part = max(step, per_part // step * step)
        parts = tuple(self._part(weights, first, min(per_part, rows - first))
                      for first in range(0, rows, per_part))
        return Matrix(parts, rows, cols, fmt)

    def _part(self, weights: np.ndarray | QuantisedMatrix, first: int, rows: int) -> Part:
        words = lambda a: self.gpu.device.create_buffer_with_data(data=np.ascontiguousarray(a), usage=STORAGE)
        if isinstance(weights, QuantisedMatrix):
            packed, scales = weights.rows(first, rows)
            return Part(words(packed), first, rows, words(scales))
        weights = weights[first : first + rows]
        if self.precision == "fp32":
            return Part(self._upload(weights), first, rows)
        halves = np.ascontiguousarray(weights, dtype=np.float16).reshape(-1)  # f16 pairs, eight per 16 bytes
        halves = np.pad(halves, (0, -len(halves) % 8))
        return Part(words(halves.view(np.uint32)), first, rows)

    def _reserve(self, rows: int) -> None:
        """Grow the activation buffers (and forget the recorded steps) to fit `rows` rows."""
        if rows <= self.capacity:
            return
        capacity = max(16, 1 << (rows - 1).bit_length())
        self.capacity = capacity
        self.region = capacity * self.width
        self.act = self._buffer(len(REGIONS) * self.region)
        self.plan_buffer = self.gpu.device.create_buffer(size=4 * 6 * capacity, usage=STORAGE)
        self.logits = self._buffer(capacity * self.info.vocab)
        self.programs.clear()

    def _off(self, region: str) -> int:
        return REGIONS.index(region) * self.region

    # ------------------------------------------------------------------ state API

    @property
    def max_batch(self) -> int:
        return self._max_batch

    def initial_state(self) -> State:
        return self.pool.initial.copy()

    def _check_slot(self, slot: int) -> None:
        if not 0 <= slot < self._max_batch:
            raise ValueError(f"slot {slot} is outside the pool of {self._max_batch}")

    def _write_slot(self, slot: int, state: State) -> None:
        state.check(self.info)
        queue = self.gpu.device.queue
        f32 = lambda a: np.ascontiguousarray(a, dtype=np.float32)
        queue.write_buffer(self.att_shift, 4 * slot * self.shift_floats, f32(state.att_shift))
        queue.write_buffer(self.ffn_shift, 4 * slot * self.shift_floats, f32(state.ffn_shift))
        queue.write_buffer(self.wkv, 4 * slot * self.wkv_floats, f32(state.wkv))

    def _read_slot(self, slot: int) -> State:
        L, C = self.info.n_layer, self.info.n_embd
        read = lambda buf, n: np.frombuffer(
            self.gpu.device.queue.read_buffer(buf, 4 * slot * n, 4 * n), dtype=np.float32).copy()
        wkv = read(self.wkv, self.wkv_floats).reshape(L, *wkv_shape(self.info))
        return State(read(self.att_shift, self.shift_floats).reshape(L, C), wkv,
                     read(self.ffn_shift, self.shift_floats).reshape(L, C))

    def read_state(self, slot: int) -> State:
        self._check_slot(slot)
        return self._read_slot(slot)

    def write_state(self, slot: int, state: State) -> None:
        self._check_slot(slot)
        self._write_slot(slot, state)

    def reset(self, slot: int) -> None:
        self.write_state(slot, self.pool.initial)

    # ------------------------------------------------------------------ inference

    def forward(self, tokens: Sequence[int], state: State | None = None, full_output: bool = False):
        """logits of the last token (or of every token), and the state after `tokens`.

        Runs in the model's own scratch slot, FORWARD_CHUNK tokens per step; the state passed
        in is not modified.
        """
        scratch = self._max_batch
        self._write_slot(scratch, state if state is not None else self.pool.initial)
        chunks = self._chunks(tokens)
        logits = []
        for n, chunk in enumerate(chunks):
            want = "all" if full_output else "last" if n == len(chunks) - 1 else "none"
            (out,) = self._step([StepInput(scratch, chunk, want)], scratch + 1)
            logits.append(out)
        result = np.concatenate(logits) if full_output and logits[0] is not None else logits[-1]
        return result, self._read_slot(scratch)

    def forward_hidden(self, tokens: Sequence[int], state: State | None = None):
        """The last layer's normalised output (ln_out, before the head) for every token, and the state."""
        scratch = self._max_batch
        self._write_slot(scratch, state if state is not None else self.pool.initial)
        hidden = []
        for chunk in self._chunks(tokens):
            self._step([StepInput(scratch, chunk, "none")], scratch + 1)
            x = self.gpu.device.queue.read_buffer(self.act, 0, 4 * len(chunk) * self.info.n_embd)
            hidden.append(np.frombuffer(x, dtype=np.float32).reshape(len(chunk), -1))
        return layer_norm(np.concatenate(hidden), *self.ln_out), self._read_slot(scratch)

    @staticmethod
    def _chunks(tokens: Sequence[int]) -> list:
        tokens = list(tokens)
        return [tokens[i : i + FORWARD_CHUNK] for i in range(0, len(tokens), FORWARD_CHUNK)] or [tokens]

    def step(self, inputs: Sequence[StepInput]) -> list[np.ndarray | None]:
        """One batched forward over the pool's slots; per input its wanted logits or None."""
        return self._step(inputs, self._max_batch)

    def _step(self, inputs: Sequence[StepInput], slots: int) -> list[np.ndarray | None]:
        inputs = [StepInput(*i) for i in inputs]
        active = [i for i in inputs if len(i.tokens)]
        results: list[np.ndarray | None] = [None] * len(inputs)
        if not active:
            return results
        for i in active:
            if not 0 <= i.slot < slots:
                raise ValueError(f"slot {i.slot} is outside the pool of {self._max_batch}")
        ids = np.concatenate([np.asarray(i.tokens, dtype=np.intp) for i in active])
        if ids.min() < 0 or ids.max() >= self.info.vocab:
            raise ValueError(f"token ids must be in [0, {self.info.vocab})")
        plan = BatchPlan([(i.slot, len(i.tokens)) for i in active])
        wanted, where = [], []
        for i, start, stop in zip(active, plan.starts, plan.stops):
            rows = range(start, stop) if i.want == "all" else [stop - 1] if i.want == "last" else []
            where.append((len(wanted), len(rows)))
            wanted.extend(rows)

        rows = plan.n_rows
        self._reserve(rows)
        cap = self.capacity
        table = np.zeros(6 * cap, dtype=np.uint32)
        row_slot = np.repeat(plan.slots, plan.stops - plan.starts)
        first = np.zeros(rows, dtype=np.uint32)
        first[plan.starts] = 1
        table[0 : 2 * rows : 2], table[1 : 2 * rows : 2] = row_slot, first
        table[2 * cap : 2 * cap + 3 * len(active)] = np.stack(
            [plan.slots, plan.starts, plan.stops - plan.starts], axis=1).reshape(-1)
        table[5 * cap : 5 * cap + len(wanted)] = wanted
        queue = self.gpu.device.queue
        queue.write_buffer(self.plan_buffer, 0, table)
        queue.write_buffer(self.act, 0, np.ascontiguousarray(gather_rows(self.emb, ids), dtype=np.float32))
        self.kernels.run(self._program(rows, len(active), len(wanted)))
        if not wanted:
            return results
        V = self.info.vocab
        logits = np.frombuffer(queue.read_buffer(self.logits, 0, 4 * len(wanted) * V), dtype=np.float32)
        logits = logits.reshape(len(wanted), V)
        k = 0
        for n, i in enumerate(inputs):
            if not len(i.tokens):
                continue
            offset, count = where[k]
            k += 1
            if i.want == "last":
                results[n] = logits[offset].copy()
            elif i.want == "all":
                results[n] = logits[offset : offset + count].copy()
        return results

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
        """The dispatches of one step shape; per layer the blocks of rwkv-spec §2 for the version."""
        info, K = self.info, self.kernels
        C, H, N = info.n_embd, info.n_head, info.head_size
        cap, act, plan = self.capacity, self.act, self.plan_buffer
        off = self._off
        groups_c = (C + 63) // 64
        out: list = []
        # The mixed inputs go to consecutive regions from "xr": mixed(q) is the q-th.
        mixed = lambda q: REGIONS[REGIONS.index("xr") + q]

        def norm(src, dst, weights, n_rows, groups=1, eps=LN_EPS):
            out.append(K.dispatch("layer_norm.wgsl", "main", (n_rows, C, groups, off(src), off(dst), eps),
                                  [act, *weights], (groups, n_rows)))

        def linear(src, matrix, dst, activation=NONE, accumulate=0, target=None, n_rows=rows,
                   src_shift=0, src_stride=None):
            M, Kdim = matrix.rows, matrix.cols
            tile = matmul_tile(n_rows)
            tm = tile[0][1]
            dst_off = 0 if target is not None else off(dst)
            for part in matrix.parts:
                params = (n_rows, part.rows, Kdim, off(src) + src_shift, src_stride or Kdim, 0, dst_off + part.first,
                          M, activation, accumulate)
                shader, constants = "matmul.wgsl", tile
                if n_rows > 1 and n_rows <= MATVEC_ROWS and Kdim % 8 == 0:
                    entry, groups = "matvec8_rows", ((part.rows + 3) // 4, 1)
                elif n_rows < MATVEC_ROWS:
                    entry, groups = "matvec8" if Kdim % 8 == 0 else "matvec", ((part.rows + 3) // 4, n_rows)
                else:
                    entry, groups = "matmul_tiled", (-(-part.rows // (16 * TILE_N)), -(-n_rows // (16 * tm)))
                if entry in ("matvec8", "matvec8_rows") and self.gpu.subgroups and self.use_subgroups:
                    # each subgroup on its own outputs: no workgroup reduction (shaders/matvec_subgroup.wgsl)
                    shader, entry = ("matmul.wgsl", "matvec_subgroup.wgsl"), entry + "_subgroup"
                    rows_per_group = matvec_group_rows(entry, self.gpu.subgroup_width)
                    groups = (-(-part.rows // rows_per_group), groups[1])
                    x4 = int((off(src) + src_shift) % 4 == 0 and (src_stride or Kdim) % 4 == 0)
                    constants = (*tile, ("GROUP_ROWS", rows_per_group), ("X4", x4))
                buffers = [act, part.buffer, target or act, part.scales]
                if shader != "matmul.wgsl":
                    buffers.append(act)  # binding 5: x as vec4
                out.append(K.dispatch(shader, entry, params, buffers, groups,
                                      prelude=WEIGHT_ACCESS[matrix.format], constants=constants))

        def multiply(a, b, dst, accumulate=0):
            out.append(K.dispatch("elementwise.wgsl", "mul", (C, off(a), off(b), off(dst), accumulate), [act],
                                  (groups_c, rows)))

        def shift(state, layer):
            params = (C, 2 * cap, off("z"), off("prev"), layer * C, self.shift_floats)
            out.append(K.dispatch("token_shift.wgsl", "shift", params, [act, state, plan], (groups_c, rows)))
            out.append(K.dispatch("token_shift.wgsl", "save", params, [act, state, plan], (groups_c, segments)))

        def mix(mu, count, dst="xr", entry="main"):
            out.append(K.dispatch("mix.wgsl", entry, (C, off("z"), off("prev"), off(dst), self.region),
                                  [act, mu], (groups_c, rows, count)))

        def wkv(shader, params, vecs, groups):
            out.append(K.dispatch(shader, "main", params, [act, self.wkv, plan] + ([vecs] if vecs else []), groups))

        layer_wkv = self.wkv_floats // info.n_layer

        def time_mix4(i, w):
            mix(w["mix"], 3)  # r, k, v
            linear(mixed(0), w["att.receptance"], "r", SIGMOID)
            linear(mixed(1), w["att.key"], "k")
            linear(mixed(2), w["att.value"], "v")
            wkv("wkv4.wgsl", (C, 2 * cap, off("r"), off("k"), off("v"), off("y"), i * layer_wkv, self.wkv_floats),
                w["wkv"], (groups_c, segments))
            linear("y", w["att.output"], "x", accumulate=1)

        def time_mix5(i, w):
            mix(w["mix"], 4 if w["gated"] else 3)  # r, k, v (, g)
            linear(mixed(0), w["att.receptance"], "r")
            linear(mixed(1), w["att.key"], "k")
            linear(mixed(2), w["att.value"], "v")
            wkv5(i, w, dynamic=0)
            if w["gated"]:
                linear(mixed(3), w["att.gate"], "g", SILU)
                multiply("y", "g", "y")
            linear("y", w["att.output"], "x", accumulate=1)

        def wkv5(i, w, dynamic):
            wkv("wkv5.wgsl", (C, N, 2 * cap, dynamic, off("r"), off("w"), off("k"), off("v"), off("y"),
                              i * layer_wkv, self.wkv_floats), w["wkv"], (H, segments))
            norm("y", "y", w["ln_x"], rows, groups=H, eps=GN_EPS)

        def time_mix6(i, w):
            mix(w["maa_x"], 1, dst="y")  # z + (p − z) μ_x, the LoRA's input
            lora_in = w["maa_w1"]
            linear("y", lora_in, "t", TANH)
            rank = lora_in.rows // 5
            for n, q in enumerate("wkvrg"):  # each slice of the LoRA's output through its own W2
                linear("t", w["maa_w2"][q], mixed("rwkvag".index(q)), src_shift=n * rank, src_stride=lora_in.rows)
            mix(w["maa"], 6, entry="dynamic")  # in region order r, w, k, v, (a), g
            linear(mixed(0), w["att.receptance"], "r")
            linear(mixed(2), w["att.key"], "k")
            linear(mixed(3), w["att.value"], "v")
            linear(mixed(5), w["att.gate"], "g", SILU)
            linear(mixed(1), w["decay_w1"], "a", TANH)
            linear("a", w["decay_w2"], "w")  # λ's LoRA part; decay = exp(−exp(λ)) in the kernel
            wkv5(i, w, dynamic=1)
            multiply("y", "g", "y")
            linear("y", w["att.output"], "x", accumulate=1)

        def time_mix7(i, w):
            mix(w["mix"], 6)  # r, w, k, v, a, g
            linear("xr", w["att.receptance"], "r")
            linear("xk", w["att.key"], "k")
            linear("xv", w["att.value"], "v")
            linear("xw", w["w1"], "t", TANH)
            linear("t", w["w2"], "w")
            linear("xa", w["a1"], "t")
            linear("t", w["a2"], "a")
            if i:
                linear("xv", w["v1"], "t")
                linear("t", w["v2"], "b")
            linear("xg", w["g1"], "t", SIGMOID)
            linear("t", w["g2"], "g")
            out.append(K.dispatch(
                "v7_prepare.wgsl", "main",
                (C, N, int(i == 0), off("k"), off("v"), off("w"), off("a"), off("b"), off("vfirst")),
                [act, w["prepare"]], (H, rows)))
            wkv("wkv7.wgsl", (C, N, 2 * cap, off("r"), off("w"), off("k"), off("v"), off("a"), off("b"), off("y"),
                              i * layer_wkv, self.wkv_floats), None, (H, segments))
            out.append(K.dispatch(
                "v7_output.wgsl", "main",
                (C, N, off("y"), off("r"), off("k"), off("v"), off("g"), GN_EPS),
                [act, w["out_vecs"]], (H, rows)))
            linear("y", w["att.output"], "x", accumulate=1)

        def channel_mix(i, w):
            if info.version == "7":  # W_v relu(W_k x)², no receptance gate
                mix(w["ffn_mix"], 1)
                linear(mixed(0), w["ffn.key"], "h", RELU2)
                linear("h", w["ffn.value"], "x", accumulate=1)
                return
            mix(w["ffn_mix"], 2)  # r, k: σ(W_r x_r) ⊙ W_v relu(W_k x_k)²
            linear(mixed(0), w["ffn.receptance"], "r", SIGMOID)
            linear(mixed(1), w["ffn.key"], "h", RELU2)
            linear("h", w["ffn.value"], "t")
            multiply("r", "t", "x", accumulate=1)

        time_mix = {"4": time_mix4, "6": time_mix6, "7": time_mix7}.get(info.version, time_mix5)
        norm("x", "x", self.ln0, rows)
        for i, w in enumerate(self.layers):
            norm("x", "z", w["ln1"], rows)
            shift(self.att_shift, i)
            time_mix(i, w)
            norm("x", "z", w["ln2"], rows)
            shift(self.ffn_shift, i)
            channel_mix(i, w)
        if wanted:  # ln_out and the head only on the rows whose logits are wanted
            out.append(K.dispatch("gather_rows.wgsl", "main", (C, 5 * cap, off("x"), off("z")), [act, plan],
                                  (groups_c, wanted)))
            norm("z", "z", self.ln_out_gpu, wanted)
            linear("z", self.head, None, target=self.logits, n_rows=wanted)
        return out


def check_gpu_shape(info: ModelInfo) -> None:
    """Refuse, with the reason, a model the kernels cannot run (before anything is uploaded)."""
    if info.version != "4" and info.head_size > MAX_HEAD_SIZE:
        raise ValueError(f"the GPU backend's WKV kernels take heads of up to {MAX_HEAD_SIZE} channels; this model's "
                         f"are {info.head_size}: use device='cpu'")
