"""Int8 and NF4 projections kept packed on the CPU (rwkv/cpu/int8.py, nf4.py, batched.py):
the products equal those of the dequantised weights, for a decoding batch (the direct
kernels below PACKED_DIRECT_ROWS rows, the block kernel of batched.py from there) and a
prefill chunk (tiles widened for BLAS)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from ai00_like.rwkv.cpu import ops
from ai00_like.rwkv.cpu.int8 import PackedInt8, int8_matmul
from ai00_like.rwkv.cpu.nf4 import PackedNF4
from ai00_like.rwkv.quant import NF4_LEVELS, QuantisedMatrix

pytestmark = pytest.mark.skipif(int8_matmul is None, reason="needs numba")

# Bytes a packed weight costs, scales included, against fp32's 4: 1 + 4/128·2 and 1/2 + 4/64.
PACKED = {"int8": (PackedInt8, 0.3), "nf4": (PackedNF4, 0.16)}


@pytest.mark.parametrize("rows", [1, 3, 4, 7, 8, 16, 65, 300])
@pytest.mark.parametrize("kind,shape", [(kind, shape) for kind in ("int8", "nf4") for shape in ((256, 128), (1000, 384), (128, 1024))]
                         + [("nf4", (64, 320))])  # 5 NF4 blocks: AVX-512 reads two a vector
def test_packed_products_equal_the_dequantised_ones(kind, shape, rows, monkeypatch):
    monkeypatch.setattr(ops, "TILE_ROWS", 96)  # several tiles, the last one short
    rng = np.random.default_rng(rows)
    matrix = QuantisedMatrix.of(kind, rng.standard_normal(shape, dtype=np.float32))
    packed = ops.kernel_form(matrix)
    form, share = PACKED[kind]
    assert isinstance(packed, form) and packed.shape == shape and packed.nbytes < share * matrix.size * 4
    x = rng.standard_normal((rows, shape[1]), dtype=np.float32)
    want = x.astype(np.float64) @ np.asarray(matrix, dtype=np.float64).T
    got = ops.linear(x, packed)
    assert got.shape == want.shape and got.dtype == np.float32
    assert np.abs(got - want).max() < 1e-4 * np.abs(want).max()


def test_what_the_kernels_cannot_read_is_dequantised():
    rng = np.random.default_rng(0)
    for kind, shape in [("int8", (64, 96)), ("nf4", (64, 96))]:  # rows that are not whole blocks
        matrix = QuantisedMatrix.of(kind, rng.standard_normal(shape, dtype=np.float32))
        form = ops.kernel_form(matrix)
        assert isinstance(form, np.ndarray) and form.dtype == np.float32
        np.testing.assert_array_equal(form, np.asarray(matrix))


def run_both_kernels(kind: str, rows: int, seed: int = 0, cols: int = 640):
    """A packed matrix of 37 × `cols` times `rows` rows of x through the vector kernel and
    the scalar one."""
    from ai00_like.rwkv.cpu import int8, nf4

    rng = np.random.default_rng(seed + rows)
    matrix = QuantisedMatrix.of(kind, rng.standard_normal((37, cols), dtype=np.float32))
    x = rng.standard_normal((rows, cols), dtype=np.float32)
    if kind == "nf4":
        packed = PackedNF4.of(matrix)
        args = (packed.q, packed.absmax, NF4_LEVELS, nf4.x_by_code(x))
        kernels = (nf4.nf4_kernel, nf4.nf4_scalar_kernel)
    else:
        packed = PackedInt8.of(matrix)
        args = (packed.q, packed.bounds, x, x.reshape(rows, -1, 128).sum(axis=2))
        kernels = (int8.int8_kernel, int8.int8_scalar_kernel)
    outs = []
    for kernel in kernels:
        out = np.full((rows, 37), np.nan, dtype=np.float32)
        kernel(*args, out)
        outs.append(out)
    return outs, kernels


@pytest.mark.parametrize("kind,cols", [("int8", 640), ("nf4", 640), ("nf4", 704), ("nf4", 64)])
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5, 6, 7, 8, 9, 11, 16, 19])
def test_the_vector_kernels_equal_the_scalar_ones(kind, cols, rows):
    """The products as explicit vector code (vector_dots.py, where the CPU has AVX2 or
    AVX-512) give the scalar kernels' results, which CPUs without them run. (NF4 with
    AVX-512 reads two blocks a vector: 704 inputs end on a block of its own.)"""
    from ai00_like.rwkv.cpu import vector_dots

    (vector, scalar), kernels = run_both_kernels(kind, rows, cols=cols)
    if vector_dots.vector_width():
        assert kernels[0] is not kernels[1]
    assert np.isfinite(vector).all()
    np.testing.assert_allclose(vector, scalar, rtol=1e-5, atol=1e-5 * np.abs(scalar).max())


@pytest.mark.parametrize("kind,cols", [("int8", 7168), ("nf4", 7168), ("nf4", 7232)])
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 5])
def test_long_rows_of_x_are_read_once_for_four_weight_rows(kind, cols, rows):
    """Up to 4 rows of x longer than ROW_X_BYTES (a 1.5B model's FFN value matrix takes
    7,168 inputs) go through the vector code for four weight rows (37 end on a block of
    one); 5 rows through the code for one weight row."""
    from ai00_like.rwkv.cpu.skinny import ROW_X_BYTES

    assert 7168 * 4 > ROW_X_BYTES
    (vector, scalar), _ = run_both_kernels(kind, rows, cols=cols)
    assert np.isfinite(vector).all()
    np.testing.assert_allclose(vector, scalar, rtol=1e-5, atol=1e-5 * np.abs(scalar).max())


@pytest.mark.parametrize("kind", ["int8", "nf4"])
@pytest.mark.parametrize("rows", [4, 5, 16, 19, 64])
def test_the_block_kernel_equals_the_direct_scalar_one(kind, rows):
    """A decoding batch's kernel (batched.py): each 4 weight rows widened once, then
    multiplied 4 rows of x at a time (37 weight rows end on a block of one)."""
    from ai00_like.rwkv.cpu.batched import batched_matmul

    (_, scalar), _ = run_both_kernels(kind, rows)
    rng = np.random.default_rng(rows)  # run_both_kernels' matrix and x again
    matrix = QuantisedMatrix.of(kind, rng.standard_normal((37, 640), dtype=np.float32))
    x = rng.standard_normal((rows, 640), dtype=np.float32)
    block = batched_matmul(x, ops.kernel_form(matrix))
    assert np.isfinite(block).all()
    np.testing.assert_allclose(block, scalar, rtol=1e-5, atol=1e-5 * np.abs(scalar).max())
    if rows >= ops.PACKED_DIRECT_ROWS[type(ops.kernel_form(matrix))]:
        np.testing.assert_array_equal(ops.linear(x, ops.kernel_form(matrix)), block)  # what such a batch runs
    # The blocks are shared out in tasks, each widening into a scratch of its own: the same
    # numbers on one thread, and for a matrix of fewer blocks than threads.
    import numba

    before = numba.get_num_threads()
    numba.set_num_threads(1)
    try:
        np.testing.assert_array_equal(batched_matmul(x, ops.kernel_form(matrix)), block)
    finally:
        numba.set_num_threads(before)
    small = QuantisedMatrix.of(kind, rng.standard_normal((3, 640), dtype=np.float32))
    np.testing.assert_allclose(batched_matmul(x, ops.kernel_form(small)), x @ np.asarray(small).T,
                               rtol=1e-5, atol=1e-5 * np.abs(scalar).max())


def widened_nf4_rows_equal_the_dequantised_matrix() -> None:
    """NF4 rows widened to fp32 (vector_dots.nf4_row where the CPU has AVX2 or AVX-512) are
    exactly the numbers quant.py's dequantisation gives."""
    from ai00_like.rwkv.cpu.nf4 import nf4_rows

    matrix = QuantisedMatrix.of("nf4", np.random.default_rng(3).standard_normal((37, 640), dtype=np.float32))
    out = np.full((37, 640), np.nan, dtype=np.float32)
    np.testing.assert_array_equal(nf4_rows(PackedNF4.of(matrix), 0, out), np.asarray(matrix))
    part = np.full((5, 640), np.nan, dtype=np.float32)
    np.testing.assert_array_equal(nf4_rows(PackedNF4.of(matrix), 30, part), np.asarray(matrix)[30:35])


