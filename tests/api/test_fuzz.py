"""Robustness: schemathesis generates requests for every route of our own OpenAPI document
(valid ones from the schemas, and invalid ones: wrong types, missing fields, odd strings)
and checks that none gets a 5xx or hangs past the request timeout.

Each route's requests are counted from schemathesis' NDJSON event report (one
`ScenarioFinished` per scenario, with every request it sent and the response it got), so
the test can hold each route, not just the total, to at least 200 requests. A route
without any parameters or body (GET /v1/models, /health, /metrics, …) offers nothing to
vary: it gets its coverage-phase cases (other methods, header probes) and one fuzzed
request, about ten in all, and is only required to have been tested."""

from __future__ import annotations

import collections
import json
import re
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from api_helpers import ServerThread, config_for, write_model

from ai00_like.api.openapi import OPENAPI_PATH

MAX_EXAMPLES = 200  # per route, in the fuzzing phase; the examples and coverage phases add their own
MIN_PER_ROUTE = MAX_EXAMPLES  # requests every route with parameters or a body must have had
# Ollama's and Anthropic's routes translate their bodies onto the same planning and core as
# OpenAI's, which the run above fuzzes: what is theirs alone is the translation, for which
# fewer cases do (each of their generations costs as much as an OpenAI one). The saved
# states' routes are as thin: the same read as /states, then the response store.
OTHER_APIS = (r"^/api/(chat|generate|embed|embeddings|tags|ps|show|version|pull|create|copy|push|blobs)\b|^/v1/messages"
              r"|^/v1/saved_states")
OTHER_EXAMPLES = 50
# Not fuzzed: the other OpenAI prefixes (the same handlers as /v1), the status stream (an
# SSE stream that never ends by design), unload (every later request would rightly get 503),
# save (each valid name writes a copy of the model to disk) and Ollama's delete (it deletes
# model files).
EXCLUDED = r"^/api/oai/|^/api/models/state$|^/admin/models/(unload|save)$|^/api/delete$"
# Fuzzed afterwards, one request at a time: a successful load replaces the model, and a
# request running on the old one meanwhile is ended with a 503 ("the model was replaced"),
# as documented. The model routes beside it answer with the file name that schemathesis
# then tries as `model_path` (it learns values from responses), so some loads succeed.
LOAD = "/admin/models/load"
LOAD_RUN = f"^{LOAD}$|^/api/models/(list|info)$"
# A request that takes longer is taken for a hang. The heaviest valid ones (n = 127 choices of
# 16 tokens, not streamed) take 1 to 7 s alone here; one once took over 30 s on the busy
# shared machine with nothing else in flight, so the limit leaves room for slowness.
REQUEST_TIMEOUT = 60
COMPILING = re.compile(rb"^rwkv:kernels_compiling\{[^}]*\} 1(\.0)?$", re.M)  # /metrics while on numpy


def schemathesis() -> list[str]:
    found = shutil.which("schemathesis", path=str(Path(sys.executable).parent))
    if found is None:
        pytest.skip("schemathesis is not installed (pip install -e .[test])")
    return [found]


def fuzz(port: int, directory: Path, name: str, *selection: str, workers: int,
         phases: str = "examples,coverage,fuzzing", examples: int = MAX_EXAMPLES) -> collections.Counter:
    """One `schemathesis run`; asserts it passed and every request got an answer.
    Returns the number of requests per operation and status: {("POST /v1/completions", 400): n}."""
    report = directory / f"{name}.ndjson"
    result = subprocess.run(
        [*schemathesis(), "run", f"http://127.0.0.1:{port}{OPENAPI_PATH}",
         "--checks", "not_a_server_error", "--max-examples", str(examples),
         "--request-timeout", str(REQUEST_TIMEOUT), "--phases", phases, "--workers", str(workers), *selection, "--seed", "20261122", "--no-color",
         "--report", "ndjson", "--report-ndjson-path", str(report)],
        capture_output=True, text=True, timeout=900, cwd=directory, check=False)
    out = result.stdout + result.stderr
    assert result.returncode == 0, out[-5000:]
    requests: collections.Counter = collections.Counter()
    unanswered = []
    with report.open(encoding="utf-8") as events:
        for line in events:
            if not line.startswith('{"ScenarioFinished"'):
                continue
            recorder = json.loads(line)["ScenarioFinished"]["recorder"]
            for interaction in recorder.get("interactions", {}).values():
                if interaction.get("response") is None:  # a timeout or a dropped connection
                    unanswered.append((recorder["label"], interaction["request"]))
                else:
                    requests[recorder["label"], interaction["response"]["status_code"]] += 1
    assert not unanswered, unanswered[:3]
    return requests


