"""Serving-core benchmark (no HTTP): what the scheduler, sampler and cache cost or save.

* aggregate decode tokens/s with 1, 4, 16 and 64 concurrent requests, against the
  engine's own batched step rate at that batch size (target ≥ 95% at 16 and 64). Each
  side is its best of `--repeats` runs, so a burst of other work on a shared machine
  does not decide the ratio;
* time to first token of a 2,000-token prompt, cold and as a prefix-cache hit
  (target: hit ≤ 5% of cold);
* time to first token of a short request sent while a 4,000-token prompt is being
  prefilled, in steps of the prefill (target ≤ 3 steps).

Prints a table and one JSON line. Uses the seeded 0.1B-shaped v7 checkpoint of
bench/engine.py (made on first use).

    .venv/bin/python bench/serve.py [--quick] [--repeats 3]
"""

from __future__ import annotations

import argparse
import json
import queue
import statistics
import sys
import threading
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
import record  # noqa: E402
from engine import checkpoint  # noqa: E402

from ai00_like.messages import Cancel, Failed, Finished, Generate, Load, Loaded, ModelSpec, TextPiece  # noqa: E402
from ai00_like.middleware import Middleware  # noqa: E402
from ai00_like.rwkv import load_model  # noqa: E402
from ai00_like.rwkv.batch import StepInput  # noqa: E402
from ai00_like.sampler import Nucleus, SamplingOptions  # noqa: E402

CHUNK = 256
OPTIONS = SamplingOptions(sampler=Nucleus(), seed=1)  # Ai00's default sampler, seeded


def in_own_thread(fn, *args):
    """fn(*args) in a thread that ends with it, as the server steps its model in a thread of
    its own: a thread that has launched numba's parallel kernels keeps an OpenMP team for
    as long as it lives, and this one's would slow the serving core's (cpu/model.py)."""
    result = []
    thread = threading.Thread(target=lambda: result.append(fn(*args)))
    thread.start()
    thread.join()
    if not result:
        raise SystemExit(f"{fn.__name__} failed")
    return result[0]


def engine_step_rate(path, batch: int, steps: int = 12) -> float:
    model = load_model(path, max_batch=batch)
    inputs = [StepInput(i, [100 + i]) for i in range(batch)]
    model.step(inputs)
    # Tokens over the whole run's time, as serving_rate counts them: a median step would
    # leave out the hiccups of a shared machine that the serving side's total includes.
    t = time.perf_counter()
    for _ in range(steps):
        model.step(inputs)
    return batch * steps / (time.perf_counter() - t)


def prefill_step_time(path) -> float:
    model = load_model(path, max_batch=2)
    tokens = np.random.default_rng(0).integers(1, 65530, CHUNK).tolist()
    model.step([StepInput(0, tokens, "none"), StepInput(1, [5])])
    times = []
    for _ in range(3):
        model.reset(0)
        t = time.perf_counter()
        model.step([StepInput(0, tokens, "none"), StepInput(1, [5])])
        times.append(time.perf_counter() - t)
    return statistics.median(times)


class Client:
    def __init__(self):
        self.events: queue.Queue = queue.Queue()
        self.first_token_at = None
        self.token_times: list[float] = []
        self.tokens = 0

    def __call__(self, event):
        if isinstance(event, TextPiece) and event.tokens:
            now = time.perf_counter()
            if self.first_token_at is None:
                self.first_token_at = now
            self.token_times.extend([now] * len(event.tokens))
        self.events.put(event)

    def wait(self):
        while True:
            event = self.events.get(timeout=600)
            if isinstance(event, TextPiece):
                self.tokens += len(event.tokens)
            if isinstance(event, Failed):
                raise SystemExit(f"request failed: {event.message}")
            if isinstance(event, Finished):
                return self


def start(path, max_batch: int) -> Middleware:
    mw = Middleware()
    box: queue.Queue = queue.Queue()
    mw.send(Load(ModelSpec(path=str(path), max_batch=max_batch, token_chunk_size=CHUNK), box.put))
    if not isinstance(box.get(timeout=600), Loaded):
        raise SystemExit("load failed")
    return mw