def test_widened_nf4_rows_equal_the_dequantised_matrix():
    widened_nf4_rows_equal_the_dequantised_matrix()


AVX2_ONLY = "+avx2,+fma,+f16c,+avx,+sse4.2,+popcnt,+bmi,+bmi2,+lzcnt,+movbe,-avx512f"


def run_compiled_for(tmp_path: Path, cpu: str, features: str, code: str) -> str:
    """`code` run by a Python whose numba compiles for `cpu` with `features` (in a kernel
    cache of its own): what it printed, once it exited 0."""
    script = tmp_path / "for_another_cpu.py"
    script.write_text(code)
    env = {**os.environ, "NUMBA_CPU_NAME": cpu, "NUMBA_CPU_FEATURES": features, "NUMBA_CACHE_DIR": str(tmp_path / "numba")}
    ran = subprocess.run([sys.executable, str(script)], capture_output=True, text=True, env=env, timeout=600)
    assert ran.returncode == 0, ran.stderr[-2000:]
    return ran.stdout


def test_the_avx2_kernels_equal_the_scalar_ones_too(tmp_path):
    """Compiled for an AVX2 CPU without AVX-512 (most desktop CPUs; NF4's lookup then is
    byte shuffles, and x another order, and a decoding batch's blocks 3 × 4): run where
    numba compiles for such a CPU."""
    from ai00_like.rwkv.cpu import vector_dots

    if vector_dots.vector_width() != 16:
        pytest.skip("the host has no AVX-512: the default kernels are the AVX2 ones already")
    printed = run_compiled_for(tmp_path, "haswell", AVX2_ONLY,
        "import numpy as np, sys\n"
        f"sys.path.insert(0, {str(Path(__file__).parent)!r})\n"
        "from ai00_like.rwkv.cpu import vector_dots\n"
        "from test_packed_weights import run_both_kernels, widened_nf4_rows_equal_the_dequantised_matrix\n"
        "assert vector_dots.vector_width() == 8\n"
        "widened_nf4_rows_equal_the_dequantised_matrix()\n"
        "for kind in ('int8', 'nf4'):\n"
        "    for rows, cols in ((1, 640), (2, 640), (3, 640), (4, 640), (5, 640), (6, 640), (7, 640), (8, 640),\n"
        "                       (9, 640), (16, 640), (1, 7168), (3, 7168)) + ((1, 704), (2, 64)) * (kind == 'nf4'):\n"
        "        (a, b), _ = run_both_kernels(kind, rows, cols=cols)\n"
        "        assert np.abs(a - b).max() <= 1e-5 * np.abs(b).max(), (kind, rows, cols)\n"
        "from ai00_like.rwkv.cpu import skinny\n"
        "assert skinny.BLOCK_ROWS == 3\n"
        "rng = np.random.default_rng(3)\n"
        "for W in (rng.standard_normal((40, 256), dtype=np.float32), rng.standard_normal((40, 256)).astype(np.float16)):\n"
        "    x = rng.standard_normal((16, 256), dtype=np.float32)\n"
        "    full = skinny.skinny_matmul(x, W)\n"
        "    assert np.abs(full - x.astype(np.float64) @ W.astype(np.float64).T).max() < 1e-4\n"
        "    for rows in (2, 3, 5, 7):\n"
        "        assert (skinny.skinny_matmul(x[:rows], W) == full[:rows]).all(), rows\n"
        "print('same')\n")
    assert "same" in printed


