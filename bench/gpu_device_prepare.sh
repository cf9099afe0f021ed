#!/usr/bin/env bash
# What bench/gpu_device.sh needs carried to a lent GPU machine, made here: the wheels its
# image lacks (for its Python 3.12) in .whl/, and Debian's Vulkan and GL loaders in .gl/.
# Both folders are added to .git/info/exclude: they travel as `carry`, never as commits.
#   bash bench/gpu_device_prepare.sh      # then: run with carry [".whl", ".gl"]
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-.venv/bin/python}
mkdir -p .git/info .whl .gl
for path in /.whl/ /.gl/; do
  grep -qxF "$path" .git/info/exclude 2>/dev/null || echo "$path" >>.git/info/exclude
done
# The versions this checkout's venv runs, so that both machines run the same code.
version() { "$PYTHON" -c "from importlib.metadata import version; print(version('$1'))"; }
platforms=()
for tag in manylinux_2_17 manylinux_2_24 manylinux_2_27 manylinux_2_28 manylinux_2_31 manylinux_2_34 manylinux2014; do
  platforms+=(--platform "${tag}_x86_64")
done
for package in wgpu cffi pycparser rendercanvas msgspec llguidance redis rwkv; do
  "$PYTHON" -m pip download -q --no-deps --only-binary=:all: --python-version 3.12 --implementation cp \
    "${platforms[@]}" --platform any -d .whl "$package==$(version "$package")" 2>&1 | { grep -v "^WARNING: Location" || true; }
done
lists=/tmp/gpu-device-apt-lists
mkdir -p "$lists/partial"
apt=(-oAPT::Architecture=amd64 -oAPT::Architectures=amd64 -oDir::State::Lists="$lists")
apt-get "${apt[@]}" update >/dev/null
(cd .gl && apt-get "${apt[@]}" download libvulkan1 libegl1 libglvnd0 libopengl0 libgl1 libglx0 libgles2 2>&1 \
  | { grep -v "unsandboxed" || true; })
ls .whl .gl
du -sh .whl .gl
