"""Several-models benchmark: what serving more than one model costs and gives, in one run.

* cold start: time to first token of a streamed chat request whose model must be loaded
  first (it is unloaded with `POST /admin/models/unload` before each sample) against the
  same request to the model already loaded (medians, and their ratio), and the time a
  load takes (`POST /admin/models/load`, median);
* two models at once: decode tokens/s of two models (the demo model under two names,
  fp16 and fp32, each with its own backend thread) each streaming one request alone, then
  both at the same time; the aggregate against the mean of the two alone;
* the routing's overhead: one model served by this tree (the model pool and the
  middleware that routes by model) against the commit before the many-models work
  (`--baseline-ref`, checked out with `git worktree add` into a temporary folder), the
  same workload on each (sequential non-streamed chat requests, then one batch of
  concurrent streams), in rounds that alternate the two servers (A B, B A, A B, ...) so
  that the shared machine's drift falls on both alike. Goal: new/old within 2%.
  `--no-baseline` skips it; so does a missing git or ref, with a line saying why.

Every server is `python -m ai00_like --config <file> --port <port>` in a subprocess, with
PYTHONPATH and the working folder at its tree, OPENBLAS_CORETYPE left out of its
environment (as bench/engine.py does), and a config written into a temporary folder:
the bundled demo model (assets/models/demo.st, its vocabulary beside it), `device = "cpu"`,
no [web]. The clients run in this process. Rates are the best of `--rounds`, times to
first token the median of all samples.

Every stream decodes exactly `--max-tokens` tokens: the HTTP API has no `ignore_eos`, so
the requests ban the end-of-text token (`logit_bias: {"0": -100}`) and drop the default
stop strings (`stop: null`); a reply that comes back shorter is reported.

    .venv/bin/python bench/many_models.py [--rounds 3] [--max-tokens 64] [--no-baseline]
    .venv/bin/python bench/many_models.py --rounds 1 --max-tokens 16 --no-save   # a smoke run

Prints a table per part and one JSON line.
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import contextlib
import json
import os
import queue
import re
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
import record
from local import free_port, note

ROOT = Path(__file__).resolve().parents[1]
MODELS = ROOT / "assets" / "models"
DEMO = MODELS / "demo.st"
VOCAB = MODELS / "demo_vocab.txt"
DEFAULT_REF = "f2f6be7"  # the commit before the many-models work
MAX_BATCH = 8
TTFT_SAMPLES = 3  # cold and warm samples per round
TTFT_TOKENS = 4  # tokens each time-to-first-token request asks for
SEQUENTIAL = 8  # non-streamed requests, one after another, per round of the routing part
CONCURRENT = 4  # streams at once, per round of the routing part
# Two served names of one file: two models to the server (weights, thread, slots of its own).
MODEL_A, MODEL_B = "demo-a", "demo-b"  # fp16 (the file's own), fp32 (converted at load)
COLD = MODEL_B
CACHE_BYTES = 256 << 20  # each model's prefix cache in the two-model server
LOADED = re.compile(r"model (\S+) loaded in ([0-9.]+) s")


# ---------------------------------------------------------------------------------- servers


def model_config() -> str:
    """[model], [tokenizer] and nothing newer: a file both trees read alike."""
    return (f'[model]\npath = "{MODELS}"\nname = "{DEMO.name}"\ndevice = "cpu"\nmax_batch = {MAX_BATCH}\n\n'
            f'[tokenizer]\npath = "{VOCAB}"\n')


def two_model_config() -> str:
    """The demo under two names: [model] as fp16 and a [[models]] section as fp32, both
    loaded at start; the second pinned (keep_alive = -1), so only the bench unloads it.
    Small prefix caches (no request here reuses a prefix), so that both fit a small
    machine's memory budget."""
    return (f'[model]\npath = "{MODELS}"\nname = "{DEMO.name}"\nserved_name = "{MODEL_A}"\ndevice = "cpu"\n'
            f'max_batch = {MAX_BATCH}\ncache_bytes = {CACHE_BYTES}\n\n'
            f'[[models]]\nname = "{DEMO.name}"\nserved_name = "{MODEL_B}"\nprecision = "fp32"\ndevice = "cpu"\n'
            f'max_batch = {MAX_BATCH}\ncache_bytes = {CACHE_BYTES}\ntokenizer = "{VOCAB}"\nkeep_alive = -1\n'
            f'load = "startup"\n\n'
            f'[tokenizer]\npath = "{VOCAB}"\n\n[server]\nserve_folder = false\n')