AVX512 = "+avx512f,+avx512bw,+avx512vl,+avx512dq," + AVX2_ONLY.replace(",-avx512f", "")


def test_the_avx512_kernels_compile_where_the_host_cannot_run_them(tmp_path):
    """The other way round: on a host without AVX-512 the AVX-512 forms of the packed kernels,
    of the decoding batch's blocks (4 × 4 there, 3 × 4 with AVX2) and the products of Int8
    and NF4 in panels are at least compiled (not run: the host would fault), so a change to the code
    they share with the AVX2 forms cannot leave them unbuildable unnoticed."""
    from ai00_like.rwkv.cpu import vector_dots

    if vector_dots.vector_width() == 16:
        pytest.skip("the host has AVX-512: the other tests run these kernels")
    printed = run_compiled_for(tmp_path, "skylake-avx512", AVX512,
        "import numpy as np\n"
        "from numba import typeof\n"
        "from ai00_like.rwkv.cpu import int8, nf4, vector_dots\n"
        "assert vector_dots.vector_width() == 16\n"
        "q, scales, levels = np.zeros((8, 352), np.uint8), np.zeros((8, 11), np.uint16), nf4.NF4_LEVELS\n"
        "for rows in (1, 2, 3, 4, 5, 8, 9):\n"
        "    x, out = np.zeros((rows, 704), np.float32), np.zeros((rows, 8), np.float32)\n"
        "    nf4.nf4_kernel.compile(tuple(typeof(v) for v in (q, scales, levels, x, out)))\n"
        "nf4.dequantise.compile(tuple(typeof(v) for v in (q, scales, levels, np.zeros((8, 704), np.float32))))\n"
        "from ai00_like.rwkv.cpu import batched, skinny\n"
        "assert skinny.BLOCK_ROWS == 4\n"
        "packed = nf4.PackedNF4(q, scales, levels)\n"
        "for rows in (2, 4, 7, 16):\n"
        "    x, out = np.zeros((rows, 704), np.float32), np.zeros((rows, 8), np.float32)\n"
        "    for W in (np.zeros((8, 704), np.float32), np.zeros((8, 704), np.int16), np.zeros((8, 704), np.uint16)):\n"
        "        skinny.skinny.compile(tuple(typeof(v) for v in (W, x, out)))\n"
        "    batched.block_kernel.compile(tuple(typeof(v) for v in (packed, x, out)))\n"
        "from ai00_like.rwkv.cpu import panel_int8, panels\n"
        "assert panels.available()\n"
        "w = panel_int8.PanelInt8.of(int8.PackedInt8(np.zeros((8, 256), np.uint8), np.zeros((8, 4), np.uint16)))\n"
        "x, out = np.zeros((3, 256), np.float32), np.zeros((3, 8), np.float32)\n"
        "panel_int8._entry.compile(tuple(typeof(v) for v in (w, x, out)))\n"
        "from ai00_like.rwkv.cpu import panel_nf4\n"
        "w = panel_nf4.PanelNF4.of(nf4.PackedNF4(np.zeros((8, 128), np.uint8), np.zeros((8, 4), np.uint16)))\n"
        "panel_nf4._entry.compile(tuple(typeof(v) for v in (w, x, out)))\n"
        "print('compiled')\n")
    assert "compiled" in printed
