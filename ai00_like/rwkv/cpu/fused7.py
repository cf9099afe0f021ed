"""v7's layer for a decoding step (each row the next token of its own slot: batch 1 to
SKINNY_ROWS), each layer in one compiled call.

The same equations as blocks.py's Block, TimeMix7 and ChannelMix7, in the same order and
in fp32, written out row by row. At batch 1 the matrix products read a layer's weights
once and take about three quarters of a token's time; what is left went to some 300
Python-level calls a layer (element-wise numpy operations on 768 numbers, and 14 launches
of the product kernel), about 3 ms of a 15 ms bf16 token on the 0.1B shape. In a batch of
16 the same numpy operations on [16, 768] arrays took a quarter of the step. Here a layer
is one call: its 14 matrix products are the product kernels' parallel loops launched from
inside it, the WKV recurrence runs (row, head) by (row, head) in parallel, and the
element-wise work runs in between on one core, in loops LLVM vectorises (`exp` is
intrinsics.py's, divisions follow numpy's error model). bf16 0.1B batch 16: 34.2 → 28.7
ms a step; batch 4: 17.0 → 13.9 ms.

Each product goes to the kernel of its matrix's form (`matvec`), as ops.linear picks it:
skinny.py's for fp32 and 16-bit weights, int8.py's and nf4.py's for packed blocks (below
PACKED_DIRECT_ROWS rows, batched.py's from there), called from inside the layer. At one
row, products that need nothing from each other share a launch where their matrices are
arrays (`matvec3`: r, k and v; the LoRAs' first products; their second ones), since
starting and ending a launch costs microseconds: 8 launches a layer instead of 14.
Without numba there is no fused layer (`DecodeLayers.of` gives None).
"""

from __future__ import annotations

import numpy as np

from . import intrinsics
from .jit import LAUNCH
from .batched import block_kernel
from .int8 import INT8_BLOCK, PackedInt8, int8_kernel
from .nf4 import PackedNF4, nf4_kernel, x_by_code
from .ops import GN_EPS, LN_EPS, PACKED_DIRECT_ROWS
from .skinny import kernel_view, skinny_kernel, three_products

V7_DECAY_SCALE = np.float32(0.606531)  # e^-1/2, as blocks.py
INT8_DIRECT_ROWS, NF4_DIRECT_ROWS = PACKED_DIRECT_ROWS[PackedInt8], PACKED_DIRECT_ROWS[PackedNF4]
prange = range  # numba's where it compiles the kernels below
prefetch_array = exp = None  # intrinsics.py's, where numba is


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
    return np.float32(1.0) / (np.float32(1.0) + exp(-v))

def wkv(S, slots, r, decay, k, v, a, b, y):  # pragma: no cover - compiled by numba
    """wkv_numba.kernel7 for one token a row: S [B, H, N(value), N(key)], row m's state
    S[slots[m]] updated in place, the rows [M, C] read as [M, H, N]: indexed by the loops'
    own variables, which numba knows are not negative (as a[m, h * N + j] they were
    checked for wrapping around, and the loops ran 8 times slower)."""
    M = r.shape[0]
    H, N = S.shape[1], S.shape[2]
    r3, d3, k3, v3 = r.reshape(M, H, N), decay.reshape(M, H, N), k.reshape(M, H, N), v.reshape(M, H, N)
    a3, b3, y3 = a.reshape(M, H, N), b.reshape(M, H, N), y.reshape(M, H, N)
    for task in prange(M * H):
        m, h = task // H, task % H
        Sh = S[slots[m], h]
        for i in range(N):
            sa = np.float32(0.0)
            for j in range(N):
                sa += Sh[i, j] * a3[m, h, j]
            vi = v3[m, h, i]
            acc = np.float32(0.0)
            for j in range(N):
                s = Sh[i, j] * d3[m, h, j] + sa * b3[m, h, j] + vi * k3[m, h, j]
                Sh[i, j] = s
                acc += s * r3[m, h, j]
            y3[m, h, i] = acc

