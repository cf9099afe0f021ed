"""The compiled v7 layer that fused7.py runs: blocks.py's Block, TimeMix7 and ChannelMix7 for
a decoding step's rows, in the same order and in fp32, written out row by row (`layer`,
`time_mix7`, `channel_mix7`). A row is the next token of its slot; a slot may have a few
consecutive rows (a speculative step's), which the token shift and the WKV take in order.

fused7.py imports this module only where numba is. Its functions are module-level and
find each other as globals: numba keys its on-disk cache on a function's closure too, and
closures over other compiled functions pickle differently in every process, so a nested
layer was compiled again each time.
"""

from __future__ import annotations

import numpy as np
from numba.extending import intrinsic, overload

from ..norms import GN_EPS, LN_EPS
from . import intrinsics
from .batched import block_kernel
from .forms import DENSE, PANEL_KINDS, form_of_type
from .skinny import three_products
from .wkv7_ir import HEAD, wkv7_head_row

_tools = intrinsics.build()
prange, exp, prefetch_array = _tools.prange, _tools.exp, _tools.prefetch_array
head_row = intrinsic(wkv7_head_row)
# Divisions by zero give inf or nan, as in numpy: numba's default checks each division to
# raise ZeroDivisionError, and a loop with that branch is not vectorised (a decoding
# batch's sigmoids 9 times slower).
ELEMENT_WISE = dict(parallel=False, error_model="numpy")
inlined = _tools.jit(inline="always", **ELEMENT_WISE)
V7_DECAY_SCALE = np.float32(0.606531)  # e^-1/2, as blocks.py


def matvec(W, x, out):
    """out = x · Wᵀ inside compiled code, for W in any weight form (forms.py), by its form's
    kernels as ops.linear picks them."""
    raise NotImplementedError("only callable from compiled code")


def matvec3(W1, x1, out1, W2, x2, out2, W3, x3, out3):
    """Three `matvec`s, in one launch where the three matrices are dense: starting and ending
    a launch costs microseconds, and a layer has 14 small products."""
    raise NotImplementedError("only callable from compiled code")


def rows_of(W):
    """W's number of rows (outputs) inside compiled code, whatever its form."""
    raise NotImplementedError("only callable from compiled code")


@overload(matvec)
def _matvec(W, x, out):  # pragma: no cover - compiled by numba
    form = form_of_type(W)
    if form is None:
        return None
    direct, direct_rows = form.direct_kernel, form.direct_rows
    if form.widen_row is None:  # a form that batched.py does not read
        return lambda W, x, out: direct(W, x, out)

    def product(W, x, out):
        if x.shape[0] >= direct_rows:
            block_kernel(W, x, out)
        else:
            direct(W, x, out)
    return product


@overload(matvec3)
def _matvec3(W1, x1, out1, W2, x2, out2, W3, x3, out3):  # pragma: no cover - compiled by numba
    if all(form_of_type(W) is DENSE for W in (W1, W2, W3)):
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


@overload(rows_of)
def _rows_of(W):  # pragma: no cover - compiled by numba
    if form_of_type(W) is DENSE:
        return lambda W: W.shape[0]
    if issubclass(form_of_type(W).kind, PANEL_KINDS):  # its bytes in panels of rows
        return lambda W: W.rows
    return lambda W: W.q.shape[0]  # a packed form's bytes, a row per output (weight_form.py)


@inlined
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


@_tools.jit(error_model="numpy")
def rows_layer_norm(x, weight, bias, eps):  # pragma: no cover - compiled by numba
    """layer_norm of each row of a prompt's chunk x [M, C], on the cores: the decoding layer's
    own norm, row by row (numpy's took 4.6 ms of [512, 2,048] a call)."""
    out = np.empty_like(x)
    for m in prange(x.shape[0]):
        layer_norm(x[m], weight, bias, eps, out[m])
    return out


@_tools.jit(error_model="numpy")
def rows_mixed(z, delta, mu):  # pragma: no cover - compiled by numba
    """z + delta · mu of a prompt's chunk [M, C] (a token mix, delta = p − z), on the cores in
    one pass: numpy's two passes and a temporary took 1.3 ms of [512, 2,048] a mix."""
    out = np.empty_like(z)
    for m in prange(z.shape[0]):
        for i in range(z.shape[1]):
            out[m, i] = z[m, i] + delta[m, i] * mu[i]
    return out


