#!/usr/bin/env bash
# Sets up ai00-like on a fresh machine (a virtualenv in .venv) and starts the server with
# ./config.toml, which serves the bundled demo model. Extra arguments go to `ai00-like`,
# e.g. scripts/serve.sh --port 8000
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
exec .venv/bin/ai00-like "$@"
