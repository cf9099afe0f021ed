"""Prefix cache benchmark: time to first token of a long fixed prefix, cold and from each tier.

A client such as Open WebUI sends the same long system prompt (its tools prompt is 13,656
tokens) before every question. The prefix state cache keeps the exact RNN state after it;
this measures, in one run, the time to the first streamed content chunk of a chat request
whose system message is a fixed ~13,000-token prefix (seeded synthetic text, counted with
the World tokenizer; `--prefix-tokens`) followed by a short question of its own:

* cold: nothing cached (fresh cache folder, fresh Redis);
* memory: the same server, the prefix read by the cold request (another question); and
  once more on the restarted server right after the disk case, the figure being the mean
  of the two (so that a change of the shared machine's speed falls on both cases);
* disk: after a clean restart of that server (SIGTERM, wait for exit: the memory cache is
  written to `[cache] path`) on the same folder; the request waits while the disk tier's
  reader thread reads the entry;
* shared: a second server with an empty cache folder of its own; both name one
  redis-server (`[store] url`, started by this script on 127.0.0.1). Until the prefix
  cache has a shared tier on Redis this case computes the whole prompt (it is ~cold), and
  the table says so: whether a case was served from a cache is read from the reply's
  usage (`prompt_tokens_details.cached_tokens`), not assumed.

Also the disk entry that the disk case read: its file size and the time to read it and
decode it (`cache_tier.decode_entry`) in this process, median of 3 (the page cache is
warm, as it was for the server's read). Ratios: disk/cold, disk/(memory + read),
shared/cold; the goal is disk within 5% of memory + read and under 2% of cold at 1.5B.
A hit resumes from the last checkpoint (`checkpoint_interval`, 256 tokens) inside the
prefix, so memory, disk and shared all compute the rest of the prefix after it and the
question; the table shows the tokens each case computed.

Every server is `python -m ai00_like --config <file>` in a subprocess, on 127.0.0.1, with
a config this script writes into a private temporary folder (removed at the end, with the
cache folders and Redis), OPENBLAS_CORETYPE left out of its environment (bench/engine.py
says why), a memory cache (`cache_bytes`) that holds every checkpoint of the prefix, and
the seeded bf16 v7 checkpoint of the shape (bench/shapes.py, made once in bench/.cache).
Replies are one greedy token, forced by `logit_bias` to one plain word, so that every
case's first content chunk comes one step after its prompt. Each round uses a prefix of
its own; the table gives the medians over `--rounds`.

    .venv/bin/python bench/prefix_cache.py [--rounds 3]
    .venv/bin/python bench/prefix_cache.py --shape 1.5b          # one round
    .venv/bin/python bench/prefix_cache.py --shape 1.5b --prefix-tokens 4000
    .venv/bin/python bench/prefix_cache.py --shape quick --rounds 1 --prefix-tokens 2000 --no-save  # smoke

Needs `redis-server` (the Debian package) for the shared case; `--no-shared` skips it.
Prints a table and one JSON line.
"""

from __future__ import annotations

import argparse
import collections
import json
import os
import re
import shutil
import signal
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import httpx
import msgspec
import numpy as np
import redis

# This tree's package before any installed one (a venv shared by several checkouts): the
# servers run this tree (PYTHONPATH below), and the disk entry must be decoded by the same code.
sys.path[:0] = [str(Path(__file__).resolve().parents[1]), str(Path(__file__).resolve().parent)]
import record  # noqa: E402
from local import free_port, note  # noqa: E402
from conversation import first_token_seconds  # noqa: E402
from shapes import SHAPES, bf16_checkpoint  # noqa: E402

from ai00_like.backend.cache_tier import MAGIC as ENTRY_MAGIC, decode_entry  # noqa: E402
from ai00_like.backend.disk_cache import SUFFIX  # noqa: E402
from ai00_like.response_store.state_blob import MAGIC as BLOB_MAGIC  # noqa: E402
from ai00_like.rwkv.tokenizer import default_tokenizer_path, load_tokenizer  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
SHAPE_NAMES = {name.lower(): name for name in SHAPES}
CHECKPOINT_INTERVAL = 256  # the server's default, which the cache budget is sized for
CASES = ("cold", "memory", "disk", "shared")
FORCED_WORD = " Sure"  # the one token every reply is forced to (a whole word: its chunk is text at once)
LOADED = re.compile(r"model (\S+) loaded in ([0-9.]+) s")
WORDS = ("file read write search query result name path folder user tool value list number text date time "
         "string object array field return call error option default required optional format send "
         "message parameter description schema type boolean integer request response header body page "
         "image table column row key index limit offset filter order source target open close start stop").split()