@_tools.jit(error_model="numpy")
def rows_relu_squared(hidden):  # pragma: no cover - compiled by numba
    """hidden ← max(hidden, 0)² in place, on the cores in one pass (the channel mix's)."""
    for m in prange(hidden.shape[0]):
        for i in range(hidden.shape[1]):
            value = max(hidden[m, i], np.float32(0.0))
            hidden[m, i] = value * value


@inlined
def sigmoid(v):  # pragma: no cover - compiled by numba
    return np.float32(1.0) / (np.float32(1.0) + exp(-v))


@inlined
def empty_rows(M, C):  # pragma: no cover - compiled by numba
    return np.empty((M, C), dtype=np.float32)


@_tools.jit
def wkv(S, slots, r, decay, k, v, a, b, y):  # pragma: no cover - compiled by numba
    """v7's recurrence, S ← S·(diag(decay) + a bᵀ) + v kᵀ and y = S r (a = −κ̂, b = κ̂⊙α,
    k = k'), in the reference's order of operations: S [B, H, N(value), N(key)], row m's
    state S[slots[m]] updated in place, each (run, head) a task whose state stays in the
    core's cache while its rows stream through. The rows [M, C] are read as [M, H, N],
    indexed by the loops' own variables, which numba knows are not negative (as
    a[m, h * N + j] they were checked for wrapping around, and the loops ran 8 times
    slower). Consecutive rows of one slot (a prompt's, a speculative step's tokens) go in
    order, each from the state the one before left."""
    M = r.shape[0]
    H, N = S.shape[1], S.shape[2]
    r3, d3, k3, v3 = r.reshape(M, H, N), decay.reshape(M, H, N), k.reshape(M, H, N), v.reshape(M, H, N)
    a3, b3, y3 = a.reshape(M, H, N), b.reshape(M, H, N), y.reshape(M, H, N)
    starts = np.empty(M + 1, dtype=np.int64)  # the first row of each run of one slot's rows
    runs = 0
    for m in range(M):
        if m == 0 or slots[m] != slots[m - 1]:
            starts[runs] = m
            runs += 1
    starts[runs] = M
    for task in prange(runs * H):
        run, h = task // H, task % H
        Sh = S[slots[starts[run]], h]
        for m in range(starts[run], starts[run + 1]):
            if N == HEAD:
                head_row(Sh, (r, decay, k, v, a, b), y, m, h)
                continue
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


@inlined
def token_shift(z, slots, shift_state, mix):  # pragma: no cover - compiled by numba
    """x_q = z + (p − z)·μ_q for each row of mix [Q, C], p the slot's previous token's row
    (ops.token_shift), which the slot then replaces by this one's. (Each element-wise loop
    touches a few arrays: LLVM vectorises a loop only where it can check at run time that
    its arrays do not overlap, for up to 8 pairs of them.)"""
    M, C = z.shape
    xs = np.empty((mix.shape[0], M, C), dtype=np.float32)
    for m in range(M):
        shift = shift_state[slots[m]]
        for q in range(mix.shape[0]):
            for i in range(C):
                xs[q, m, i] = z[m, i] + (shift[i] - z[m, i]) * mix[q, i]
        for i in range(C):
            shift[i] = z[m, i]
    return xs


@inlined
def loras(tm, xs, first):  # pragma: no cover - compiled by numba
    """The LoRAs of x_w, x_a, x_g and x_v: the decay's (tanh inside), the in-context
    learning rate's, the gate's (sigmoid inside) and, after the first layer, the value
    residual's; each as it is before the sums and activations TimeMix7 adds."""
    M, C = xs.shape[1], xs.shape[2]
    low_w, low_a, low_g = empty_rows(M, rows_of(tm.w1)), empty_rows(M, rows_of(tm.a1)), empty_rows(M, rows_of(tm.g1))
    matvec3(tm.w1, xs[1], low_w, tm.a1, xs[4], low_a, tm.g1, xs[5], low_g)
    for m in range(M):
        for i in range(low_w.shape[1]):
            low_w[m, i] = np.float32(2.0) * sigmoid(np.float32(2.0) * low_w[m, i]) - np.float32(1.0)  # tanh
        for i in range(low_g.shape[1]):
            low_g[m, i] = sigmoid(low_g[m, i])
    log_decay, alpha, g, gate = empty_rows(M, C), empty_rows(M, C), empty_rows(M, C), empty_rows(M, C)
    matvec3(tm.w2, low_w, log_decay, tm.a2, low_a, alpha, tm.g2, low_g, g)
    if not first:
        low = empty_rows(M, rows_of(tm.v1))
        matvec(tm.v1, xs[3], low)
        matvec(tm.v2, low, gate)
    return log_decay, alpha, g, gate


