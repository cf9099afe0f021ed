"""HTTP-tier benchmark: what the aiohttp front costs on top of the serving core.

* streamed tokens/s seen by 1, 4 and 16 concurrent HTTP clients (SSE from
  /v1/completions, read by bare asyncio protocols that cost as little CPU as a client
  can), against the serving core's own rate for the same load, driven
  through the Middleware directly as tests/support/serving_helpers.py does (target ≥ 90% at 16);
* the latency the HTTP tier adds to a 1-token request (median over repeats);
* the same chat through Ollama's and Anthropic's routes against OpenAI's (bench/api_surfaces.py:
  the translations' cost, target within 5%);
* one streamed reply of the demo model (assets/models/demo.st) against the engine's own
  batch-1 rate (bench/one_stream.py: the time each token spends outside the model, target
  ≥ 0.8 of the engine's rate).

The server runs as `ai00-like` in a subprocess (as users run it); the clients and the
direct measurement run in this process, one after the other, never at the same time.
Uses a seeded v7 model of bench/engine.py's "quick" shape (L4, D256, World vocabulary),
written once to bench/.cache as safetensors. Prints a table and one JSON line.

    .venv/bin/python bench/http_tier.py [--tokens 64] [--repeats 20] [--rounds 3]
                                        [--demo-tokens 512] [--demo-only]

On a machine shared with other work, OpenBLAS's spinning threads make every figure
erratic; `OPENBLAS_NUM_THREADS=1 .venv/bin/python bench/http_tier.py` steadies both sides
alike (the server subprocess inherits the setting, which the JSON records).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import queue
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import aiohttp
import record
from api_surfaces import compare_surfaces, print_surfaces
from local import free_port, stream_completion
from one_stream import DEMO, DEMO_SECTIONS, Engine, http_rate

from ai00_like.messages import (
    Cancel,
    Failed,
    Finished,
    Generate,
    Load,
    Loaded,
    ModelSpec,
    TextPiece,
)
from ai00_like.middleware import Middleware
from ai00_like.rwkv.formats.safetensors import write_safetensors
from ai00_like.rwkv.synthetic import make_checkpoint
from ai00_like.sampler import Nucleus, SamplingOptions

CACHE = Path(__file__).resolve().parent / ".cache"
SHAPE = dict(n_layer=4, n_embd=256, head_size=64, vocab=65536, lora=dict(decay=32, a=32, value=16, gate=64))
MAX_BATCH = 16
CHUNK = 256
SEED = 1
# Ai00's default sampler, seeded: what a request with only `seed` set gets over HTTP.
OPTIONS = SamplingOptions(sampler=Nucleus(), seed=SEED)


def model_file() -> Path:
    path = CACHE / "v7-quick-seed1.st"
    if not path.exists():
        CACHE.mkdir(exist_ok=True)
        write_safetensors(make_checkpoint("7", seed=1, **SHAPE), path)
    return path


def prompts(n: int) -> list[str]:
    return [f"Request {i}: tell me a story about the number {i}." for i in range(n)]


# ---------------------------------------------------------------------------------- the core alone


class Collector:
    def __init__(self):
        self.events: queue.Queue = queue.Queue()
        self.tokens = 0

    def __call__(self, event):
        self.events.put(event)

    def wait(self) -> "Collector":
        while True:
            event = self.events.get(timeout=600)
            if isinstance(event, TextPiece):
                self.tokens += len(event.tokens)
            elif isinstance(event, Failed):
                raise SystemExit(f"request failed: {event.message}")
            elif isinstance(event, Finished):
                return self


class Core:
    def __init__(self, path: Path):
        self.mw = Middleware()
        box: queue.Queue = queue.Queue()
        self.mw.send(Load(ModelSpec(path=str(path), max_batch=MAX_BATCH, token_chunk_size=CHUNK), box.put))
        if not isinstance(box.get(timeout=600), Loaded):
            raise SystemExit("load failed")

    def send(self, prompt: str, max_tokens: int) -> Collector:
        c = Collector()
        self.mw.send(Generate(prompt=prompt, reply=c, cancel=Cancel(), options=OPTIONS, max_tokens=max_tokens))
        return c

    def rate(self, n: int, max_tokens: int) -> float:
        self.send("warm up", 2).wait()
        t = time.perf_counter()
        clients = [self.send(p, max_tokens) for p in prompts(n)]
        total = sum(c.wait().tokens for c in clients)
        return total / (time.perf_counter() - t)

    def one_token_latency(self, repeats: int) -> float:
        times = []
        for _ in range(repeats + 1):
            t = time.perf_counter()
            self.send("Hello", 1).wait()
            times.append(time.perf_counter() - t)
        return statistics.median(times[1:])  # the first fills the prefix cache

    def close(self):
        self.mw.close()


# ---------------------------------------------------------------------------------- through HTTP


class Server:
    """`ai00-like --config …` in a subprocess, with the model loaded."""

    def __init__(self, path: Path, extra_model: str = "", sections: str = ""):
        self.dir = tempfile.TemporaryDirectory()
        config = Path(self.dir.name) / "config.toml"
        config.write_text(f'[model]\npath = "{path.parent}"\nname = "{path.name}"\nmax_batch = {MAX_BATCH}\n'
                          f'token_chunk_size = {CHUNK}\n{extra_model}{sections}[listen]\nport = {free_port()}\n')
        self.port = int(config.read_text().split("port = ")[1].split()[0])
        self.proc = subprocess.Popen([sys.executable, "-m", "ai00_like", "--config", str(config)],
                                     stderr=subprocess.PIPE, text=True, env=dict(os.environ, PYTHONUNBUFFERED="1"))
        for line in self.proc.stderr:
            if " loaded in " in line:
                break
            if "error" in line.lower() and "ERROR" in line:
                raise SystemExit(line)
        else:
            raise SystemExit("the server exited before loading its model")
        # Keep reading its log so the pipe never fills and blocks it.
        threading.Thread(target=self.proc.stderr.read, daemon=True).start()
        self.url = f"http://127.0.0.1:{self.port}/v1/completions"

    def close(self):
        self.proc.send_signal(signal.SIGTERM)
        self.proc.wait(60)
        self.dir.cleanup()


async def _stream(port: int, prompt: str, max_tokens: int) -> int:
    _, tokens = await stream_completion(port, {"prompt": prompt, "max_tokens": max_tokens, "seed": SEED})
    return tokens


async def _http_rate(port: int, n: int, max_tokens: int) -> float:
    await _stream(port, "warm up", 2)
    t = time.perf_counter()
    counts = await asyncio.gather(*(_stream(port, p, max_tokens) for p in prompts(n)))
    return sum(counts) / (time.perf_counter() - t)


async def _http_latency(url: str, repeats: int) -> float:
    times = []
    async with aiohttp.ClientSession() as session:  # one keep-alive connection, as SDK clients use
        for _ in range(repeats + 1):
            t = time.perf_counter()
            async with session.post(url, json={"prompt": "Hello", "max_tokens": 1, "seed": SEED}) as resp:
                await resp.read()
                resp.raise_for_status()
            times.append(time.perf_counter() - t)
    return statistics.median(times[1:])


def demo_stream(tokens: int, rounds: int) -> dict:
    """The demo model: the engine's batch-1 rate and one HTTP stream's, taking turns, best
    of `rounds` each."""
    engine, server = Engine(MAX_BATCH), Server(DEMO, sections=DEMO_SECTIONS)
    engine_tps = http_tps = 0.0
    try:
        http_rate(server.port, 8)  # the prompt's state lands in the prefix cache, kernels warm
        for _ in range(rounds):
            engine_tps = max(engine_tps, engine.rate(tokens))
            rate, reply = http_rate(server.port, tokens)
            if reply != tokens:
                raise SystemExit(f"the demo reply ended after {reply} of {tokens} tokens")
            http_tps = max(http_tps, rate)
    finally:
        server.close()
    ratio = http_tps / engine_tps
    print(f"demo model, one stream of {tokens} tokens: HTTP {http_tps:.1f} tok/s, engine batch 1 "
          f"{engine_tps:.1f} tok/s, ratio {ratio:.3f}")
    return {"tokens": tokens, "http_tps": http_tps, "engine_tps": engine_tps, "ratio": ratio}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tokens", type=int, default=64, help="tokens per request (default 64)")
    parser.add_argument("--repeats", type=int, default=20, help="1-token requests timed (default 20)")
    parser.add_argument("--rounds", type=int, default=3, help="turns of each measurement, best kept (default 3)")
    parser.add_argument("--demo-tokens", type=int, default=512, help="tokens of the demo model's stream (default 512)")
    parser.add_argument("--demo-only", action="store_true", help="measure only the demo model's stream")
    parser.add_argument("--no-save", action="store_true", help=record.NO_SAVE_HELP)
    args = parser.parse_args()
    demo = demo_stream(args.demo_tokens, args.rounds)
    if args.demo_only:
        results = {"openblas_threads": os.environ.get("OPENBLAS_NUM_THREADS", "default"), "demo_stream": demo}
        print(json.dumps(results))
        record.save("http_tier", results, args)
        return
    path = model_file()
    concurrency = (1, 4, 16)

    # Both stay up (idle, they use no CPU) and take turns, best of `rounds` each: other
    # work on a shared machine then slows both sides alike instead of one of them.
    core, server = Core(path), Server(path)
    core_rates, http_rates = {n: 0.0 for n in concurrency}, {n: 0.0 for n in concurrency}
    try:
        for _ in range(args.rounds):
            for n in concurrency:
                core_rates[n] = max(core_rates[n], core.rate(n, args.tokens))
                http_rates[n] = max(http_rates[n], asyncio.run(_http_rate(server.port, n, args.tokens)))
        core_latency = core.one_token_latency(args.repeats)
        http_latency = asyncio.run(_http_latency(server.url, args.repeats))
        surfaces = compare_surfaces(server.port, path.stem, tokens=args.tokens, repeats=args.repeats)
    finally:
        core.close()
        server.close()

    results: dict = {"model": "v7 L4 D256 (quick shape)", "tokens_per_request": args.tokens, "rounds": args.rounds,
                     "openblas_threads": os.environ.get("OPENBLAS_NUM_THREADS", "default"), "decode": {}}
    print(f"{'clients':>8}{'HTTP tok/s':>12}{'core tok/s':>12}{'ratio':>8}")
    for n in concurrency:
        ratio = http_rates[n] / core_rates[n]
        results["decode"][n] = {"http_tps": http_rates[n], "core_tps": core_rates[n], "ratio": ratio}
        print(f"{n:>8}{http_rates[n]:>12.1f}{core_rates[n]:>12.1f}{ratio:>8.2f}")
    added = http_latency - core_latency
    results["one_token"] = {"http_s": http_latency, "core_s": core_latency, "added_s": added}
    print(f"1-token request: HTTP {http_latency * 1000:.1f} ms, core {core_latency * 1000:.1f} ms, "
          f"added by HTTP {added * 1000:.1f} ms")
    results["surfaces"] = surfaces
    results["demo_stream"] = demo
    print_surfaces(surfaces)
    print(json.dumps(results))
    record.save("http_tier", results, args)


if __name__ == "__main__":
    main()