def layer(x, slots, att_shift, S, ffn_shift, v_first, first,  # pragma: no cover - compiled by numba
          ln1_w, ln1_b, ln2_w, ln2_b, mix, w0, a0, v0, k_k, k_a, r_k, lnx_w, lnx_b, ffn_mix,
          Wr, Wk, Wv, Wo, w1, w2, a1, a2, g1, g2, v1, v2, Fk, Fv):
    """x [M, C] += time mix, then += channel mix, as Block does, row m one token of the
    sequence in slot slots[m]; those slots' shift rows and WKV states ([B, ...]) and, in the
    first layer, v_first [M, C] are updated in place."""
    M, C = x.shape
    H, N = r_k.shape[0], r_k.shape[1]
    f32 = np.float32
    # This layer's vectors and state were last read a token ago, and the weights streamed
    # since have pushed them out of every cache: asked for now, they arrive while the first
    # products run instead of as a cache miss each in the element-wise work between them
    # (12 layers of the 0.1B shape in bf16 at batch 1: 8.1-8.9 → 7.2 ms).
    for vector in (ln1_w, ln1_b, ln2_w, ln2_b, w0, a0, v0, k_k, k_a, lnx_w, lnx_b, ffn_mix):
        prefetch_array(vector)
    prefetch_array(mix)
    prefetch_array(r_k)
    for m in range(M):
        prefetch_array(att_shift[slots[m]])
        prefetch_array(ffn_shift[slots[m]])
    if M == 1:
        prefetch_array(S[slots[0]])
    z = np.empty((M, C), dtype=np.float32)
    for m in range(M):
        layer_norm(x[m], ln1_w, ln1_b, LN_EPS, z[m])
    # The token shift: the previous token's row, and this one's kept for the next.
    xs = np.empty((6, M, C), dtype=np.float32)  # x_r, x_w, x_k, x_v, x_a, x_g
    # (Each element-wise loop touches a few arrays: LLVM vectorises a loop only where it can
    # check at run time that its arrays do not overlap, for up to 8 pairs of them.)
    for m in range(M):
        shift = att_shift[slots[m]]
        for q in range(6):
            for i in range(C):
                xs[q, m, i] = z[m, i] + (shift[i] - z[m, i]) * mix[q, i]
        for i in range(C):
            shift[i] = z[m, i]
    r, k, v = np.empty((M, C), dtype=np.float32), np.empty((M, C), dtype=np.float32), np.empty((M, C), dtype=np.float32)
    matvec3(Wr, xs[0], r, Wk, xs[2], k, Wv, xs[3], v)
    # The LoRAs: decay, in-context learning rate, gate, value residual.
    low_w = np.empty((M, rows_of(w1)), dtype=np.float32)
    low_a = np.empty((M, rows_of(a1)), dtype=np.float32)
    low_g = np.empty((M, rows_of(g1)), dtype=np.float32)
    matvec3(w1, xs[1], low_w, a1, xs[4], low_a, g1, xs[5], low_g)
    for m in range(M):
        for i in range(low_w.shape[1]):
            low_w[m, i] = np.float32(2.0) * sigmoid(np.float32(2.0) * low_w[m, i]) - np.float32(1.0)  # tanh
        for i in range(low_g.shape[1]):
            low_g[m, i] = sigmoid(low_g[m, i])
    log_decay, alpha, g = np.empty((M, C), dtype=np.float32), np.empty((M, C), dtype=np.float32), \
        np.empty((M, C), dtype=np.float32)
    matvec3(w2, low_w, log_decay, a2, low_a, alpha, g2, low_g, g)
    gate = np.empty((M, C), dtype=np.float32)
    if not first:
        low = np.empty((M, rows_of(v1)), dtype=np.float32)
        matvec(v1, xs[3], low)
        matvec(v2, low, gate)
    decay = np.empty((M, C), dtype=np.float32)
    a, b = np.empty((M, C), dtype=np.float32), np.empty((M, C), dtype=np.float32)
    # Per head, as [M, H, N] views indexed by the loops' own variables (see wkv).
    a3, b3, alpha3 = a.reshape(M, H, N), b.reshape(M, H, N), alpha.reshape(M, H, N)
    for m in range(M):
        for i in range(C):
            decay[m, i] = exp(-V7_DECAY_SCALE * sigmoid(w0[i] + log_decay[m, i]))
        for i in range(C):
            alpha[m, i] = sigmoid(a0[i] + alpha[m, i])
        for i in range(C):
            a[m, i] = k[m, i] * k_k[i]  # κ, normalised per head below
        for h in range(H):
            norm = f32(0.0)
            for j in range(N):
                norm += a3[m, h, j] * a3[m, h, j]
            norm = max(np.sqrt(norm), f32(1e-12))
            for j in range(N):
                kappa = a3[m, h, j] / norm
                a3[m, h, j] = -kappa
                b3[m, h, j] = kappa * alpha3[m, h, j]
        for i in range(C):
            k[m, i] = k[m, i] * (f32(1.0) + (alpha[m, i] - f32(1.0)) * k_a[i])  # κ̂ above used the unmodified k
        if first:
            for i in range(C):
                v_first[m, i] = v[m, i]
        else:
            for i in range(C):
                v[m, i] = v[m, i] + (v_first[m, i] - v[m, i]) * sigmoid(v0[i] + gate[m, i])
    y = np.empty((M, C), dtype=np.float32)
    wkv(S, slots, r, decay, k, v, a, b, y)
    # The group norm per head, the bonus added after it, the gate, the output product.
    y3, r3, k3, v3, g3 = y.reshape(M, H, N), r.reshape(M, H, N), k.reshape(M, H, N), v.reshape(M, H, N), \
        g.reshape(M, H, N)
    lnx_w3, lnx_b3 = lnx_w.reshape(H, N), lnx_b.reshape(H, N)
    for m in range(M):
        for h in range(H):
            mean = f32(0.0)
            for j in range(N):
                mean += y3[m, h, j]
            mean /= N
            var = f32(0.0)
            for j in range(N):
                var += (y3[m, h, j] - mean) * (y3[m, h, j] - mean)
            scale = f32(1.0) / np.sqrt(var / N + f32(GN_EPS))
            bonus = f32(0.0)
            for j in range(N):
                bonus += r3[m, h, j] * k3[m, h, j] * r_k[h, j]
            for j in range(N):
                y3[m, h, j] = (((y3[m, h, j] - mean) * scale) * lnx_w3[h, j] + lnx_b3[h, j] + bonus * v3[m, h, j]) \
                    * g3[m, h, j]
    out = np.empty((M, C), dtype=np.float32)
    matvec(Wo, y, out)
    # The channel mix: W_v relu(W_k x_k)².
    for m in range(M):
        for i in range(C):
            x[m, i] += out[m, i]
        layer_norm(x[m], ln2_w, ln2_b, LN_EPS, z[m])
        shift = ffn_shift[slots[m]]
        for i in range(C):
            xs[0, m, i] = z[m, i] + (shift[i] - z[m, i]) * ffn_mix[i]
        for i in range(C):
            shift[i] = z[m, i]
    hidden = np.empty((M, rows_of(Fk)), dtype=np.float32)
    matvec(Fk, xs[0], hidden)
    for m in range(M):
        for i in range(hidden.shape[1]):
            h = max(hidden[m, i], f32(0.0))
            hidden[m, i] = h * h
    matvec(Fv, hidden, out)
    for m in range(M):
        for i in range(C):
            x[m, i] += out[m, i]