# ---------------------------------------------------------------------------------- the prompt


def prefix_text(tokenizer, tokens: int, seed: int) -> str:
    """Seeded text shaped like a tools prompt that the World tokenizer reads as about `tokens`
    tokens: enough lines, cut at `tokens` ids and decoded back."""
    rng = np.random.default_rng(seed)
    lines = [f"Prefix {seed}. You can call the following tools; answer with one call when a tool fits."]
    count, i = 0, 0
    while count < tokens + 64:
        words = " ".join(rng.choice(WORDS, 40))
        lines.append(f'{{"name": "tool_{seed}_{i}", "description": "{words}.", "parameters": '
                     f'{{"{rng.choice(WORDS)}": "{rng.choice(WORDS)}"}}}}')
        count += 64  # under a line's tokens: the loop overshoots, never stops short
        i += 1
    ids = tokenizer.encode("\n".join(lines))
    if len(ids) < tokens:
        raise SystemExit(f"prefix text of {len(ids)} tokens, short of {tokens}")
    return tokenizer.decode(ids[:tokens]).rstrip()


def question(round_: int, case: str) -> str:
    return f"Question {round_}-{case}: which of the tools above reads a file, and what does it return?"


def chat_body(prefix: str, text: str, forced: int) -> dict:
    return {"messages": [{"role": "system", "content": prefix}, {"role": "user", "content": text}],
            "max_tokens": 1, "temperature": 0, "logit_bias": {str(forced): 100}, "stop": None,
            "stream_options": {"include_usage": True}}


# ---------------------------------------------------------------------------------- processes


def state_bytes(shape: str) -> int:
    """One fp32 state of a v7 model of `shape`: per layer the wkv matrices and two shifts."""
    dims = SHAPES[shape]
    return dims["n_layer"] * (dims["n_embd"] * dims["head_size"] + 2 * dims["n_embd"]) * 4


def cache_budget(shape: str, prefix_tokens: int) -> int:
    """A memory cache that holds every checkpoint of the prefix, the whole prompts' entries
    (with their logits) and the warm-up's, with room to spare."""
    entries = prefix_tokens // CHECKPOINT_INTERVAL + 16
    return int(1.25 * entries * (state_bytes(shape) + SHAPES[shape]["vocab"] * 4)) + (64 << 20)


class Server:
    """`python -m ai00_like --config FILE` in a subprocess, once its model is loaded."""

    def __init__(self, name: str, folder: Path, model: Path, cache: Path, settings: dict):
        self.name, self.port = name, free_port()
        config = folder / f"{name}.toml"
        config.write_text(
            f'[model]\npath = "{model.parent}"\nname = "{model.name}"\ndevice = "cpu"\nmax_batch = 2\n'
            f'cache_bytes = {settings["cache_bytes"]}\ncheckpoint_interval = {CHECKPOINT_INTERVAL}\n\n'
            f'[listen]\nip = "127.0.0.1"\nport = {self.port}\nreplica = "{name}"\n\n'
            f'[server]\nserve_folder = false\n\n'
            f'[cache]\npath = "{cache}"\ndisk_bytes = {settings["disk_bytes"]}\n\n'
            f'[responses]\npath = "{folder / (name + "-responses")}"\n\n'
            + (f'[store]\nurl = "{settings["store_url"]}"\nprefix = "bench:"\n' if settings["store_url"] else ""),
            encoding="utf-8")
        env = {k: v for k, v in os.environ.items() if k != "OPENBLAS_CORETYPE"}
        env.update(PYTHONPATH=str(ROOT), PYTHONUNBUFFERED="1")
        self.proc = subprocess.Popen([sys.executable, "-m", "ai00_like", "--config", str(config)], cwd=ROOT, env=env,
                                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                     text=True)
        self.tail: collections.deque = collections.deque(maxlen=40)
        self.loaded = threading.Event()
        threading.Thread(target=self._read, daemon=True).start()  # the pipe never fills
        self.url = f"http://127.0.0.1:{self.port}"

    def _read(self) -> None:
        for line in self.proc.stderr:
            self.tail.append(line)
            if LOADED.search(line):
                self.loaded.set()

    def wait_loaded(self, seconds: float = 900) -> None:
        deadline = time.monotonic() + seconds
        while not self.loaded.wait(0.5):
            if self.proc.poll() is not None or time.monotonic() > deadline:
                self.kill()
                why = f"exited ({self.proc.returncode})" if self.proc.returncode is not None else "timed out"
                raise SystemExit(f"server {self.name} {why} before loading its model:\n{''.join(self.tail)}")

    def stop(self, seconds: float = 600) -> float:
        """SIGTERM and wait for a clean exit (the memory cache is written to disk meanwhile);
        the seconds it took. A server that does not exit in time is killed: an error."""
        t = time.perf_counter()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(seconds)
            except subprocess.TimeoutExpired:
                self.kill()
                raise SystemExit(f"server {self.name} did not stop within {seconds:.0f} s") from None
        if self.proc.returncode != 0:
            raise SystemExit(f"server {self.name} exited with {self.proc.returncode}:\n{''.join(self.tail)}")
        return time.perf_counter() - t

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait(60)


