"""v7's layer for a step of one row (decoding batch 1), each layer in one compiled call.

The same equations as blocks.py's Block, TimeMix7 and ChannelMix7, in the same order and
in fp32, written out for a single token. At batch 1 the matrix products read a layer's
weights once and take about three quarters of a token's time; what is left went to
some 300 Python-level calls a layer (element-wise numpy operations on 768 numbers, and
14 launches of the product kernel), about 3 ms of a 15 ms bf16 token on the 0.1B shape.
Here a layer is one call: its 14 matrix–vector products are the product kernels' parallel
loops launched from inside it, the WKV recurrence runs head by head in parallel, and the
element-wise work runs in between on one core.

Each product goes to the kernel of its matrix's form (`matvec`): skinny.py's for fp32 and
16-bit weights, int8.py's and nf4.py's for packed blocks, called from inside the layer.
Products that need nothing from each other share a launch where their matrices are
arrays (`matvec3`: r, k and v; the LoRAs' first products; their second ones), since
starting and ending a launch costs microseconds: 8 launches a layer instead of 14.
Without numba there is no fused layer (`OneRowLayers.of` gives None).
"""

from __future__ import annotations

import numpy as np

from . import intrinsics
from .jit import LAUNCH
from .ops import GN_EPS, LN_EPS
from .int8 import INT8_BLOCK, PackedInt8, int8_kernel
from .nf4 import PackedNF4, nf4_kernel
from .skinny import kernel_view, skinny_kernel, three_products

V7_DECAY_SCALE = np.float32(0.606531)  # e^-1/2, as blocks.py
prange = range  # numba's where it compiles the kernels below
prefetch_array = None  # intrinsics.py's, where numba is


def matvec(W, x, out):
    """out = W x inside compiled code, for W in any form `linear` multiplies (see below)."""
    raise NotImplementedError("only callable from compiled code")


def matvec3(W1, x1, out1, W2, x2, out2, W3, x3, out3):
    """Three `matvec`s, in one launch where the three matrices are arrays."""
    raise NotImplementedError("only callable from compiled code")


def rows_of(W):
    """W's number of rows (outputs) inside compiled code, whatever its form."""
    raise NotImplementedError("only callable from compiled code")


def layer_norm(x, weight, bias, eps, out):  # pragma: no cover - compiled by numba
    n = x.shape[0]
    mean = np.float32(0.0)
    for i in range(n):
        mean += x[i]
    mean /= n
    var = np.float32(0.0)
    for i in range(n):
        var += (x[i] - mean) * (x[i] - mean)
    scale = np.float32(1.0) / np.sqrt(var / n + np.float32(eps))
    for i in range(n):
        out[i] = (x[i] - mean) * scale * weight[i] + bias[i]

def sigmoid(v):  # pragma: no cover - compiled by numba
    return np.float32(1.0) / (np.float32(1.0) + np.exp(-v))

def wkv(S, r, decay, k, v, a, b, y):  # pragma: no cover - compiled by numba
    """wkv_numba.kernel7 for one token: S [H, N(value), N(key)] updated in place. One view
    per head, indexed inside (a view per row made this 7 times slower: wkv_numba.py)."""
    H, N = S.shape[0], S.shape[1]
    for h in prange(H):
        o = h * N
        Sh, rh, dh, kh, ah, bh = S[h], r[o : o + N], decay[o : o + N], k[o : o + N], a[o : o + N], b[o : o + N]
        for i in range(N):
            sa = np.float32(0.0)
            for j in range(N):
                sa += Sh[i, j] * ah[j]
            vi = v[o + i]
            acc = np.float32(0.0)
            for j in range(N):
                s = Sh[i, j] * dh[j] + sa * bh[j] + vi * kh[j]
                Sh[i, j] = s
                acc += s * rh[j]
            y[o + i] = acc

