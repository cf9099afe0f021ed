"""The packed kernels' dot products as explicit vector code (LLVM IR through numba).

Written as scalar loops (int8.py's and nf4.py's fallbacks), these products run below what
the CPU can do, each for its own reason:

* NF4: a weight is L[c] · absmax for a 4-bit code c. `L[c]` is a memory load per weight,
  which LLVM vectorises (if at all) as a gather: the kernel spends its time looking
  weights up, not reading them (5 billion weights a second on one core, against 11 for
  Int8). A vector CPU indexes a 16-entry table faster with a permute of a register that
  holds it: with AVX-512 one `vpermps` of 16 floats looks up 16 codes (15–20 billion).
  The codes are read as the 32-bit words quant.py packs them in, eight to a word, and
  code c of every lane is a shift away (nf4.py). AVX2's `vpermps` holds 8 floats, and
  two of them and a blend a lookup ran at 5.5 billion on a Zen 3 core: a block of 64
  codes is looked up instead with byte shuffles (`vpshufb`), one for each byte of the
  levels, 32 codes a shuffle, and unpacks that join each level's bytes (9–10 billion).
* Int8: a weight is low + step · q for a byte q; the bytes are widened to floats a vector
  at a time (`vpmovzxbd`, `vcvtdq2ps`) and multiplied with x in the same registers.

`nf4_row` widens a row of NF4 weights to fp32 the same way, 16 or 8 codes a permute, for
the kernels that multiply widened rows (nf4.py: a decoding batch's block kernel, prefill's
tiles).

`nf4(rows, weight_rows=1)` and `int8(rows, weight_rows=1)` give intrinsics, callable from
numba-compiled code, that compute for weight rows i… and `rows` consecutive rows j… of x

    NF4:  out[j + r, i] = Σ_chunks Σ_c L[code of lane, vector c] · x[j + r, chunk's vector c] · absmax
          (x as nf4.x_by_code arranges it, each lane scaled by its block's absmax)
    Int8: out[j + r, i] = Σ_b (step_b · Σ_k q_k · x[j + r, k] + low_b · xsum[j + r, b])

(with several weight rows, the same for each i + a), each widened vector of weights
serving all `rows` rows of x and each vector of x all the weight rows. The arithmetic is the scalar kernels', fp32 multiply-adds of the same
weights and activations, summed in another order.

`build()` is None where the CPU has neither AVX-512 nor AVX2 with FMA, or without numba;
int8.py and nf4.py then keep their scalar loops.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

from .jit import compiler

class Kernels(NamedTuple):
    nf4: Any  # (rows, weight_rows=1) → intrinsic(q, absmax, levels, x, i, j, out)
    int8: Any  # (rows, weight_rows=1) → intrinsic(q, bounds, x, xsum, i, j, out)
    nf4_row: Any  # intrinsic(q, absmax, levels, i, out, r): out[r] = row i widened to fp32
    block: Any  # intrinsic(W, w, x, j, out, n, P, ahead, lo, span): block_rows × 4 products
    block_tails: Any  # the same for the rows of x past the last 4: block_rows × 1, × 2 and × 3
    block_rows: int  # weight rows of a block: 4 with AVX-512, 3 with AVX2


def cpu_features() -> dict:
    """The features of the CPU numba compiles for: this machine's, unless
    NUMBA_CPU_FEATURES names others (numba then compiles for those, e.g. a release built
    for older CPUs, or the AVX2 test); empty without numba."""
    try:
        from llvmlite import binding
        from numba.core import config
    except ImportError:
        return {}
    if config.CPU_FEATURES:
        return {f[1:]: f[0] == "+" for f in config.CPU_FEATURES.split(",") if f[:1] in "+-" and f[1:]}
    return dict(binding.get_host_cpu_features())


def vector_width() -> int:
    """Codes looked up per permute on the CPU numba compiles for: 16 (AVX-512), 8 (AVX2
    with FMA) or 0."""
    features = cpu_features()
    if features.get("avx512f"):
        return 16
    if features.get("avx2") and features.get("fma"):
        return 8
    return 0


@functools.cache
def build():
    """The intrinsics' factories for this CPU, or None."""
    width = vector_width()
    if compiler() is None or width == 0:
        return None
    from numba.extending import intrinsic

    from . import llvm_ir  # needs numba, configured by compiler() above

    @functools.cache
    def nf4(rows: int, weight_rows: int = 1):
        return intrinsic(llvm_ir.nf4_dot(width, rows, weight_rows))

    @functools.cache
    def int8(rows: int, weight_rows: int = 1):
        return intrinsic(llvm_ir.int8_dot(width, rows, weight_rows))

    block_rows = 4 if width == 16 else 3
    block, *tails = (intrinsic(llvm_ir.block(width, block_rows, x_rows)) for x_rows in (4, 1, 2, 3))
    return Kernels(nf4, int8, intrinsic(llvm_ir.nf4_row(width)), block, tuple(tails), block_rows)