def send(mw, prompt: str, max_tokens: int) -> Client:
    client = Client()
    mw.send(Generate(prompt=prompt, reply=client, cancel=Cancel(), options=OPTIONS, max_tokens=max_tokens,
                     stop=(), stop_on_eos=False))
    return client


def serving_rate(path, concurrent: int, max_tokens: int) -> float:
    mw = start(path, concurrent)
    try:
        send(mw, "warm up", 2).wait()
        clients = [send(mw, f"Request {i}:", max_tokens) for i in range(concurrent)]
        for c in clients:
            c.wait()
        # Decoding only: from the moment every request has its first token (all prompts
        # are in) to the last token.
        all_in = max(c.first_token_at for c in clients)
        end = max(c.token_times[-1] for c in clients)
        return sum(sum(t > all_in for t in c.token_times) for c in clients) / (end - all_in)
    finally:
        mw.close()


def words(n: int, seed: int) -> str:
    rng = np.random.default_rng(seed)
    vocab = "the of and to in that is was he for it with as his on be at by this had not are but from".split()
    return " ".join(rng.choice(vocab, n))


def ttft_cold_and_hit(path) -> tuple[float, float, int]:
    mw = start(path, 2)
    try:
        prompt = words(2000, 1)
        t = time.perf_counter()
        cold = send(mw, prompt, 1).wait()
        cold_s = cold.first_token_at - t
        t = time.perf_counter()
        hit = send(mw, prompt, 1).wait()
        return cold_s, hit.first_token_at - t, len(prompt.split())
    finally:
        mw.close()


def ttft_beside_long_prefill(path) -> float:
    mw = start(path, 2)
    try:
        long = send(mw, words(4000, 2), 1)
        time.sleep(0.5)  # let the long prefill get going (a benchmark, not a test)
        t = time.perf_counter()
        short = send(mw, "Hello there", 1).wait()
        ttft = short.first_token_at - t
        long.wait()
        return ttft
    finally:
        mw.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="the small model of bench/engine.py --quick")
    parser.add_argument("--repeats", type=int, default=3, help="runs per side and concurrency; the best counts")
    parser.add_argument("--no-save", action="store_true", help=record.NO_SAVE_HELP)
    args = parser.parse_args()
    path, _ = checkpoint("quick" if args.quick else "0.1B")
    results: dict = {"shape": "quick" if args.quick else "0.1B", "repeats": args.repeats, "decode": {}}
    print(f"{'concurrent':>10}{'serving tok/s':>16}{'engine tok/s':>15}{'ratio':>8}")
    for n in (1, 4, 16, 64):
        engine = max(in_own_thread(engine_step_rate, path, n) for _ in range(args.repeats))
        serving = max(serving_rate(path, n, max_tokens=32) for _ in range(args.repeats))
        results["decode"][n] = {"serving_tps": serving, "engine_tps": engine, "ratio": serving / engine}
        print(f"{n:>10}{serving:>16.1f}{engine:>15.1f}{serving / engine:>8.2f}")
    cold, hit, _ = ttft_cold_and_hit(path)
    results["ttft_2000"] = {"cold_s": cold, "hit_s": hit, "ratio": hit / cold}
    print(f"TTFT of a 2,000-word prompt: cold {cold * 1000:.0f} ms, cache hit {hit * 1000:.1f} ms "
          f"({hit / cold:.1%} of cold)")
    step = in_own_thread(prefill_step_time, path)
    beside = ttft_beside_long_prefill(path)
    results["ttft_beside_prefill"] = {"ttft_s": beside, "prefill_step_s": step, "steps": beside / step}
    print(f"TTFT of a short request beside a 4,000-word prefill: {beside * 1000:.0f} ms = "
          f"{beside / step:.2f} prefill steps of {step * 1000:.0f} ms")
    print(json.dumps(results))
    record.save("serve", results, args)


if __name__ == "__main__":
    main()