def layer(x, att_shift, S, ffn_shift, v_first, first,  # pragma: no cover - compiled by numba
          ln1_w, ln1_b, ln2_w, ln2_b, mix, w0, a0, v0, k_k, k_a, r_k, lnx_w, lnx_b, ffn_mix,
          Wr, Wk, Wv, Wo, w1, w2, a1, a2, g1, g2, v1, v2, Fk, Fv):
    """x [C] += time mix, then += channel mix, as Block does; the shift rows, S and (in
    the first layer) v_first are updated in place."""
    C, H, N = x.shape[0], r_k.shape[0], r_k.shape[1]
    f32 = np.float32
    # This layer's vectors and state were last read a token ago, and the weights streamed
    # since have pushed them out of every cache: asked for now, they arrive while the first
    # products run instead of as a cache miss each in the element-wise work between them
    # (12 layers of the 0.1B shape in bf16: 8.1-8.9 → 7.2 ms).
    for vector in (ln1_w, ln1_b, ln2_w, ln2_b, w0, a0, v0, k_k, k_a, lnx_w, lnx_b, ffn_mix, att_shift, ffn_shift):
        prefetch_array(vector)
    prefetch_array(mix)
    prefetch_array(r_k)
    prefetch_array(S)
    z = np.empty(C, dtype=np.float32)
    layer_norm(x, ln1_w, ln1_b, LN_EPS, z)
    # The token shift: the previous token's row, and this one's kept for the next.
    xs = np.empty((6, C), dtype=np.float32)  # x_r, x_w, x_k, x_v, x_a, x_g
    for i in range(C):
        p = att_shift[i]
        for q in range(6):
            xs[q, i] = z[i] + (p - z[i]) * mix[q, i]
        att_shift[i] = z[i]
    r, k, v = np.empty(C, dtype=np.float32), np.empty(C, dtype=np.float32), np.empty(C, dtype=np.float32)
    matvec3(Wr, xs[0], r, Wk, xs[2], k, Wv, xs[3], v)
    # The LoRAs: decay, in-context learning rate, gate, value residual.
    low_w = np.empty(rows_of(w1), dtype=np.float32)
    low_a = np.empty(rows_of(a1), dtype=np.float32)
    low_g = np.empty(rows_of(g1), dtype=np.float32)
    matvec3(w1, xs[1], low_w, a1, xs[4], low_a, g1, xs[5], low_g)
    for i in range(low_w.shape[0]):
        low_w[i] = np.tanh(low_w[i])
    for i in range(low_g.shape[0]):
        low_g[i] = sigmoid(low_g[i])
    log_decay, alpha, g = np.empty(C, dtype=np.float32), np.empty(C, dtype=np.float32), np.empty(C, dtype=np.float32)
    matvec3(w2, low_w, log_decay, a2, low_a, alpha, g2, low_g, g)
    gate = np.empty(C, dtype=np.float32)
    if not first:
        low = np.empty(rows_of(v1), dtype=np.float32)
        matvec(v1, xs[3], low)
        matvec(v2, low, gate)
    decay = np.empty(C, dtype=np.float32)
    a, b = np.empty(C, dtype=np.float32), np.empty(C, dtype=np.float32)
    for i in range(C):
        decay[i] = np.exp(-V7_DECAY_SCALE * sigmoid(w0[i] + log_decay[i]))
        alpha[i] = sigmoid(a0[i] + alpha[i])
        a[i] = k[i] * k_k[i]  # κ, normalised per head below
    for h in range(H):
        norm = f32(0.0)
        for j in range(h * N, h * N + N):
            norm += a[j] * a[j]
        norm = max(np.sqrt(norm), f32(1e-12))
        for j in range(h * N, h * N + N):
            kappa = a[j] / norm
            a[j] = -kappa
            b[j] = kappa * alpha[j]
    for i in range(C):
        k[i] = k[i] * (f32(1.0) + (alpha[i] - f32(1.0)) * k_a[i])  # κ̂ above used the unmodified k
        if first:
            v_first[i] = v[i]
        else:
            v[i] = v[i] + (v_first[i] - v[i]) * sigmoid(v0[i] + gate[i])
    y = np.empty(C, dtype=np.float32)
    wkv(S, r, decay, k, v, a, b, y)
    # The group norm per head, the bonus added after it, the gate, the output product.
    for h in range(H):
        o = h * N
        mean = f32(0.0)
        for j in range(o, o + N):
            mean += y[j]
        mean /= N
        var = f32(0.0)
        for j in range(o, o + N):
            var += (y[j] - mean) * (y[j] - mean)
        scale = f32(1.0) / np.sqrt(var / N + f32(GN_EPS))
        bonus = f32(0.0)
        for j in range(N):
            bonus += r[o + j] * k[o + j] * r_k[h, j]
        for j in range(o, o + N):
            y[j] = (((y[j] - mean) * scale) * lnx_w[j] + lnx_b[j] + bonus * v[j]) * g[j]
    out = np.empty(C, dtype=np.float32)
    matvec(Wo, y, out)
    for i in range(C):
        x[i] += out[i]
    # The channel mix: W_v relu(W_k x_k)².
    layer_norm(x, ln2_w, ln2_b, LN_EPS, z)
    for i in range(C):
        p = ffn_shift[i]
        xs[0, i] = z[i] + (p - z[i]) * ffn_mix[i]
        ffn_shift[i] = z[i]
    hidden = np.empty(rows_of(Fk), dtype=np.float32)
    matvec(Fk, xs[0], hidden)
    for i in range(hidden.shape[0]):
        h = max(hidden[i], f32(0.0))
        hidden[i] = h * h
    matvec(Fv, hidden, out)
    for i in range(C):
        x[i] += out[i]


