#!/usr/bin/env bash
# Sets up everything the test suite needs on a fresh machine, then runs all tests.
# Usage: scripts/test.sh [pytest args ...]
set -euo pipefail
cd "$(dirname "$0")/.."
# Debian packages: Mesa's software Vulkan GPU for the wgpu tests, Chromium for the page tests,
# HAProxy for the load-balancer and cluster tests, redis-server for the shared store's and the cluster's.
if ! dpkg -s mesa-vulkan-drivers chromium haproxy redis-server >/dev/null 2>&1; then
  if [ "$(id -u)" = 0 ]; then SUDO=""; else SUDO="sudo"; fi
  { $SUDO apt-get update -qq && DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq mesa-vulkan-drivers chromium haproxy redis-server; } \
    >/dev/null 2>&1 || echo "note: could not install mesa-vulkan-drivers/chromium/haproxy/redis-server; GPU, browser, HAProxy and shared-store tests will be skipped"
fi
# Mesa complains on stderr without a runtime dir, which would garble the CLI's one-line errors.
export XDG_RUNTIME_DIR="${XDG_RUNTIME_DIR:-$(mktemp -d)}"
scripts/setup.sh test
# The reference package for the live conformance tests. torch's CPU wheel lies on local disk
# on our machines; where it cannot be installed those tests are skipped, not failed.
if ! .venv/bin/python -c "import torch, rwkv" 2>/dev/null; then
  .venv/bin/pip install -q --disable-pip-version-check torch==2.13.0 rwkv==0.8.32 2>&1 | { grep -v "^WARNING: Location" || true; }
  .venv/bin/python -c "import torch, rwkv" 2>/dev/null \
    || echo "note: torch/rwkv not installed; the live reference tests will be skipped"
fi
# instructor pins an older jiter than the openai release the suite uses: its test runs it from
# a virtualenv of its own (tests/test_instructor.py).
if [ ! -x .venv-instructor/bin/python ] || ! .venv-instructor/bin/python -c "import instructor" 2>/dev/null; then
  "${PYTHON:-python3}" -m venv .venv-instructor
  .venv-instructor/bin/pip install -q --disable-pip-version-check instructor 2>&1 | { grep -v "^WARNING: Location" || true; }
  .venv-instructor/bin/python -c "import instructor" 2>/dev/null \
    || echo "note: instructor not installed; its test will be skipped"
fi
exec .venv/bin/python -m pytest -q "$@"
