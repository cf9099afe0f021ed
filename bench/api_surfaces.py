"""The same chat through OpenAI's, Ollama's and Anthropic's routes: what each API's
translation costs against OpenAI's route (part of bench/http_tier.py's run).

Each request asks for the same greedy reply of `tokens` tokens to the same prompt, so the
model does the same work whichever route it came through, and its prompt comes from the
prefix cache after the first turn; what differs is only the translation (reading the body,
planning, writing the events). The three routes take turns within each repeat, their order
rotated, so that other work on a shared machine slows them alike; the figure is each
route's median time over the repeats, and its ratio to OpenAI's.
"""

from __future__ import annotations

import asyncio
import json
import statistics
import time

import aiohttp

PROMPT = "Tell me a story about a lighthouse keeper and a storm."


def _bodies(model: str, tokens: int, stream: bool) -> dict[str, tuple[str, dict]]:
    messages = [{"role": "user", "content": PROMPT}]
    usage = {"stream_options": {"include_usage": True}} if stream else {}
    return {
        "openai": ("/v1/chat/completions", {"model": model, "messages": messages, "max_tokens": tokens,
                                            "temperature": 0, "stream": stream, "stop": None, **usage}),
        "ollama": ("/api/chat", {"model": model, "messages": messages, "stream": stream,
                                 "options": {"num_predict": tokens, "temperature": 0, "stop": []}}),
        "anthropic": ("/v1/messages", {"model": model, "messages": messages, "max_tokens": tokens,
                                       "temperature": 0, "stream": stream, "stop_sequences": []}),
    }


def _tokens(surface: str, body: bytes, stream: bool) -> int:
    """The reply's length as each API reports it, so a run can show that all did the same work."""
    if surface == "openai":
        if stream:
            last = [line for line in body.split(b"\n") if line.startswith(b"data: {")][-1]
            return json.loads(last[6:])["usage"]["completion_tokens"]
        return json.loads(body)["usage"]["completion_tokens"]
    if surface == "ollama":
        last = json.loads(body.strip().split(b"\n")[-1])
        return last["eval_count"]
    if stream:
        delta = [line for line in body.split(b"\n") if line.startswith(b"data: ") and b'"message_delta"' in line]
        return json.loads(delta[-1][6:])["usage"]["output_tokens"]
    return json.loads(body)["usage"]["output_tokens"]


async def _one(session: aiohttp.ClientSession, url: str, body: dict) -> tuple[float, bytes]:
    t = time.perf_counter()
    async with session.post(url, json=body) as resp:
        data = await resp.read()
        if resp.status != 200:
            raise SystemExit(f"{url}: HTTP {resp.status}: {data[:300]!r}")
    return time.perf_counter() - t, data


async def _compare(base: str, model: str, tokens: int, repeats: int, stream: bool) -> dict:
    bodies = _bodies(model, tokens, stream)
    names = list(bodies)
    times: dict[str, list[float]] = {name: [] for name in names}
    lengths: dict[str, int] = {}
    async with aiohttp.ClientSession() as session:  # one keep-alive connection, as SDK clients use
        for name in names:  # warm up: the prompt enters the prefix cache, each route's code is hot
            _, data = await _one(session, base + bodies[name][0], bodies[name][1])
            lengths[name] = _tokens(name, data, stream)
        for r in range(repeats):
            for name in names[r % 3:] + names[:r % 3]:
                elapsed, _ = await _one(session, base + bodies[name][0], bodies[name][1])
                times[name].append(elapsed)
    medians = {name: statistics.median(t) for name, t in times.items()}
    return {name: {"median_s": medians[name], "ratio_to_openai": medians[name] / medians["openai"],
                   "reply_tokens": lengths[name]} for name in names}


def compare_surfaces(port: int, model: str, *, tokens: int, repeats: int) -> dict:
    """{"stream": {...}, "whole": {...}}: each route's median time and its ratio to OpenAI's."""
    base = f"http://127.0.0.1:{port}"
    return {kind: asyncio.run(_compare(base, model, tokens, repeats, kind == "stream"))
            for kind in ("stream", "whole")}


def print_surfaces(results: dict) -> None:
    print(f"{'route':>10}{'kind':>8}{'median ms':>11}{'vs OpenAI':>11}{'tokens':>8}")
    for kind, by_route in results.items():
        for name, r in by_route.items():
            print(f"{name:>10}{kind:>8}{r['median_s'] * 1000:>11.1f}{r['ratio_to_openai']:>11.3f}"
                  f"{r['reply_tokens']:>8}")