class Redis:
    """redis-server on 127.0.0.1 and a free port, in `folder`, persisting nothing."""

    def __init__(self, folder: Path):
        self.port = free_port()
        self.proc = subprocess.Popen(["redis-server", "--port", str(self.port), "--bind", "127.0.0.1", "--dir",
                                      str(folder), "--save", "", "--appendonly", "no"],
                                     stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self.url = f"redis://127.0.0.1:{self.port}/0"
        self.client = redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=30)
        deadline = time.monotonic() + 30
        while True:
            try:
                self.client.ping()
                return
            except redis.ConnectionError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    self.close()
                    raise SystemExit("redis-server did not start") from None
                time.sleep(0.1)

    def flush(self) -> None:
        self.client.flushall()

    def close(self) -> None:
        self.client.close()
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(30)


# ---------------------------------------------------------------------------------- measuring


def timed(server: Server, prefix: str, text: str, forced: int, timeout: float) -> dict:
    """Seconds to the first content chunk of one streamed chat request, and its usage."""
    with httpx.Client(base_url=server.url, timeout=timeout) as client:
        seconds, reply, last, _ = first_token_seconds(client, "/v1/chat/completions", chat_body(prefix, text, forced))
    if not reply:
        raise SystemExit(f"server {server.name}: a reply with no text")
    usage = last.get("usage") or {}
    prompt = usage.get("prompt_tokens", 0)
    cached = (usage.get("prompt_tokens_details") or {}).get("cached_tokens", 0)
    return {"ttft_s": seconds, "prompt_tokens": prompt, "cached_tokens": cached, "computed_tokens": prompt - cached}


def entry_file(cache: Path, length: int) -> Path | None:
    """The disk tier's file of the prefix of `length` tokens (its name carries the length)."""
    found = sorted(cache.glob(f"*/*.{length}.[ls]{SUFFIX}")) if length else []
    return found[0] if found else None


def model_key(data: bytes) -> str:
    """The model key an entry was written for, from the header of its state blob (after the
    entry's MAGIC, checksum and blob length: the blob's MAGIC, header length and header,
    a msgpack array whose first item is the key; response_store/state_blob.py)."""
    blob = len(ENTRY_MAGIC) + 32 + 4
    start = blob + len(BLOB_MAGIC) + 4
    (length,) = struct.unpack_from("<I", data, start - 4)
    return msgspec.msgpack.decode(data[start:start + length])[0]


def read_entry(path: Path, repeats: int = 3) -> dict:
    """The entry's size and the time to read its file and decode it, as the reader thread does."""
    key, times = model_key(path.read_bytes()), []
    for _ in range(repeats):
        t = time.perf_counter()
        state, _ = decode_entry(path.read_bytes(), key)
        times.append(time.perf_counter() - t)
    return {"file": path.name, "tokens": int(path.name.split(".")[1]), "bytes": path.stat().st_size,
            "read_decode_s": statistics.median(times), "read_decode_s_each": times}


def files_in(cache: Path) -> int:
    return sum(1 for _ in cache.glob(f"*/*{SUFFIX}"))