class Server:
    """`python -m ai00_like` of the tree `tree` in a subprocess, once `models` models are loaded."""

    def __init__(self, tree: Path, config: str, models: int, label: str):
        self.label = label
        self.dir = tempfile.TemporaryDirectory(prefix="many_models-")
        path = Path(self.dir.name) / "config.toml"
        path.write_text(config, encoding="utf-8")
        self.port = free_port()
        env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_CORETYPE"}
        env.update(PYTHONPATH=str(tree), PYTHONUNBUFFERED="1")
        # cwd: `python -m` puts the working folder first on sys.path, so it must be the tree too.
        self.proc = subprocess.Popen([sys.executable, "-m", "ai00_like", "--config", str(path), "--port",
                                      str(self.port)], cwd=tree, env=env, stdin=subprocess.DEVNULL,
                                     stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        self.tail: collections.deque = collections.deque(maxlen=40)
        self.loads: queue.Queue = queue.Queue()
        # Keep reading its log, so that the pipe never fills and blocks it.
        threading.Thread(target=self._read, daemon=True).start()
        try:
            for _ in range(models):
                self.wait_loaded(600)
        except BaseException:
            self.close()
            raise
        self.url = f"http://127.0.0.1:{self.port}"

    def _read(self) -> None:
        for line in self.proc.stderr:
            self.tail.append(line)
            if match := LOADED.search(line):
                self.loads.put((match[1], float(match[2])))
        self.loads.put(None)  # it exited

    def wait_loaded(self, timeout: float) -> tuple[str, float]:
        try:
            event = self.loads.get(timeout=timeout)
        except queue.Empty:
            raise SystemExit(f"{self.label} server: no model loaded in {timeout:.0f} s:\n{''.join(self.tail)}")
        if event is None:
            raise SystemExit(f"{self.label} server exited before loading its models:\n{''.join(self.tail)}")
        return event

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(60)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.dir.cleanup()


@contextlib.contextmanager
def baseline_tree(ref: str):
    """A checkout of `ref` in a temporary folder (a git worktree, removed afterwards), or
    (None, why) when there is no git or no such commit."""
    if shutil.which("git") is None:
        yield None, "git is not installed"
        return
    found = subprocess.run(["git", "rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}"], cwd=ROOT,
                           capture_output=True, text=True)
    if found.returncode != 0:
        yield None, f"{ref} is not a commit of this checkout"
        return
    commit = found.stdout.strip()
    folder = Path(tempfile.mkdtemp(prefix="many_models-baseline-"))
    tree = folder / "tree"
    added = subprocess.run(["git", "worktree", "add", "--detach", "--quiet", str(tree), commit], cwd=ROOT,
                           capture_output=True, text=True)
    try:
        if added.returncode != 0:
            yield None, f"git worktree add failed: {added.stderr.strip()}"
        else:
            yield (tree, commit), None
    finally:
        if added.returncode == 0:
            removed = subprocess.run(["git", "worktree", "remove", "--force", str(tree)], cwd=ROOT,
                                     capture_output=True, text=True)
            if removed.returncode != 0:
                print(f"warning: git worktree remove {tree} failed ({removed.stderr.strip()}); "
                      "`git worktree prune` clears its record", file=sys.stderr)
        shutil.rmtree(folder, ignore_errors=True)


# ---------------------------------------------------------------------------------- clients


def chat_body(model: str | None, prompt: str, max_tokens: int, stream: bool) -> dict:
    """A chat request that decodes exactly max_tokens tokens at temperature 0."""
    body = {"messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens, "temperature": 0,
            "stop": None, "logit_bias": {"0": -100}, "stream": stream}
    if model:
        body["model"] = model
    if stream:
        body["stream_options"] = {"include_usage": True}
    return body


@dataclass
class Stream:
    """One streamed reply: when it was sent, when each piece of text came, its usage."""

    sent: float = 0.0
    pieces: list[float] = field(default_factory=list)  # arrival time of each chunk with text
    tokens: int = 0  # completion_tokens of the usage chunk

    @property
    def ttft(self) -> float:
        return self.pieces[0] - self.sent

    def tokens_between(self, start: float, end: float) -> float:
        """Tokens that came in (start, end]: pieces counted, scaled to the usage's tokens
        (a piece is one token, or a few when a character spans tokens)."""
        per_piece = self.tokens / len(self.pieces)
        return per_piece * sum(start < t <= end for t in self.pieces)

    def decode_rate(self) -> float:
        """Tokens/s after the first token."""
        first, last = self.pieces[0], self.pieces[-1]
        return self.tokens_between(first, last) / (last - first)


class _SseReader(asyncio.Protocol):
    """Reads one streamed chat reply over a bare connection, timing each piece of text.

    No HTTP client library: the clients share the machine with the servers, so they do
    as little as they can (as in bench/http_tier.py). The server writes each SSE event as
    one chunk of its chunked reply, so every `data: ` line arrives whole, between chunk
    headers that are lines of their own."""

    def __init__(self, stream: Stream, done: asyncio.Future):
        self.stream, self.done = stream, done
        self.buffer, self.headers_read = b"", False

    def data_received(self, data: bytes) -> None:
        now = time.perf_counter()
        self.buffer += data
        if not self.headers_read:
            if b"\r\n\r\n" not in self.buffer:
                return
            head, self.buffer = self.buffer.split(b"\r\n\r\n", 1)
            if not head.startswith(b"HTTP/1.1 200"):
                self._fail(SystemExit(f"HTTP error: {(head + self.buffer)[:400]!r}"))
                return
            self.headers_read = True
        *lines, self.buffer = self.buffer.split(b"\n")
        for line in lines:
            if not line.startswith(b"data: "):
                continue  # chunk sizes, blank lines, ": ping"
            if line.startswith(b"data: [DONE]"):
                if not self.done.done():
                    self.done.set_result(None)
                continue
            event = json.loads(line[6:])
            if event.get("usage"):
                self.stream.tokens = event["usage"]["completion_tokens"]
            for choice in event.get("choices") or ():
                delta = choice.get("delta") or {}
                if delta.get("content") or delta.get("reasoning_content"):
                    self.stream.pieces.append(now)

    def _fail(self, exc: BaseException) -> None:
        if not self.done.done():
            self.done.set_exception(exc)

    def connection_lost(self, exc) -> None:
        self._fail(exc or ConnectionError("the server closed the stream before [DONE]"))


async def stream_chat(port: int, model: str | None, prompt: str, max_tokens: int) -> Stream:
    body = json.dumps(chat_body(model, prompt, max_tokens, stream=True)).encode()
    loop = asyncio.get_running_loop()
    stream, done = Stream(), loop.create_future()
    transport, _ = await loop.create_connection(lambda: _SseReader(stream, done), "127.0.0.1", port)
    try:
        stream.sent = time.perf_counter()
        transport.write(b"POST /v1/chat/completions HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                        b"Content-Length: %d\r\n\r\n%s" % (len(body), body))
        await asyncio.wait_for(done, 600)
    finally:
        transport.close()
    if not stream.pieces or not stream.tokens:
        raise SystemExit(f"a streamed reply of {model or 'the model'} had no text or no usage")
    return stream


async def post(session: aiohttp.ClientSession, url: str, body: dict) -> dict:
    async with session.post(url, json=body) as resp:
        reply = await resp.json(content_type=None)
        if resp.status != 200:
            raise SystemExit(f"{url}: HTTP {resp.status}: {json.dumps(reply)[:400]}")
        return reply


class ShortReplies:
    """Counts replies shorter than max_tokens (an end the ban on EOS did not prevent)."""

    def __init__(self):
        self.count = 0

    def check(self, tokens: int, max_tokens: int) -> int:
        self.count += tokens < max_tokens
        return tokens


SHORT = ShortReplies()


# ---------------------------------------------------------------------------------- 1: cold start


async def cold_start(server: Server, rounds: int) -> dict:
    """Per sample: unload COLD, stream to it (cold), stream to it again (warm); then unload
    and time an admin load. Each prompt is new, so no sample hits the prefix cache."""
    for m in (MODEL_A, MODEL_B):  # kernels compiled before the first sample
        await stream_chat(server.port, m, "warm up", TTFT_TOKENS)
    cold, warm, loads = [], [], []
    async with aiohttp.ClientSession() as session:
        for i in range(rounds * TTFT_SAMPLES):
            await post(session, f"{server.url}/admin/models/unload", {"model": COLD})
            cold.append((await stream_chat(server.port, COLD, f"Cold sample {i}: tell me a story.", TTFT_TOKENS)).ttft)
            warm.append((await stream_chat(server.port, COLD, f"Warm sample {i}: tell me a story.", TTFT_TOKENS)).ttft)
            await post(session, f"{server.url}/admin/models/unload", {"model": COLD})
            t = time.perf_counter()
            await post(session, f"{server.url}/admin/models/load", {"model": COLD})
            loads.append(time.perf_counter() - t)
    cold_s, warm_s = statistics.median(cold), statistics.median(warm)
    return {"model": COLD, "cold_ttft_s": cold_s, "warm_ttft_s": warm_s, "ratio": cold_s / warm_s,
            "load_s": statistics.median(loads), "samples": {"cold_ttft_s": cold, "warm_ttft_s": warm, "load_s": loads}}


def print_cold_start(r: dict) -> None:
    n = len(r["samples"]["cold_ttft_s"])
    print(f"cold start of {r['model']} (fp32 from the fp16 file), medians of {n}:")
    print(f"  TTFT cold {r['cold_ttft_s'] * 1000:.0f} ms, warm {r['warm_ttft_s'] * 1000:.1f} ms, "
          f"cold/warm {r['ratio']:.1f}; a load (POST /admin/models/load) {r['load_s'] * 1000:.0f} ms")


# ---------------------------------------------------------------------------------- 2: two at once


async def alone(port: int, model: str, max_tokens: int, tag: str) -> float:
    s = await stream_chat(port, model, f"{tag}: tell me a long story.", max_tokens)
    SHORT.check(s.tokens, max_tokens)
    return s.decode_rate()


async def together(port: int, max_tokens: int, tag: str) -> dict[str, float]:
    """Both models streaming at once: each one's tokens/s while both decode (from the later
    first token to the earlier last one)."""
    streams = await asyncio.gather(*(stream_chat(port, m, f"{tag} {m}: tell me a long story.", max_tokens)
                                     for m in (MODEL_A, MODEL_B)))
    for s in streams:
        SHORT.check(s.tokens, max_tokens)
    start, end = max(s.pieces[0] for s in streams), min(s.pieces[-1] for s in streams)
    if end <= start:
        raise SystemExit("the two streams did not overlap: raise --max-tokens")
    return {m: s.tokens_between(start, end) / (end - start) for m, s in zip((MODEL_A, MODEL_B), streams)}


async def two_models(server: Server, rounds: int, max_tokens: int) -> dict:
    for m in (MODEL_A, MODEL_B):  # loaded (part 1 may have left COLD unloaded), kernels warm
        await stream_chat(server.port, m, "warm up", max_tokens)
    per_round = []
    for r in range(rounds):
        tag = f"Round {r}"
        fig: dict = {}
        # Alone and together in turn, reversed every other round, so drift falls on both.
        for part in (("a", "b", "ab") if r % 2 == 0 else ("ab", "b", "a")):
            if part == "ab":
                fig["together"] = await together(server.port, max_tokens, tag)
            else:
                m = MODEL_A if part == "a" else MODEL_B
                fig.setdefault("alone", {})[m] = await alone(server.port, m, max_tokens, tag)
        per_round.append(fig)
    best_alone = {m: max(f["alone"][m] for f in per_round) for m in (MODEL_A, MODEL_B)}
    # The best round of the pair (by its aggregate), not each model's best of different rounds.
    best = max(per_round, key=lambda f: sum(f["together"].values()))
    aggregate = sum(best["together"].values())
    mean_alone = statistics.mean(best_alone.values())
    return {"models": {MODEL_A: "fp16", MODEL_B: "fp32"}, "max_tokens": max_tokens, "alone_tps": best_alone,
            "together_tps": best["together"], "aggregate_tps": aggregate, "mean_alone_tps": mean_alone,
            "ratio": aggregate / mean_alone, "rounds": per_round}


def print_two_models(r: dict) -> None:
    print(f"two models decoding {r['max_tokens']} tokens each, tokens/s (best of {len(r['rounds'])} rounds):")
    print(f"  {'model':<14}{'alone':>10}{'together':>10}")
    for m, precision in r["models"].items():
        print(f"  {m + ' ' + precision:<14}{r['alone_tps'][m]:>10.1f}{r['together_tps'][m]:>10.1f}")
    print(f"  aggregate {r['aggregate_tps']:.1f} tok/s = {r['ratio']:.2f} × the mean alone "
          f"({r['mean_alone_tps']:.1f})")


# ---------------------------------------------------------------------------------- 3: routing


async def workload(server: Server, max_tokens: int, tag: str) -> dict[str, float]:
    """SEQUENTIAL non-streamed requests one after another, then CONCURRENT streams at once;
    tokens/s of each (completion tokens over the wall time)."""
    async with aiohttp.ClientSession() as session:
        tokens, t = 0, time.perf_counter()
        for i in range(SEQUENTIAL):
            reply = await post(session, f"{server.url}/v1/chat/completions",
                               chat_body(None, f"{tag} request {i}: tell me a story.", max_tokens, stream=False))
            tokens += SHORT.check(reply["usage"]["completion_tokens"], max_tokens)
        sequential = tokens / (time.perf_counter() - t)
    t = time.perf_counter()
    streams = await asyncio.gather(*(stream_chat(server.port, None, f"{tag} stream {i}: tell me a story.", max_tokens)
                                     for i in range(CONCURRENT)))
    concurrent = sum(SHORT.check(s.tokens, max_tokens) for s in streams) / (time.perf_counter() - t)
    return {"sequential": sequential, "concurrent": concurrent}


async def routing(old: Server, new: Server, rounds: int, max_tokens: int) -> dict:
    for server in (old, new):  # kernels compiled, batch shapes seen, on both sides
        await workload(server, max_tokens, "Warm-up")
    figures: dict = {"old": [], "new": []}
    for r in range(rounds):
        # A B, then B A: a drift within the run slows both sides alike. The same prompts
        # on both, new ones each round (no round hits the prefix cache of an earlier one).
        for side in (("old", "new") if r % 2 == 0 else ("new", "old")):
            figures[side].append(await workload(old if side == "old" else new, max_tokens, f"Round {r}"))
    result: dict = {}
    for part in ("sequential", "concurrent"):
        old_tps = [f[part] for f in figures["old"]]
        new_tps = [f[part] for f in figures["new"]]
        ratios = [n / o for n, o in zip(new_tps, old_tps)]
        result[part] = {"old_tps": max(old_tps), "new_tps": max(new_tps), "ratio": max(new_tps) / max(old_tps),
                        "round_ratios": ratios, "median_round_ratio": statistics.median(ratios),
                        "old_rounds": old_tps, "new_rounds": new_tps}
    return result


def print_routing(r: dict, rounds: int, max_tokens: int) -> None:
    print(f"routing overhead, one model: this tree against {r['baseline_ref']} ({r['baseline_commit'][:10]}), "
          f"{max_tokens} tokens a request, best of {rounds} rounds (goal: new/old ≥ 0.98):")
    print(f"  {'workload':<24}{'old tok/s':>10}{'new tok/s':>10}{'new/old':>9}{'median of rounds':>18}")
    labels = {"sequential": f"{SEQUENTIAL} sequential requests", "concurrent": f"{CONCURRENT} streams at once"}
    for part, label in labels.items():
        f = r[part]
        print(f"  {label:<24}{f['old_tps']:>10.1f}{f['new_tps']:>10.1f}{f['ratio']:>9.3f}"
              f"{f['median_round_ratio']:>18.3f}")


# ---------------------------------------------------------------------------------- main


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=3,
                        help=f"rounds of each part (default 3); the cold start takes {TTFT_SAMPLES} samples a round")
    parser.add_argument("--max-tokens", type=int, default=64,
                        help="tokens every decoding request asks for and gets (default 64)")
    parser.add_argument("--baseline-ref", default=DEFAULT_REF,
                        help=f"the commit the routing is compared with (default {DEFAULT_REF}, the one before the "
                             "many-models work)")
    parser.add_argument("--no-baseline", action="store_true", help="skip the routing comparison with --baseline-ref")
    parser.add_argument("--no-save", action="store_true", help=record.NO_SAVE_HELP)
    args = parser.parse_args()
    if args.rounds < 1 or args.max_tokens < 2:
        parser.error("--rounds must be at least 1 and --max-tokens at least 2")
    return args


def main() -> None:
    args = parse_args()
    os.environ.pop("OPENBLAS_CORETYPE", None)  # and so from every server's environment
    results: dict = {"model": "assets/models/demo.st (v7 L4 D256 V4096, fp16)", "rounds": args.rounds,
                     "max_tokens": args.max_tokens, "max_batch": MAX_BATCH,
                     "openblas_threads": os.environ.get("OPENBLAS_NUM_THREADS", "default")}

    note("starting a server with two models...")
    server = Server(ROOT, two_model_config(), models=2, label="two-model")
    try:
        results["cold_start"] = asyncio.run(cold_start(server, args.rounds))
        results["two_models"] = asyncio.run(two_models(server, args.rounds, args.max_tokens))
    finally:
        server.close()
    print_cold_start(results["cold_start"])
    print_two_models(results["two_models"])

    if args.no_baseline:
        results["routing"] = {"skipped": "--no-baseline"}
        print("routing overhead: skipped (--no-baseline)")
    else:
        with baseline_tree(args.baseline_ref) as (found, why):
            if found is None:
                results["routing"] = {"skipped": why}
                print(f"routing overhead: skipped: {why}")
            else:
                tree, commit = found
                # Both stay up (idle, a server takes no CPU) and take turns.
                note(f"starting {args.baseline_ref}'s server and this tree's "
                     "(a fresh checkout compiles its kernels)...")
                old = Server(tree, model_config(), models=1, label=f"baseline {args.baseline_ref}")
                try:
                    new = Server(ROOT, model_config(), models=1, label="this tree's")
                    try:
                        results["routing"] = asyncio.run(routing(old, new, args.rounds, args.max_tokens))
                    finally:
                        new.close()
                finally:
                    old.close()
                results["routing"].update(baseline_ref=args.baseline_ref, baseline_commit=commit)
                print_routing(results["routing"], args.rounds, args.max_tokens)

    results["short_replies"] = SHORT.count
    if SHORT.count:
        print(f"warning: {SHORT.count} replies stopped before --max-tokens; their rates count what came")
    print(json.dumps(results))
    record.save("many_models", results, args)


if __name__ == "__main__":
    main()
