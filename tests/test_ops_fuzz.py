"""Robustness: schemathesis generates requests for every route of our own OpenAPI document
(valid ones from the schemas, and invalid ones: wrong types, missing fields, odd strings)
and checks that none gets a 5xx or hangs past the request timeout."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ai00_like.api.openapi import OPENAPI_PATH
from api_helpers import ServerThread, config_for, write_model

MAX_EXAMPLES = 200  # per route, in the fuzzing phase; the coverage phase adds its own cases
# Not fuzzed: the other OpenAI prefixes (the same handlers as /v1), the status stream (an
# SSE stream that never ends by design), unload (every later request would rightly get 503)
# and save (each valid name writes a copy of the model to disk).
EXCLUDED = r"^/api/oai/|^/api/models/state$|^/admin/models/(unload|save)$"


def schemathesis() -> list[str]:
    found = shutil.which("schemathesis", path=str(Path(sys.executable).parent))
    if found is None:
        pytest.skip("schemathesis is not installed (pip install -e .[test])")
    return [found]


def test_fuzzing_every_route_finds_no_server_error_and_no_hang(tmp_path):
    write_model(tmp_path / "tiny.st")
    # Small limits keep generated requests quick: most fuzzed max_tokens are refused (400).
    config = config_for(tmp_path, listen_extra="max_prompt_tokens = 2048")
    config.model.max_tokens_limit = 32
    command = schemathesis()
    with ServerThread(config) as server:
        result = subprocess.run(
            [*command, "run", f"http://127.0.0.1:{server.port}{OPENAPI_PATH}",
             "--checks", "not_a_server_error", "--max-examples", str(MAX_EXAMPLES),
             "--request-timeout", "30", "--phases", "examples,coverage,fuzzing", "--workers", "2",
             "--exclude-path-regex", EXCLUDED, "--seed", "20261122", "--no-color"],
            capture_output=True, text=True, timeout=900, cwd=tmp_path, check=False)
        assert server.get("/health").status == 200  # still serving the same model
    out = result.stdout + result.stderr
    assert result.returncode == 0, out[-5000:]
    operations = int(re.search(r"Tested: (\d+)", out).group(1))
    generated = int(re.search(r"(\d+) generated", out).group(1))
    assert operations >= 18, out[-2000:]
    print(f"schemathesis: {generated} requests over {operations} operations, no 5xx")
    assert generated >= operations * MAX_EXAMPLES, out[-2000:]