def one_round(r: int, args, model: Path, tokenizer, forced: int, store: Redis | None, tmp: Path) -> dict:
    """Cold and memory on server a; a's clean stop; disk on a restarted, shared on b."""
    folder = tmp / f"round{r}"
    folder.mkdir()
    caches = {"a": folder / "cache-a", "b": folder / "cache-b"}
    settings = {"cache_bytes": args.cache_bytes, "disk_bytes": 4 * args.cache_bytes,
                "store_url": store.url if store else ""}
    prefix = prefix_text(tokenizer, args.prefix_tokens, seed=r + 1)
    # Kernels run at prefill sizes before any timing, in every server process: the warm-up
    # stays under [cache] min_tokens (256), so no tier keeps it and a restarted server runs
    # it through the model too (a warm-up read from disk would leave the prefill kernels'
    # first use, some 140 ms at 0.1B, to the disk case).
    warm = prefix_text(tokenizer, 200, seed=1000 + r)
    timeout = 600 + 0.2 * args.prefix_tokens
    if store:
        store.flush()
    out: dict = {"prefix_chars": len(prefix)}
    servers: list[Server] = []
    try:
        a = Server("a", folder, model, caches["a"], settings)
        servers.append(a)
        a.wait_loaded()
        timed(a, warm, "Warm-up.", forced, timeout)
        note(f"round {r + 1}: cold...")
        out["cold"] = timed(a, prefix, question(r, "cold"), forced, timeout)
        out["memory"] = timed(a, prefix, question(r, "memory"), forced, timeout)
        out["stop_s"] = a.stop()
        out["entries_written"] = files_in(caches["a"])
        restarted = Server("a-restarted", folder, model, caches["a"], settings)
        servers.append(restarted)
        b = Server("b", folder, model, caches["b"], settings) if store else None
        servers += [b] if b else []
        for s in servers[1:]:  # loading side by side
            s.wait_loaded()
            timed(s, warm, "Warm-up.", forced, timeout)
        note(f"round {r + 1}: disk...")
        out["disk"] = timed(restarted, prefix, question(r, "disk"), forced, timeout)
        # A memory hit beside the disk one (the entry the disk read is in memory now): the
        # case's figure is the mean of the two, so a shift of the machine's speed between the
        # restart and the first server weighs on memory as on disk.
        again = timed(restarted, prefix, question(r, "memory again"), forced, timeout)
        out["memory_samples_s"] = [out["memory"]["ttft_s"], again["ttft_s"]]
        out["memory"]["ttft_s"] = statistics.mean(out["memory_samples_s"])
        if b:
            note(f"round {r + 1}: shared...")
            out["shared"] = timed(b, prefix, question(r, "shared"), forced, timeout)
        for s in servers[1:]:
            s.stop()
    finally:
        for s in servers:
            s.kill()
    entry = entry_file(caches["a"], out["disk"]["cached_tokens"])
    out["disk_entry"] = read_entry(entry) if entry else None
    shutil.rmtree(folder, ignore_errors=True)  # a round's cache folders (GiB at 1.5B)
    return out


# ---------------------------------------------------------------------------------- the report


def round_ratios(r: dict) -> dict:
    cold, memory, disk = (r[c]["ttft_s"] for c in ("cold", "memory", "disk"))
    ratios = {"memory/cold": memory / cold, "disk/cold": disk / cold}
    if r["disk_entry"]:
        ratios["disk/(memory+read)"] = disk / (memory + r["disk_entry"]["read_decode_s"])
    if "shared" in r:
        ratios["shared/cold"] = r["shared"]["ttft_s"] / cold
    return ratios


def summarise(rounds: list[dict], shared_on: bool) -> dict:
    """Medians over the rounds of each case and of the disk entry's read, and the ratios."""
    cases = [c for c in CASES if c in rounds[0]]
    med = {c: {k: statistics.median(r[c][k] for r in rounds) for k in rounds[0][c]} for c in cases}
    entries = [r["disk_entry"] for r in rounds if r["disk_entry"]]
    entry = {"bytes": statistics.median(e["bytes"] for e in entries),
             "tokens": statistics.median(e["tokens"] for e in entries),
             "read_decode_s": statistics.median(e["read_decode_s"] for e in entries)} if entries else None
    # Each round's ratios, then their medians: a shared machine's speed moves between rounds
    # (4x within one run), so a ratio of medians from different rounds compares unlike times.
    each = [round_ratios(r) for r in rounds]
    ratios = {k: statistics.median(e[k] for e in each) for k in each[0] if all(k in e for e in each)}
    # A shared tier that served the second server shows as cached tokens; none means it computed it all.
    shared = None if not shared_on else ("active" if med["shared"]["cached_tokens"] >= CHECKPOINT_INTERVAL
                                         else "none in this build: the second server computed the whole prompt")
    return {"median": med, "disk_entry": entry, "ratios": ratios, "round_ratios": each, "shared_tier": shared,
            "stop_s": statistics.median(r["stop_s"] for r in rounds),
            "entries_written": statistics.median(r["entries_written"] for r in rounds)}


def seconds(s: float) -> str:
    return f"{s:.2f} s" if s >= 10 else f"{s * 1000:.0f} ms" if s >= 0.1 else f"{s * 1000:.1f} ms"