@inlined
def wkv_inputs(tm, k, v, v_first, first, log_decay, alpha, gate):  # pragma: no cover - compiled by numba
    """The decay, the in-context learning rate α, the removal key a = −κ̂ and the
    replacement b = κ̂·α of the WKV update; k becomes k' and v the residual-mixed value (the
    first layer's is kept in v_first). alpha is overwritten."""
    M, C = k.shape
    H, N = tm.r_k.shape[0], tm.r_k.shape[1]
    decay, a, b = empty_rows(M, C), empty_rows(M, C), empty_rows(M, C)
    # Per head, as [M, H, N] views indexed by the loops' own variables (see wkv).
    a3, b3, alpha3 = a.reshape(M, H, N), b.reshape(M, H, N), alpha.reshape(M, H, N)
    for m in prange(M):  # on the cores in chunk_heads (a prompt's rows), in turn in a decoding layer
        for i in range(C):
            decay[m, i] = exp(-V7_DECAY_SCALE * sigmoid(tm.w0[i] + log_decay[m, i]))
        for i in range(C):
            alpha[m, i] = sigmoid(tm.a0[i] + alpha[m, i])
        for i in range(C):
            a[m, i] = k[m, i] * tm.k_k[i]  # κ, normalised per head below
        for h in range(H):
            norm = np.float32(0.0)
            for j in range(N):
                norm += a3[m, h, j] * a3[m, h, j]
            norm = max(np.sqrt(norm), np.float32(1e-12))
            for j in range(N):
                kappa = a3[m, h, j] / norm
                a3[m, h, j] = -kappa
                b3[m, h, j] = kappa * alpha3[m, h, j]
        for i in range(C):
            k[m, i] = k[m, i] * (np.float32(1.0) + (alpha[m, i] - np.float32(1.0)) * tm.k_a[i])  # κ̂ used the old k
        if first:
            for i in range(C):
                v_first[m, i] = v[m, i]
        else:
            for i in range(C):
                v[m, i] = v[m, i] + (v_first[m, i] - v[m, i]) * sigmoid(tm.v0[i] + gate[m, i])
    return decay, a, b


@inlined
def gated_heads(tm, y, r, k, v, g):  # pragma: no cover - compiled by numba
    """y ← (GroupNorm(y) + (Σ r·k·r_k)·v) · g per head, in place: the bonus added after the norm."""
    M, C = y.shape
    H, N = tm.r_k.shape[0], tm.r_k.shape[1]
    y3, r3, k3, v3, g3 = y.reshape(M, H, N), r.reshape(M, H, N), k.reshape(M, H, N), v.reshape(M, H, N), \
        g.reshape(M, H, N)
    lnx_w3, lnx_b3, r_k = tm.lnx_w.reshape(H, N), tm.lnx_b.reshape(H, N), tm.r_k
    for m in prange(M):  # as wkv_inputs
        for h in range(H):
            mean = np.float32(0.0)
            for j in range(N):
                mean += y3[m, h, j]
            mean /= N
            var = np.float32(0.0)
            for j in range(N):
                var += (y3[m, h, j] - mean) * (y3[m, h, j] - mean)
            scale = np.float32(1.0) / np.sqrt(var / N + np.float32(GN_EPS))
            bonus = np.float32(0.0)
            for j in range(N):
                bonus += r3[m, h, j] * k3[m, h, j] * r_k[h, j]
            for j in range(N):
                y3[m, h, j] = (((y3[m, h, j] - mean) * scale) * lnx_w3[h, j] + lnx_b3[h, j] + bonus * v3[m, h, j]) \
                    * g3[m, h, j]


@inlined
def mixed_heads(tm, rows, v_first, first, S, slots):  # pragma: no cover - compiled by numba
    """TimeMix7 from its products' outputs to what its output matrix multiplies: the WKV's
    inputs, the recurrence and the gated heads. tm: blocks.HeadWeights; `rows` are
    blocks.HeadRows' (r, k, v, g and the decay's, α's and the value residual's LoRA
    outputs); k, v and α's are overwritten."""
    r, k, v, g, log_decay, alpha, gate = rows
    decay, a, b = wkv_inputs(tm, k, v, v_first, first, log_decay, alpha, gate)
    y = empty_rows(r.shape[0], r.shape[1])
    wkv(S, slots, r, decay, k, v, a, b, y)
    gated_heads(tm, y, r, k, v, g)
    return y


