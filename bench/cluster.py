"""Cluster benchmark: time to first token of turn 5 of a conversation behind HAProxy, in one run.

Starts on the loopback a redis-server (the shared store), two replicas (`ai00-like` in
subprocesses, with the 0.1B-shaped seeded v7 of bench/engine.py, L12 D768, as a bf16 .pth;
`--quick`: its L4 D256 shape) and two HAProxy instances with the configuration `ai00-like
lb-config` writes: one as written (consistent hash of the affinity key), one with
`balance roundrobin`. Each conversation
has 5 turns of ~300-token user messages and 16-token greedy replies; the time to the first
streamed text of turn 5 is measured for:

  (a) chat completions with a `prompt_cache_key`: every turn on one replica, whose prefix
      cache holds the history;
  (b) chat completions through the round-robin HAProxy: turns alternate between the
      replicas, so turn 5's replica has only turn 3's prefix cached;
  (c) the Responses API with `previous_response_id`, turns 1-4 on one replica and turn 5
      on the other (as when the first one is gone): the state comes from Redis;
  (d) as (c), with turn 4's state deleted from Redis first (evicted): the other replica
      rebuilds it by reading the stored conversation again.

Each conversation runs the four modes one after the other, with its own text, so that a
busy machine weighs on all of them alike. Prints a table of medians and one JSON line.
Needs `haproxy` and `redis-server` (Debian packages).

    OPENBLAS_NUM_THREADS=1 .venv/bin/python bench/cluster.py [--conversations 5] [--quick]

(one BLAS thread per replica: the two replicas and HAProxy share a 2-core machine, and
OpenBLAS's spinning threads made every figure erratic on a busy one)
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import httpx
import redis

sys.path.insert(0, str(Path(__file__).resolve().parent))
import engine  # noqa: E402
import record  # noqa: E402
from local import free_port  # noqa: E402
from conversation import first_token_seconds  # noqa: E402

from ai00_like.lb_config import haproxy_config  # noqa: E402

TURNS = 5
REPLY_TOKENS = 16
WORDS = ("river city flood field harvest people bridge tower market winter summer stone road king "
         "village mill boat storm lantern garden orchard wall gate song story old new long short "
         "quiet loud green grey bright dark north south east west morning evening night journey "
         "letter promise stranger friend teacher child farmer merchant sailor soldier priest").split()
MODES = {
    "a": "affinity (prompt_cache_key), prefix cache",
    "b": "round robin, no affinity",
    "c": "Responses, other replica, state from Redis",
    "d": "Responses, other replica, state not stored",
}


def wait_for(url: str, proc: subprocess.Popen, what: str, seconds: float = 300) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"{what} exited ({proc.returncode})")
        try:
            if httpx.get(url, timeout=5).status_code == 200:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.2)
    raise SystemExit(f"{what} was not ready within {seconds:.0f} s")


class Processes:
    """Children started in order, stopped in reverse order."""

    def __init__(self, folder: Path):
        self.folder, self.procs = folder, []

    def start(self, name: str, args: list[str]) -> subprocess.Popen:
        log = open(self.folder / f"{name}.log", "w")
        proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, cwd=self.folder,
                                env=dict(os.environ, PYTHONUNBUFFERED="1"))
        self.procs.append(proc)
        return proc

    def close(self) -> None:
        for proc in reversed(self.procs):
            if proc.poll() is None:
                proc.terminate()
                try:
                    proc.wait(30)
                except subprocess.TimeoutExpired:
                    proc.kill()


def start_cluster(procs: Processes, model: Path, folder: Path) -> dict:
    redis_port = free_port()
    store = procs.start("redis", ["redis-server", "--port", str(redis_port), "--bind", "127.0.0.1",
                                  "--save", "", "--appendonly", "no"])
    ports, started = {}, {}
    for name in ("replica1", "replica2"):  # lb-config's names for its servers
        ports[name] = free_port()
        config = folder / f"{name}.toml"
        config.write_text(f'[model]\npath = "{model.parent}"\nname = "{model.name}"\nmax_batch = 4\n'
                          f'[listen]\nip = "127.0.0.1"\nport = {ports[name]}\nreplica = "{name}"\n'
                          f'[store]\nurl = "redis://127.0.0.1:{redis_port}/0"\nprefix = "bench:"\n')
        started[name] = procs.start(name, [sys.executable, "-m", "ai00_like", "--config", str(config)])
    for name, port in ports.items():  # the two load side by side
        wait_for(f"http://127.0.0.1:{port}/health", started[name], name)
    balancers = {}
    for kind in ("affinity", "roundrobin"):
        port = free_port()
        text = haproxy_config([f"http://127.0.0.1:{p}" for p in ports.values()], port=port, bind="127.0.0.1")
        if kind == "roundrobin":
            text = text.replace("balance hash var(txn.key)", "balance roundrobin")
        path = folder / f"haproxy-{kind}.cfg"
        path.write_text(text)
        proc = procs.start(f"haproxy-{kind}", ["haproxy", "-db", "-f", str(path)])
        wait_for(f"http://127.0.0.1:{port}/health", proc, f"HAProxy ({kind})", 30)
        balancers[kind] = f"http://127.0.0.1:{port}"
    assert store.poll() is None, "redis-server exited"
    return {"store": redis.Redis(port=redis_port), "replicas": {k: f"http://127.0.0.1:{p}" for k, p in ports.items()},
            **balancers}


def user_turn(rng: random.Random, n: int) -> str:
    """About 300 tokens of plain words: a long user turn."""
    return f"Turn {n}. " + " ".join(rng.choice(WORDS) for _ in range(230)) + ". What happened next?"


def timed(url: str, path: str, body: dict) -> tuple[float, str, dict, str]:
    """(seconds to the first streamed text, the reply, the last event with usage, replica)."""
    with httpx.Client(base_url=url, timeout=600) as client:
        seconds, text, last, headers = first_token_seconds(client, path, body,
                                                           ("response.completed", "response.incomplete"))
    return seconds, text, last, headers.get("X-Ai00-Replica", "")


def read_tokens(last: dict) -> tuple[int, int]:
    """(prompt tokens, of which the model read: not from the cache or a stored state)."""
    usage = last.get("usage") or (last.get("response") or {}).get("usage") or {}
    prompt = usage.get("prompt_tokens", usage.get("input_tokens", 0))
    details = usage.get("prompt_tokens_details") or usage.get("input_tokens_details") or {}
    return prompt, prompt - details.get("cached_tokens", 0)


def chat_conversation(url: str, rng: random.Random, key: str | None) -> tuple[float, int, int]:
    history, result = [], None
    for n in range(1, TURNS + 1):
        history.append({"role": "user", "content": user_turn(rng, n)})
        body = {"messages": history, "max_tokens": REPLY_TOKENS, "temperature": 0,
                "stream_options": {"include_usage": True}}
        if key:
            body["prompt_cache_key"] = key
        seconds, reply, last, _ = timed(url, "/v1/chat/completions", body)
        history.append({"role": "assistant", "content": reply})
        result = (seconds, *read_tokens(last))
    return result


def responses_conversation(cluster: dict, rng: random.Random, key: str, drop_state: bool) -> tuple[float, int, int]:
    previous, served = None, ""
    for n in range(1, TURNS + 1):
        body = {"input": user_turn(rng, n), "max_output_tokens": REPLY_TOKENS, "temperature": 0,
                "prompt_cache_key": key}
        if previous:
            body["previous_response_id"] = previous
        url = cluster["affinity"]
        if n == TURNS:  # the replica that did not serve turn 4
            url = next(u for name, u in cluster["replicas"].items() if name != served)
            if drop_state:
                assert cluster["store"].delete(f"bench:state:{previous}") == 1
        seconds, _, last, replica = timed(url, "/v1/responses", body)
        previous, served = last["response"]["id"], replica or served
    return (seconds, *read_tokens(last))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--conversations", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="the 4-layer D256 model instead of the 0.1B shape")
    parser.add_argument("--no-save", action="store_true", help=record.NO_SAVE_HELP)
    args = parser.parse_args()
    for tool in ("haproxy", "redis-server"):
        if not shutil.which(tool):
            raise SystemExit(f"{tool} is not installed (apt-get install {tool})")
    model = engine.bf16_checkpoint("quick" if args.quick else "0.1B")
    started = time.monotonic()
    rows: dict[str, list[tuple[float, int, int]]] = {mode: [] for mode in MODES}
    with tempfile.TemporaryDirectory() as tmp:
        procs = Processes(Path(tmp))
        try:
            cluster = start_cluster(procs, model, Path(tmp))
            print(f"cluster up in {time.monotonic() - started:.0f} s", flush=True)
            for i in range(args.conversations):
                runs = {
                    "a": lambda rng: chat_conversation(cluster["affinity"], rng, f"conv-a-{i}"),
                    "b": lambda rng: chat_conversation(cluster["roundrobin"], rng, None),
                    "c": lambda rng: responses_conversation(cluster, rng, f"conv-c-{i}", False),
                    "d": lambda rng: responses_conversation(cluster, rng, f"conv-d-{i}", True),
                }
                for mode, run in runs.items():
                    rows[mode].append(run(random.Random(f"{mode}-{i}")))
                print(f"conversation {i + 1}: " + "  ".join(
                    f"({m}) {rows[m][-1][0] * 1000:.0f} ms" for m in MODES), flush=True)
        finally:
            procs.close()
    summary = {"model": "quick" if args.quick else "0.1B", "conversations": args.conversations,
               "wall_s": round(time.monotonic() - started, 1)}
    print(f"\nturn {TURNS}, medians over {args.conversations} conversations:")
    print(f"{'':50}{'TTFT ms':>9}{'tokens read':>13}")
    for mode, label in MODES.items():
        ttft = statistics.median(r[0] for r in rows[mode])
        prompt = statistics.median(r[1] for r in rows[mode])
        read = statistics.median(r[2] for r in rows[mode])
        print(f"({mode}) {label:46}{ttft * 1000:9.0f}{read:13.0f}")
        summary[mode] = {"label": label, "ttft_ms": round(ttft * 1000, 1), "prompt_tokens": prompt, "read_tokens": read,
                         "ttft_ms_each": [round(r[0] * 1000, 1) for r in rows[mode]]}
    print(json.dumps(summary))
    record.save("cluster", summary, args)


if __name__ == "__main__":
    main()