# Compiled as module-level functions that find each other as globals: numba keys its
# on-disk cache on a function's closure too, and closures over other compiled functions
# pickle differently in every process, so a nested `layer` was compiled again each time.
_tools = intrinsics.build()
if _tools is not None:
    import numba
    from numba.extending import overload

    def _matvec(W, x, out):  # pragma: no cover - compiled by numba
        """The product kernel of W's form, given x and out as single rows: skinny.py's for
        an array (fp32 or 16-bit bit patterns), int8.py's for (q, bounds), nf4.py's for
        (q, absmax, levels)."""
        if isinstance(W, numba.types.Array):
            def product(W, x, out):
                skinny_kernel(W, x.reshape(1, x.shape[0]), out.reshape(1, out.shape[0]))
            return product
        if isinstance(W, numba.types.BaseTuple) and len(W) == 2:
            def product(W, x, out):
                K = x.shape[0]
                xsum = x.reshape(K // INT8_BLOCK, INT8_BLOCK).sum(axis=1)
                int8_kernel(W[0], W[1], x.reshape(1, K), xsum.reshape(1, K // INT8_BLOCK),
                            out.reshape(1, out.shape[0]))
            return product
        if isinstance(W, numba.types.BaseTuple) and len(W) == 3:
            def product(W, x, out):
                half = x.shape[0] // 2
                even, odd = np.empty((1, half), dtype=np.float32), np.empty((1, half), dtype=np.float32)
                for t in range(half):
                    even[0, t], odd[0, t] = x[2 * t], x[2 * t + 1]
                nf4_kernel(W[0], W[1], W[2], even, odd, out.reshape(1, out.shape[0]))
            return product
        return None

    def _matvec3(W1, x1, out1, W2, x2, out2, W3, x3, out3):  # pragma: no cover - compiled by numba
        if all(isinstance(W, numba.types.Array) for W in (W1, W2, W3)):
            def together(W1, x1, out1, W2, x2, out2, W3, x3, out3):
                three_products(W1, x1.reshape(1, x1.shape[0]), out1.reshape(1, out1.shape[0]),
                               W2, x2.reshape(1, x2.shape[0]), out2.reshape(1, out2.shape[0]),
                               W3, x3.reshape(1, x3.shape[0]), out3.reshape(1, out3.shape[0]))
            return together

        def apart(W1, x1, out1, W2, x2, out2, W3, x3, out3):  # a packed form among them
            matvec(W1, x1, out1)
            matvec(W2, x2, out2)
            matvec(W3, x3, out3)
        return apart

    def _rows_of(W):  # pragma: no cover - compiled by numba
        if isinstance(W, numba.types.Array):
            return lambda W: W.shape[0]
        return lambda W: W[0].shape[0]  # the packed forms' bytes, a row per output

    overload(matvec)(_matvec)
    overload(matvec3)(_matvec3)
    overload(rows_of)(_rows_of)
    prange, prefetch_array = _tools.prange, _tools.prefetch_array
    layer_norm = _tools.jit(parallel=False, inline="always")(layer_norm)
    sigmoid = _tools.jit(parallel=False, inline="always")(sigmoid)
    wkv = _tools.jit(wkv)
    _layer = _tools.jit(parallel=False)(layer)  # its products and WKV are the parallel kernels it calls
else:
    _layer = None



class OneRowLayers:
    """Every layer of a v7 CpuModel for a step of one row, a compiled call per layer."""

    def __init__(self, blocks):
        self.weights = [_weights_of(block) for block in blocks]

    @staticmethod
    def of(blocks) -> OneRowLayers | None:
        """The fused layers of a v7 model, or None (no numba, another version, or a matrix
        in a form the kernels do not read)."""
        if _layer is None or not blocks or type(blocks[0].time_mix).__name__ != "TimeMix7":
            return None
        layers = OneRowLayers(blocks)
        return layers if all(w is not None for w in layers.weights) else None

    def __call__(self, x: np.ndarray, layers, plan) -> np.ndarray:
        """x [1, C] through every layer, for the one slot of `plan`; `layers` are the
        pool's LayerSlots per layer."""
        slot = int(plan.slots[0])
        row = np.array(x[0], dtype=np.float32)
        v_first = np.empty_like(row)
        for i, (weights, slots) in enumerate(zip(self.weights, layers)):
            with LAUNCH:
                _layer(row, slots.att_shift[slot], slots.wkv[slot], slots.ffn_shift[slot], v_first, i == 0, *weights)
        return row[None]


def _weights_of(block):
    """The arguments of `layer` after the state, from a built Block; None if a matrix is
    in a form `matvec` does not take."""
    tm, cm = block.time_mix, block.channel_mix
    lora = tm.lora
    matrices = [tm.W["receptance"], tm.W["key"], tm.W["value"], tm.W["output"], lora["w1"], lora["w2"],
                lora["a1"], lora["a2"], lora["g1"], lora["g2"]]
    matrices += [lora["v1"], lora["v2"]] if "v1" in lora else [lora["w1"][:0], lora["w2"][:, :0]]
    matrices += [cm.W["key"], cm.W["value"]]
    forms = [_kernel_form(m) for m in matrices]
    if any(f is None for f in forms):
        return None
    vectors = [*block.ln1, *block.ln2, tm.mix[:, 0, :], tm.w0, tm.a0, tm.w0 if tm.v0 is None else tm.v0, tm.k_k,
               tm.k_a, tm.r_k, *tm.ln_x, cm.mix]
    vectors = [np.array(v, dtype=np.float32) for v in vectors]  # own copies: one compiled type
    return (*vectors, *forms)


def _kernel_form(matrix):
    """What `matvec` takes for a matrix as ops.kernel_form keeps it."""
    if isinstance(matrix, (PackedInt8, PackedNF4)):
        return matrix.form
    if isinstance(matrix, np.ndarray):
        # Read-only: numba compiles a mapped (read-only) and a converted (writable) matrix
        # as two types, and `layer` once per combination it meets.
        view = np.ascontiguousarray(kernel_view(matrix)).view()
        view.flags.writeable = False
        return view
    return None
