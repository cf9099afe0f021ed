#!/usr/bin/env bash
# Creates .venv beside the project and installs ai00-like into it (idempotent).
# Usage: scripts/setup.sh [extra ...]   e.g. scripts/setup.sh test
set -euo pipefail
cd "$(dirname "$0")/.."
PYTHON=${PYTHON:-python3}
if [ ! -x .venv/bin/python ]; then
  "$PYTHON" -m venv .venv
fi
extras=""
if [ $# -gt 0 ]; then extras="[$(IFS=,; echo "$*")]"; fi
.venv/bin/pip install -q --disable-pip-version-check -e ".${extras}" 2>&1 | grep -v "^WARNING: Location" || true
.venv/bin/python -c "import ai00_like" # fails loudly if the install did not work
