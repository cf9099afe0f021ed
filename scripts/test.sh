#!/usr/bin/env bash
# Sets up everything the test suite needs on a fresh machine, then runs all tests.
# Usage: scripts/test.sh [--fast] [pytest args ...]
#   --fast  the inner loop: only the tests not marked `slow` (no tests/system/, none of the
#           long tests of the other tiers), in one process. Under 3 minutes on a 2-core machine.
# Without --fast the whole suite runs in two worker processes (pytest-xdist, a module's tests
# in one worker, the longest modules first: tests/conftest.py); `-n 0` among the pytest args
# runs it in this process alone.
set -euo pipefail
cd "$(dirname "$0")/.."
FAST=0
if [ "${1:-}" = "--fast" ]; then
  FAST=1
  shift
fi
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
# numba compiles the CPU kernels into its on-disk cache the first time they run: minutes of
# one core on a fresh checkout. Done once here, beside the installs below, instead of by both
# test workers at once; with the cache warm this takes seconds. (--fast runs in one process.)
WARM_PID=""
if [ "$FAST" = 0 ]; then
  WARM_LOG=$(mktemp)
  .venv/bin/python tests/support/warm_kernels.py >"$WARM_LOG" 2>&1 &
  WARM_PID=$!
fi
# The reference package for the live conformance tests. torch's CPU wheel lies on local disk
# on our machines; where it cannot be installed those tests are skipped, not failed.
if ! .venv/bin/python -c "import torch, rwkv" 2>/dev/null; then
  .venv/bin/pip install -q --disable-pip-version-check torch==2.13.0 rwkv==0.8.32 2>&1 | { grep -v "^WARNING: Location" || true; }
  .venv/bin/python -c "import torch, rwkv" 2>/dev/null \
    || echo "note: torch/rwkv not installed; the live reference tests will be skipped"
fi
# instructor pins an older jiter than the openai release the suite uses: its test runs it from
# a virtualenv of its own (tests/api/test_instructor.py, marked slow: --fast does without it).
if [ "$FAST" = 0 ] && { [ ! -x .venv-instructor/bin/python ] || ! .venv-instructor/bin/python -c "import instructor" 2>/dev/null; }; then
  "${PYTHON:-python3}" -m venv .venv-instructor
  .venv-instructor/bin/pip install -q --disable-pip-version-check instructor 2>&1 | { grep -v "^WARNING: Location" || true; }
  .venv-instructor/bin/python -c "import instructor" 2>/dev/null \
    || echo "note: instructor not installed; its test will be skipped"
fi
if [ -n "$WARM_PID" ]; then
  wait "$WARM_PID" || { echo "note: warming numba's kernel cache failed; the tests compile what they need:"; tail -5 "$WARM_LOG"; }
  rm -f "$WARM_LOG"
fi
if [ "$FAST" = 1 ]; then
  exec .venv/bin/python -m pytest -q -m "not slow" "$@"
fi
exec .venv/bin/python -m pytest -q -n 2 --dist loadfile --no-loadscope-reorder "$@"
