"""instructor, the structured-output library, against the demo model in both of its modes
that OpenAI-compatible servers serve: TOOLS (a forced named tool whose arguments become
the object) and JSON_SCHEMA (response_format). It runs in its own virtualenv, made by
scripts/test.sh, since it pins an older `jiter` than the suite's `openai` needs."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
PYTHON = ROOT / ".venv-instructor" / "bin" / "python"
CLIENT = Path(__file__).resolve().parents[1] / "clients" / "instructor_client.py"

pytestmark = pytest.mark.skipif(not PYTHON.exists(), reason="no .venv-instructor (scripts/test.sh makes it)")


@pytest.mark.parametrize("mode", ["TOOLS", "JSON_SCHEMA"])
def test_instructor_gets_its_object(demo_server, mode):
    out = subprocess.run([str(PYTHON), str(CLIENT), demo_server.base_url, mode], capture_output=True, text=True,
                         timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    reply = json.loads(out.stdout.strip().splitlines()[-1])
    verse = reply["verse"]
    assert isinstance(verse["book"], str) and isinstance(verse["chapter"], int) and isinstance(verse["verse"], int)
    if mode == "TOOLS":
        # The forced tool's wrapper is written into the prompt, not generated: the reply is
        # one call, ended by the grammar, within the budget.
        assert reply["tool_calls"] == ["Verse"]
        assert reply["finish_reason"] in ("tool_calls", "stop")
    else:
        assert reply["tool_calls"] == []
        assert reply["finish_reason"] == "stop"
    assert reply["completion_tokens"] < 64
