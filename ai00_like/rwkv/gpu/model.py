"""The WebGPU RWKV model: the same interface as the numpy `CpuModel` (RWKV-7, fp32 weights).

One batched step runs every slot's rows as one stack (rwkv-spec §4.2): the embedding rows
are gathered on the CPU, then each layer is a fixed list of compute dispatches over the
stack — layer norm, token shift (the plan buffer says which slot each row belongs to),
mixing, the projections, the WKV recurrence per segment — recorded once per step shape
and replayed. The activations live in one buffer of named regions; the recurrent states of
all slots in three buffers, slot-first so a slot's state is one contiguous range.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Mapping, Sequence

import numpy as np
import wgpu

from ..batch import BatchPlan, StepInput
from ..info import ModelInfo
from ..state import State, StatePool
from ..cpu.ops import GN_EPS, LN_EPS, as_float32, layer_norm
from .device import Device
from .kernels import Kernels

# Regions of the activation buffer, each `capacity` rows of the widest vector. The six
# mixed inputs of the v7 time mix are consecutive, in the order of its coefficients (rwkvag).
REGIONS = ("x", "z", "prev", "xr", "xw", "xk", "xv", "xa", "xg",
           "r", "w", "k", "v", "a", "b", "g", "y", "t", "vfirst", "h")
MATVEC_ROWS = 8  # fewer rows than this go through the matrix–vector kernel
PROGRAMS_KEPT = 32  # recorded step shapes kept for reuse
STORAGE = wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_DST | wgpu.BufferUsage.COPY_SRC

NONE, TANH, SIGMOID, RELU2 = 0, 1, 2, 3


class GpuModel:
    device = "gpu"

    def __init__(self, tensors: Mapping[str, np.ndarray], info: ModelInfo, max_batch: int = 1,
                 initial_state: State | None = None, progress: Callable[[int, int], None] | None = None,
                 adapter: int = 0):
        if info.version != "7":
            raise ValueError(f"the GPU backend runs RWKV-7 only so far, not v{info.version}")
        self.info = info
        self.tensors = tensors
        self.gpu = Device(adapter)
        self.adapter = self.gpu.adapter
        self.kernels = Kernels(self.gpu.device)
        self.emb = tensors["emb.weight"]  # stays in CPU memory; rows are gathered per step

        upload = self._upload
        vec = lambda name: as_float32(tensors[name]).reshape(-1)  # noqa: E731
        mat = lambda name: as_float32(tensors[name])  # noqa: E731
        C = info.n_embd
        self.ln0 = (upload(vec("blocks.0.ln0.weight")), upload(vec("blocks.0.ln0.bias")))
        self.layers = []
        for i in range(info.n_layer):
            p = f"blocks.{i}."
            att = lambda n: p + "att." + n  # noqa: E731
            layer = {
                "ln1": (upload(vec(p + "ln1.weight")), upload(vec(p + "ln1.bias"))),
                "ln2": (upload(vec(p + "ln2.weight")), upload(vec(p + "ln2.bias"))),
                "mix": upload(np.stack([vec(att(f"x_{q}")) for q in "rwkvag"])),
                "prepare": upload(np.concatenate([
                    vec(att("w0")), vec(att("a0")), vec(att("v0")) if i else np.zeros(C, np.float32),
                    vec(att("k_k")), vec(att("k_a"))])),
                "out_vecs": upload(np.concatenate([vec(att("ln_x.weight")), vec(att("ln_x.bias")), vec(att("r_k"))])),
                "ffn_mix": upload(vec(p + "ffn.x_k")),
            }
            for n in ("receptance", "key", "value", "output"):
                layer[n] = self._matrix(mat(att(f"{n}.weight")))
            # The LoRA matrices are stored [in, out] (x @ A); kept transposed, like the rest.
            for n in ("w1", "w2", "a1", "a2", "g1", "g2") + (("v1", "v2") if i else ()):
                layer[n] = self._matrix(np.ascontiguousarray(mat(att(n)).T))
            layer["ffn_key"] = self._matrix(mat(p + "ffn.key.weight"))
            layer["ffn_value"] = self._matrix(mat(p + "ffn.value.weight"))
            self.layers.append(layer)
            if progress:
                progress(i + 1, info.n_layer + 1)
        self.ln_out = (vec("ln_out.weight"), vec("ln_out.bias"))
        self.ln_out_gpu = (upload(self.ln_out[0]), upload(self.ln_out[1]))
        self.head = self._matrix(mat("head.weight"))
        if progress:
            progress(info.n_layer + 1, info.n_layer + 1)

        self.width = max([C, info.ffn] + [m[1] for layer in self.layers for m in layer.values()
                                           if isinstance(m, tuple) and len(m) == 3])
        # The pool has one slot more than max_batch: `forward` runs in the last one.
        self.pool = StatePool(info, 1, initial_state)  # holds the initial state only
        self._max_batch = max_batch
        slots = max_batch + 1
        L, H, N = info.n_layer, info.n_head, info.head_size
        self.shift_floats = L * C
        self.wkv_floats = L * H * N * N
        self.att_shift = self._buffer(slots * self.shift_floats)
        self.ffn_shift = self._buffer(slots * self.shift_floats)
        self.wkv = self._buffer(slots * self.wkv_floats)
        for slot in range(slots):
            self._write_slot(slot, self.pool.initial)
        self.capacity = 0
        self.programs: OrderedDict[tuple, list] = OrderedDict()

    # ------------------------------------------------------------------ buffers

    def _buffer(self, floats: int):
        return self.gpu.device.create_buffer(size=max(4, 4 * floats), usage=STORAGE)

    def _upload(self, array: np.ndarray):
        data = np.ascontiguousarray(array, dtype=np.float32)
        return self.gpu.device.create_buffer_with_data(data=data, usage=STORAGE)

    def _matrix(self, weights: np.ndarray):
        """(buffer, rows M, columns K) of a [M, K] matrix."""
        return (self._upload(weights), weights.shape[0], weights.shape[1])

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
        f32 = lambda a: np.ascontiguousarray(a, dtype=np.float32)  # noqa: E731
        queue.write_buffer(self.att_shift, 4 * slot * self.shift_floats, f32(state.att_shift))
        queue.write_buffer(self.ffn_shift, 4 * slot * self.shift_floats, f32(state.ffn_shift))
        queue.write_buffer(self.wkv, 4 * slot * self.wkv_floats, f32(state.wkv))

    def _read_slot(self, slot: int) -> State:
        L, C = self.info.n_layer, self.info.n_embd
        read = lambda buf, n: np.frombuffer(  # noqa: E731
            self.gpu.device.queue.read_buffer(buf, 4 * slot * n, 4 * n), dtype=np.float32).copy()
        wkv = read(self.wkv, self.wkv_floats).reshape(L, self.info.n_head, self.info.head_size, self.info.head_size)
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

        Runs in the model's own scratch slot; the state passed in is not modified.
        """
        scratch = self._max_batch
        self._write_slot(scratch, state if state is not None else self.pool.initial)
        (logits,) = self._step([StepInput(scratch, tokens, "all" if full_output else "last")], scratch + 1)
        return logits, self._read_slot(scratch)

    def forward_hidden(self, tokens: Sequence[int], state: State | None = None):
        """The last layer's normalised output (ln_out, before the head) for every token, and the state."""
        scratch = self._max_batch
        self._write_slot(scratch, state if state is not None else self.pool.initial)
        self._step([StepInput(scratch, tokens, "none")], scratch + 1)
        n = len(tokens)
        x = np.frombuffer(self.gpu.device.queue.read_buffer(self.act, 0, 4 * n * self.info.n_embd), dtype=np.float32)
        return layer_norm(x.reshape(n, -1), *self.ln_out), self._read_slot(scratch)

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
        queue.write_buffer(self.act, 0, np.ascontiguousarray(self.emb[ids], dtype=np.float32))
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
        info, K = self.info, self.kernels
        C, H, N = info.n_embd, info.n_head, info.head_size
        cap, act, plan = self.capacity, self.act, self.plan_buffer
        off = self._off
        groups_c = (C + 63) // 64
        out: list = []

        def norm(src, dst, weights, n_rows, groups=1, eps=LN_EPS):
            out.append(K.dispatch("layer_norm.wgsl", "main", (n_rows, C, groups, off(src), off(dst), eps),
                                  [act, *weights], (groups, n_rows)))

        def linear(src, matrix, dst, n_rows, activation=NONE, accumulate=0, target=None):
            buf, M, Kdim = matrix
            dst_off = 0 if target is not None else off(dst)
            params = (n_rows, M, Kdim, off(src), 0, dst_off, activation, accumulate)
            if n_rows < MATVEC_ROWS:
                entry, groups = "matvec", ((M + 3) // 4, n_rows)
            else:
                entry, groups = "matmul_tiled", ((M + 15) // 16, (n_rows + 15) // 16)
            out.append(K.dispatch("matmul.wgsl", entry, params, [act, buf, target or act], groups))

        def shift(state, layer):
            params = (C, 2 * cap, off("z"), off("prev"), layer * C, self.shift_floats)
            out.append(K.dispatch("token_shift.wgsl", "shift", params, [act, state, plan], (groups_c, rows)))
            out.append(K.dispatch("token_shift.wgsl", "save", params, [act, state, plan], (groups_c, segments)))

        def mix(mu, dst, count):
            out.append(K.dispatch("mix.wgsl", "main", (C, off("z"), off("prev"), off(dst), self.region),
                                  [act, mu], (groups_c, rows, count)))

        norm("x", "x", self.ln0, rows)
        for i, w in enumerate(self.layers):
            # time mix (rwkv-spec §2.5)
            norm("x", "z", w["ln1"], rows)
            shift(self.att_shift, i)
            mix(w["mix"], "xr", 6)
            linear("xr", w["receptance"], "r", rows)
            linear("xk", w["key"], "k", rows)
            linear("xv", w["value"], "v", rows)
            linear("xw", w["w1"], "t", rows, TANH)
            linear("t", w["w2"], "w", rows)
            linear("xa", w["a1"], "t", rows)
            linear("t", w["a2"], "a", rows)
            if i:
                linear("xv", w["v1"], "t", rows)
                linear("t", w["v2"], "b", rows)
            linear("xg", w["g1"], "t", rows, SIGMOID)
            linear("t", w["g2"], "g", rows)
            out.append(K.dispatch(
                "v7_prepare.wgsl", "main",
                (C, N, int(i == 0), off("k"), off("v"), off("w"), off("a"), off("b"), off("vfirst")),
                [act, w["prepare"]], (H, rows)))
            out.append(K.dispatch(
                "wkv7.wgsl", "main",
                (C, N, 2 * cap, off("r"), off("w"), off("k"), off("v"), off("a"), off("b"), off("y"),
                 i * H * N * N, self.wkv_floats),
                [act, self.wkv, plan], (H, segments)))
            out.append(K.dispatch(
                "v7_output.wgsl", "main",
                (C, N, off("y"), off("r"), off("k"), off("v"), off("g"), GN_EPS),
                [act, w["out_vecs"]], (H, rows)))
            linear("y", w["output"], "x", rows, accumulate=1)
            # channel mix
            norm("x", "z", w["ln2"], rows)
            shift(self.ffn_shift, i)
            mix(w["ffn_mix"], "xk", 1)
            linear("xk", w["ffn_key"], "h", rows, RELU2)
            linear("h", w["ffn_value"], "x", rows, accumulate=1)
        if wanted:  # ln_out and the head only on the rows whose logits are wanted
            out.append(K.dispatch("gather_rows.wgsl", "main", (C, 5 * cap, off("x"), off("z")), [act, plan],
                                  (groups_c, wanted)))
            norm("z", "z", self.ln_out_gpu, wanted)
            linear("z", self.head, None, wanted, target=self.logits)
        return out