# Compiled as module-level functions that find each other as globals: numba keys its
# on-disk cache on a function's closure too, and closures over other compiled functions
# pickle differently in every process, so a nested `layer` was compiled again each time.
_tools = intrinsics.build()
if _tools is not None:
    import numba
    from numba.extending import overload

    def _matvec(W, x, out):  # pragma: no cover - compiled by numba
        """The product kernel of W's form for x and out of M rows, as ops.linear picks it:
        skinny.py's for an array (fp32 or 16-bit bit patterns), int8.py's or nf4.py's for
        (q, bounds) or (q, absmax, levels) below PACKED_DIRECT_ROWS rows, batched.py's from
        there."""
        if isinstance(W, numba.types.Array):
            def product(W, x, out):
                skinny_kernel(W, x, out)
            return product
        if isinstance(W, numba.types.BaseTuple) and len(W) == 2:
            def product(W, x, out):
                M, K = x.shape
                if M >= INT8_DIRECT_ROWS:
                    block_kernel(W, x, out)
                    return
                xsum = np.zeros((M, K // INT8_BLOCK), dtype=np.float32)
                for m in range(M):
                    for i in range(K):
                        xsum[m, i // INT8_BLOCK] += x[m, i]
                int8_kernel(W[0], W[1], x, xsum, out)
            return product
        if isinstance(W, numba.types.BaseTuple) and len(W) == 3:
            def product(W, x, out):
                if x.shape[0] >= NF4_DIRECT_ROWS:
                    block_kernel(W, x, out)
                    return
                nf4_kernel(W[0], W[1], W[2], x_by_code(x), out)
            return product
        return None

    def _matvec3(W1, x1, out1, W2, x2, out2, W3, x3, out3):  # pragma: no cover - compiled by numba
        if all(isinstance(W, numba.types.Array) for W in (W1, W2, W3)):
            def together(W1, x1, out1, W2, x2, out2, W3, x3, out3):
                if x1.shape[0] == 1:
                    three_products(W1, x1, out1, W2, x2, out2, W3, x3, out3)
                else:  # skinny's blocks of rows
                    matvec(W1, x1, out1)
                    matvec(W2, x2, out2)
                    matvec(W3, x3, out3)
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
    prange, prefetch_array, exp = _tools.prange, _tools.prefetch_array, _tools.exp
    # Divisions by zero give inf or nan, as in numpy: numba's default checks each division
    # to raise ZeroDivisionError, and a loop with that branch is not vectorised (a decoding
    # batch's sigmoids 9 times slower).
    element_wise = dict(parallel=False, error_model="numpy")
    layer_norm = _tools.jit(inline="always", **element_wise)(layer_norm)
    sigmoid = _tools.jit(inline="always", **element_wise)(sigmoid)
    wkv = _tools.jit(wkv)
    _layer = _tools.jit(**element_wise)(layer)  # its products and WKV are the parallel kernels it calls
else:
    _layer = None



class DecodeLayers:
    """Every layer of a v7 CpuModel for a decoding step (each row the next token of its own
    slot), a compiled call per layer."""

    def __init__(self, blocks):
        self.weights = [_weights_of(block) for block in blocks]

    @staticmethod
    def of(blocks) -> DecodeLayers | None:
        """The fused layers of a v7 model, or None (no numba, another version, or a matrix
        in a form the kernels do not read)."""
        if _layer is None or not blocks or type(blocks[0].time_mix).__name__ != "TimeMix7":
            return None
        layers = DecodeLayers(blocks)
        return layers if all(w is not None for w in layers.weights) else None

    def __call__(self, x: np.ndarray, layers, plan) -> np.ndarray:
        """x [M, C] through every layer, row m for slot plan.slots[m] (a plan of one token a
        slot); `layers` are the pool's LayerSlots per layer."""
        slots = np.ascontiguousarray(plan.slots, dtype=np.int64)
        rows = np.array(x, dtype=np.float32)
        v_first = np.empty_like(rows)
        for i, (weights, parts) in enumerate(zip(self.weights, layers)):
            with LAUNCH:
                _layer(rows, slots, parts.att_shift, parts.wkv, parts.ffn_shift, v_first, i == 0, *weights)
        return rows


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
        return kernel_view(np.ascontiguousarray(matrix))  # read-only, as the packed forms: one compiled type each
    return None