@_tools.jit(error_model="numpy")
def chunk_heads(tm, rows, v_first, first, S, slots):  # pragma: no cover - compiled by numba
    """`mixed_heads` for a prompt's chunk, whose products blocks.TimeMix7 leaves to BLAS: its
    rows' element-wise work on the cores (prange, inlined here; at 1.5B, 512 rows took
    10 ms a layer in one thread)."""
    return mixed_heads(tm, rows, v_first, first, S, slots)


@inlined
def time_mix7(z, slots, att_shift, S, v_first, first, tm):  # pragma: no cover - compiled by numba
    """blocks.TimeMix7 of the rows z [M, C] (layer-normed), row m in slot slots[m]."""
    M, C = z.shape
    xs = token_shift(z, slots, att_shift, tm.mix)  # x_r, x_w, x_k, x_v, x_a, x_g
    r, k, v = empty_rows(M, C), empty_rows(M, C), empty_rows(M, C)
    matvec3(tm.Wr, xs[0], r, tm.Wk, xs[2], k, tm.Wv, xs[3], v)
    log_decay, alpha, g, gate = loras(tm, xs, first)
    y = mixed_heads(tm.heads, (r, k, v, g, log_decay, alpha, gate), v_first, first, S, slots)
    out = empty_rows(M, C)
    matvec(tm.Wo, y, out)
    return out


@inlined
def channel_mix7(z, slots, ffn_shift, cm):  # pragma: no cover - compiled by numba
    """blocks.ChannelMix7: W_v relu(W_k x_k)², x_k = z + (p − z)·μ."""
    M = z.shape[0]
    xk = token_shift(z, slots, ffn_shift, cm.mix)
    hidden = empty_rows(M, rows_of(cm.Wk))
    matvec(cm.Wk, xk[0], hidden)
    for m in range(M):
        for i in range(hidden.shape[1]):
            h = max(hidden[m, i], np.float32(0.0))
            hidden[m, i] = h * h
    out = empty_rows(M, z.shape[1])
    matvec(cm.Wv, hidden, out)
    return out


@inlined
def prefetch_layer(block, state):  # pragma: no cover - compiled by numba
    """Ask for this layer's vectors and the slots' state now. They were last read a token
    ago, and the weights streamed since have pushed them out of every cache: asked for now,
    they arrive while the first products run instead of as a cache miss each in the
    element-wise work between them (12 layers of the 0.1B shape in bf16 at batch 1:
    8.1-8.9 → 7.2 ms)."""
    tm, cm = block.time_mix, block.channel_mix
    hw = tm.heads
    for vector in (block.ln1_w, block.ln1_b, block.ln2_w, block.ln2_b, hw.w0, hw.a0, hw.v0, hw.k_k, hw.k_a,
                   hw.lnx_w, hw.lnx_b):
        prefetch_array(vector)
    prefetch_array(tm.mix)
    prefetch_array(cm.mix)
    prefetch_array(hw.r_k)
    for m in range(state.slots.shape[0]):
        prefetch_array(state.att_shift[state.slots[m]])
        prefetch_array(state.ffn_shift[state.slots[m]])
    if state.slots.shape[0] == 1:
        prefetch_array(state.wkv[state.slots[0]])


@_tools.jit(**ELEMENT_WISE)  # its products and WKV are the parallel kernels it calls
def layer(x, state, v_first, first, block):  # pragma: no cover - compiled by numba
    """blocks.Block: x [M, C] += time mix, then += channel mix, row m one token of the
    sequence in slot state.slots[m]; those slots' shift rows and WKV states and, in the
    first layer, v_first [M, C] are updated in place."""
    prefetch_layer(block, state)
    M, C = x.shape
    z = empty_rows(M, C)
    for m in range(M):
        layer_norm(x[m], block.ln1_w, block.ln1_b, LN_EPS, z[m])
    out = time_mix7(z, state.slots, state.att_shift, state.wkv, v_first, first, block.time_mix)
    for m in range(M):
        for i in range(C):
            x[m, i] += out[m, i]
        layer_norm(x[m], block.ln2_w, block.ln2_b, LN_EPS, z[m])
    out = channel_mix7(z, state.slots, state.ffn_shift, block.channel_mix)
    for m in range(M):
        for i in range(C):
            x[m, i] += out[m, i]