def operations(document: dict) -> dict[str, bool]:
    """{"POST /v1/completions": has inputs} for every route the fuzz run selects."""
    return {f"{method.upper()} {path}": "requestBody" in op or bool(op.get("parameters"))
            for path, ops in document["paths"].items() if not re.search(EXCLUDED, path)
            for method, op in ops.items()}


def per_route(answers: collections.Counter) -> collections.Counter:
    requests: collections.Counter = collections.Counter()
    for (label, _status), count in answers.items():
        requests[label] += count
    return requests


def fewest(label: str) -> int:
    """The requests a route with inputs must have had."""
    return OTHER_EXAMPLES if re.search(OTHER_APIS, label.split(" ", 1)[1]) else MIN_PER_ROUTE


def short_of_requests(requests: collections.Counter, expected: dict[str, bool]) -> dict[str, int]:
    return {label: requests[label] for label, varied in expected.items() if varied and requests[label] < fewest(label)}


def wait_for_compiled_kernels(server, seconds: float = 600) -> None:
    """Until the model serves on its compiled kernels. On an empty kernel cache (a fresh
    checkout, as in CI) it starts on numpy while they compile in the background (the cold
    start), and there 127 choices of 32 tokens took 17-20 s alone, beside the compiling: with
    the suite's other worker and the fuzzer's own, past REQUEST_TIMEOUT (seen twice)."""
    deadline = time.monotonic() + seconds
    while COMPILING.search(server.get("/metrics").body):
        assert time.monotonic() < deadline, "the CPU kernels did not compile in time"
        time.sleep(0.5)


def test_fuzzing_every_route_finds_no_server_error_and_no_hang(tmp_path, monkeypatch):
    # A fuzzed POST /admin/models/pull of a REPO/FILE name starts a download: to a closed port
    # on the loopback, never to the real hub.
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{s.getsockname()[1]}")
    write_model(tmp_path / "tiny.st")
    # Small limits keep generated requests quick: most fuzzed max_tokens are refused (400).
    config = config_for(tmp_path, listen_extra="max_prompt_tokens = 2048")
    config.model.max_tokens_limit = 32
    with ServerThread(config) as server:
        wait_for_compiled_kernels(server)
        expected = operations(server.get(OPENAPI_PATH).json())
        assert len(expected) >= 19 and f"POST {LOAD}" in expected
        answers = fuzz(server.port, tmp_path, "routes", "--exclude-path-regex", f"{EXCLUDED}|^{LOAD}$|{OTHER_APIS}",
                       workers=2)
        answers += fuzz(server.port, tmp_path, "other-apis", "--include-path-regex", OTHER_APIS,
                        "--exclude-path-regex", EXCLUDED, workers=2, examples=OTHER_EXAMPLES)
        answers += fuzz(server.port, tmp_path, "load", "--include-path-regex", LOAD_RUN, workers=1)
        # With several operations under way schemathesis now and then ends one's fuzzing
        # phase after a few cases (9 of 200: config/save in one run, config/load in another);
        # alone it generates them all, so such a route is fuzzed again on its own.
        again = short_of_requests(per_route(answers), expected)
        for k, label in enumerate(again):
            answers += fuzz(server.port, tmp_path, f"again-{k}", "--include-name", label, workers=1, phases="fuzzing",
                            examples=fewest(label))
        assert server.get("/health").status == 200  # still serving a model
    requests = per_route(answers)
    print(f"schemathesis: {sum(requests.values())} requests over {len(requests)} operations, no 5xx; "
          f"{answers[f'POST {LOAD}', 200]} loads succeeded; fuzzed again alone: {again or 'none'}")
    for label, count in sorted(requests.items(), key=lambda item: item[1]):
        print(f"  {count:5d}  {label}{'' if expected.get(label) else '  (no inputs)'}")
    assert set(requests) == set(expected), set(requests) ^ set(expected)
    too_few = short_of_requests(requests, expected)
    assert not too_few, f"fewer than {MIN_PER_ROUTE} ({OTHER_EXAMPLES} for other APIs) requests: {too_few}"
