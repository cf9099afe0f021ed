#!/usr/bin/env bash
# The GPU checks of issue 37 in one run on a lent NVIDIA machine (the `device` tool), whose
# image has torch with CUDA, numba and numpy but not wgpu, msgspec, rwkv nor the Vulkan
# loader. Carried beside the tree (both ignored by git; bench/gpu_device_prepare.sh makes them):
#   .whl/  wheels for Python 3.12: wgpu cffi pycparser rendercanvas msgspec llguidance redis rwkv
#   .gl/   Debian's libvulkan1 (and the GL loaders) as .deb files
# Writes logs and the benches' JSON to $OUT (or /tmp/gpu-out). Each part has its own time
# limit, so one that hangs leaves the others' figures.
#   BENCH_COMMIT=<sha> bash bench/gpu_device.sh [--quick]
set -u
OUT=${OUT:-/tmp/gpu-out}
mkdir -p "$OUT"
for f in .gl/*.deb; do dpkg -x "$f" /; done
ldconfig
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 XDG_RUNTIME_DIR=/tmp/xdg
mkdir -p /tmp/xdg
icd=/usr/local/nvidia/share/vulkan/icd.d/nvidia_icd.json
[ -f "$icd" ] && export VK_DRIVER_FILES=$icd
nvidia-smi -L
python3 -c "from ai00_like.rwkv.gpu.device import list_adapters; [print(a.describe()) for a in list_adapters()]"

shapes=0.1B,1.5B
[ "${1:-}" = "--quick" ] && shapes=quick
# The checkpoints are made on the CPU while the tests run (1.5B: ~50 s, 3 GB).
(cd bench && python3 -c "import sys; from shapes import bf16_checkpoint; [bf16_checkpoint(s) for s in sys.argv[1].split(',')]" "$shapes") \
    >"$OUT/checkpoints.log" 2>&1 &
made=$!
timeout 200 python3 -m pytest -q -p no:cacheprovider -n 8 tests/engine/test_gpu.py tests/engine/test_gpu_import.py \
    >"$OUT/test_gpu.log" 2>&1
echo "tests/engine/test_gpu.py: rc $? — $(tail -1 "$OUT/test_gpu.log")"
wait $made || { echo "checkpoints failed"; tail -5 "$OUT/checkpoints.log"; }
timeout 240 python3 bench/gpu_reference.py --tiles --shapes "$shapes" >"$OUT/gpu_reference.log" 2>&1
echo "bench/gpu_reference.py: rc $?"; grep -v -E '^[{#]|^Loading|^$' "$OUT/gpu_reference.log" | tail -12
timeout 120 python3 bench/gpu.py ${1:+--quick} >"$OUT/gpu.log" 2>&1
echo "bench/gpu.py: rc $?"; grep -v '^{' "$OUT/gpu.log" | tail -14
# Speculative decoding on the GPU: forced drafts at 0.1B (accepted 100%, 50%, 0%).
timeout 150 python3 bench/speculative.py --device gpu --skip-demo --rounds 2 >"$OUT/speculative.log" 2>&1
echo "bench/speculative.py --device gpu: rc $?"; grep -E "forced|run " "$OUT/speculative.log" | tail -4
# The reference with its own CUDA kernel for the WKV (nvcc compiles it first, about a minute).
timeout 200 python3 bench/gpu_reference.py --cuda-kernel --shapes "$shapes" >"$OUT/gpu_reference_kernel.log" 2>&1
echo "bench/gpu_reference.py --cuda-kernel: rc $?"; grep -v -E '^[{#]|^Loading|^$' "$OUT/gpu_reference_kernel.log" | tail -8
cp bench/results/gpu*-nogit* bench/results/gpu*-"${BENCH_COMMIT:-none}"* "$OUT"/ 2>/dev/null
grep -E "passed|failed|Error" "$OUT/test_gpu.log" | tail -5
