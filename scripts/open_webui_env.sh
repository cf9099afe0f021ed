#!/usr/bin/env bash
# Installs Open WebUI in a virtualenv of its own for the opt-in test
# tests/system/test_open_webui.py (pytest -m open_webui), then prints the virtualenv's path.
# Usage: scripts/open_webui_env.sh
#   OPEN_WEBUI_VENV      where (default: ${XDG_CACHE_HOME:-~/.cache}/ai00-like/open-webui; the test
#                        looks in the same place). Outside the checkout: it is some 3 GB.
#   OPEN_WEBUI_VERSION   which release (default below: the one whose page the test's selectors fit)
#   PYTHON               the interpreter for the virtualenv (Open WebUI needs 3.11 or 3.12)
# The CPU build of torch is installed first: Open WebUI needs torch (through accelerate and
# sentence-transformers), and left to itself pip takes the CUDA build (7.4 GB in all instead
# of 2.9 GB). On our machines torch 2.13.0's CPU wheel lies on local disk. Seen here: about
# 6 minutes on a 2-core machine with an empty pip cache. Does nothing when already installed.
set -euo pipefail
VENV="${OPEN_WEBUI_VENV:-${XDG_CACHE_HOME:-$HOME/.cache}/ai00-like/open-webui}"
VERSION="${OPEN_WEBUI_VERSION:-0.12.4}"
PY="${PYTHON:-python3}"
if [ -x "$VENV/bin/open-webui" ] \
   && [ "$("$VENV/bin/python" -c 'import importlib.metadata as m; print(m.version("open-webui"))' 2>/dev/null)" = "$VERSION" ]; then
  echo "$VENV"
  exit 0
fi
if ! "$PY" -c 'import sys; sys.exit(not ((3, 11) <= sys.version_info[:2] <= (3, 12)))'; then
  echo "Open WebUI $VERSION needs Python 3.11 or 3.12; $PY is $("$PY" --version 2>&1). Set PYTHON." >&2
  exit 1
fi
mkdir -p "$(dirname "$VENV")"
"$PY" -m venv "$VENV"
"$VENV/bin/pip" install -q --disable-pip-version-check torch==2.13.0 "open-webui==$VERSION" 2>&1 \
  | { grep -v "^WARNING: Location" || true; }
"$VENV/bin/python" -c "import open_webui" >/dev/null
echo "$VENV"