def print_table(results: dict) -> None:
    s, n = results["summary"], len(results["rounds"])
    print(f"v7 {results['shape']} ({results['model']}), prefix {results['prefix_tokens']:,} tokens, "
          f"{n} round{'s' if n > 1 else ''}{', medians' if n > 1 else ''}:")
    print(f"  {'case':<10}{'TTFT':>12}{'x cold':>9}{'computed':>10}{'cached':>9}  (tokens)")
    cold = s["median"]["cold"]["ttft_s"]
    for case, m in s["median"].items():
        label = case if case != "shared" or s["shared_tier"] == "active" else "shared *"
        print(f"  {label:<10}{seconds(m['ttft_s']):>12}{m['ttft_s'] / cold:>9.4f}{m['computed_tokens']:>10,.0f}"
              f"{m['cached_tokens']:>9,.0f}")
    if s["shared_tier"] and s["shared_tier"] != "active":
        print(f"  * shared tier: {s['shared_tier']} (~cold)")
    e = s["disk_entry"]
    if e:
        print(f"  disk entry: {e['bytes'] / 2**20:.1f} MiB file ({e['tokens']:,.0f} tokens), read + decode "
              f"{seconds(e['read_decode_s'])} (median of 3, page cache warm)")
    print(f"  clean stop: {seconds(s['stop_s'])}, {s['entries_written']:.0f} entries on disk after it")
    r = s["ratios"]
    if n > 1:
        print("  ratios: medians of the rounds' own (per round: " + "; ".join(
            ", ".join(f"{v:.3f}" for v in e.values()) for e in s["round_ratios"]) + f" as {', '.join(r)})")
    print(f"  disk / cold = {r['disk/cold']:.4f} (goal at 1.5B: < 0.02)")
    if "disk/(memory+read)" in r:
        print(f"  disk / (memory + read) = {r['disk/(memory+read)']:.3f} (goal: <= 1.05)")
    if "shared/cold" in r:
        marked = "" if s["shared_tier"] == "active" else "  (* no shared tier: ~1 expected)"
        print(f"  shared / cold = {r['shared/cold']:.4f}{marked}")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--shape", type=str.lower, choices=list(SHAPE_NAMES), default="0.1b",
                        help="the seeded v7 checkpoint's shape (bench/shapes.py; default 0.1b)")
    parser.add_argument("--rounds", type=int, default=None,
                        help="rounds, each with a prefix of its own; medians reported (default 3, 1 for 1.5b)")
    parser.add_argument("--prefix-tokens", type=int, default=13000,
                        help="the fixed prefix's length in World tokens (default 13000)")
    parser.add_argument("--no-shared", action="store_true", help="skip the shared case (and redis-server)")
    parser.add_argument("--no-save", action="store_true", help=record.NO_SAVE_HELP)
    args = parser.parse_args()
    if args.rounds is None:
        args.rounds = 1 if args.shape == "1.5b" else 3
    if args.rounds < 1 or args.prefix_tokens < 2 * CHECKPOINT_INTERVAL:
        parser.error(f"--rounds must be at least 1 and --prefix-tokens at least {2 * CHECKPOINT_INTERVAL}")
    if not args.no_shared and not shutil.which("redis-server"):
        parser.error("redis-server is not installed (apt-get install redis-server), or pass --no-shared")
    return args


def main() -> None:
    args = parse_args()
    shape = SHAPE_NAMES[args.shape]
    args.cache_bytes = cache_budget(shape, args.prefix_tokens)
    note(f"checkpoint of the {shape} shape (made once in bench/.cache)...")
    model = bf16_checkpoint(shape)
    tokenizer = load_tokenizer(default_tokenizer_path())
    forced = tokenizer.encode(FORCED_WORD)
    if len(forced) != 1:
        raise SystemExit(f"{FORCED_WORD!r} is not one token")
    rounds = []
    with tempfile.TemporaryDirectory(prefix="prefix_cache-") as tmp:
        store = None if args.no_shared else Redis(Path(tmp))
        try:
            for r in range(args.rounds):
                rounds.append(one_round(r, args, model, tokenizer, forced[0], store, Path(tmp)))
                note(f"round {r + 1}: " + ", ".join(f"{c} {seconds(rounds[-1][c]['ttft_s'])}"
                                                    for c in CASES if c in rounds[-1]))
        finally:
            if store:
                store.close()
    results = {"shape": shape, "model": f"{model.name}, served as bf16", "prefix_tokens": args.prefix_tokens,
               "checkpoint_interval": CHECKPOINT_INTERVAL, "cache_bytes": args.cache_bytes,
               "openblas_threads": os.environ.get("OPENBLAS_NUM_THREADS", "default"),
               "summary": summarise(rounds, not args.no_shared), "rounds": rounds}
    print_table(results)
    print(json.dumps(results))
    record.save("prefix_cache", results, args)


if __name__ == "__main__":
    main()
