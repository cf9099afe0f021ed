"""Load: 64 concurrent streaming clients against max_batch 8, each sending 4 seeded
requests, on loopback against the server as its own process. Every stream must end with
[DONE] and say what the same request says alone; the metrics' token counters must equal
the replies' usage; the server's memory must come back to where it was."""

from __future__ import annotations

import asyncio
import json
import time

import aiohttp

from api_helpers import write_model
from process_helpers import ServerProcess, metrics_of

CLIENTS, REQUESTS_EACH, MAX_BATCH, MAX_TOKENS = 64, 4, 8, 12
MEMORY_SLACK = 16 << 20  # allocator noise; a leak of even 1 KB per request would pass this only at ~16k requests


def config_text(directory) -> str:
    return f"""
[model]
path = "{directory}"
name = "tiny.st"
max_batch = {MAX_BATCH}
token_chunk_size = 64
cache_bytes = 4194304
[listen]
ip = "127.0.0.1"
ping_interval = 0.2
"""


def request_body(client: int, n: int) -> dict:
    k = client * REQUESTS_EACH + n
    return {"model": "tiny", "stream": True, "stream_options": {"include_usage": True},
            "messages": [{"role": "user", "content": f"Client {client} asks question {n}: what of the number {k}?"}],
            "max_tokens": MAX_TOKENS, "temperature": 1.0, "top_p": 0.9, "seed": 1000 + k}


async def stream(session: aiohttp.ClientSession, url: str, body: dict) -> tuple[str, dict, str]:
    """(text, usage, finish_reason) of one streamed chat; asserts the stream's framing."""
    async with session.post(url, json=body) as resp:
        assert resp.status == 200, await resp.text()
        raw = (await resp.read()).decode()
    assert raw.endswith("data: [DONE]\n\n"), raw[-200:]
    events = [block[6:] for block in raw.split("\n\n") if block.startswith("data: ")]
    assert events[-1] == "[DONE]" and events.count("[DONE]") == 1
    chunks = [json.loads(e) for e in events[:-1]]
    text = "".join(c["choices"][0]["delta"].get("content") or "" for c in chunks if c["choices"])
    finish = [c["choices"][0]["finish_reason"] for c in chunks if c["choices"] and c["choices"][0]["finish_reason"]]
    assert len(finish) == 1, chunks
    usage = chunks[-1]["usage"]
    assert usage and not chunks[-1]["choices"]
    return text, usage, finish[0]


async def run_clients(port: int, requests_each: int) -> dict[tuple[int, int], tuple[str, dict, str]]:
    url = f"http://127.0.0.1:{port}/v1/chat/completions"
    connector = aiohttp.TCPConnector(limit=CLIENTS)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=300)) as session:

        async def client(c: int):
            return [await stream(session, url, request_body(c, n)) for n in range(requests_each)]

        results = await asyncio.gather(*(client(c) for c in range(CLIENTS)))
    return {(c, n): r for c, replies in enumerate(results) for n, r in enumerate(replies)}


async def run_alone(port: int, keys) -> dict[tuple[int, int], tuple[str, dict, str]]:
    url = f"http://127.0.0.1:{port}/v1/chat/completions"
    async with aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=60)) as session:
        return {key: await stream(session, url, request_body(*key)) for key in keys}


def test_64_streaming_clients_get_what_they_would_get_alone(tmp_path):
    write_model(tmp_path / "tiny.st")
    with ServerProcess(tmp_path, config_text(tmp_path)) as server:
        # Warm up with one round, so the baseline includes what any run allocates once.
        asyncio.run(run_clients(server.port, 1))
        baseline = server.rss()
        before = metrics_of(server.port)

        started = time.monotonic()
        replies = asyncio.run(run_clients(server.port, REQUESTS_EACH))
        loaded = time.monotonic() - started
        after = metrics_of(server.port)
        assert len(replies) == CLIENTS * REQUESTS_EACH
        assert all(finish in ("stop", "length") for _, _, finish in replies.values())
        generated = sum(u["completion_tokens"] for _, u, _ in replies.values())
        prompted = sum(u["prompt_tokens"] for _, u, _ in replies.values())
        assert generated > len(replies)
        assert after["rwkv:generation_tokens_total"] - before["rwkv:generation_tokens_total"] == generated
        assert after["rwkv:prompt_tokens_total"] - before["rwkv:prompt_tokens_total"] == prompted
        assert after["rwkv:request_success_total"] - before["rwkv:request_success_total"] == len(replies)
        # The batch was full while 64 clients waited for 8 slots.
        steps = after["rwkv:iterations_total"] - before["rwkv:iterations_total"]
        rows = after["rwkv:iteration_rows_total"] - before["rwkv:iteration_rows_total"]
        assert rows / steps > MAX_BATCH / 2, (rows, steps)
        assert after["rwkv:num_requests_running"] == 0 and after["rwkv:num_requests_waiting"] == 0

        started = time.monotonic()
        alone = asyncio.run(run_alone(server.port, sorted(replies)))
        one_by_one = time.monotonic() - started
        for key, (text, usage, finish) in replies.items():
            text_alone, usage_alone, finish_alone = alone[key]
            assert (text, finish) == (text_alone, finish_alone), (key, text, text_alone)
            assert usage["completion_tokens"] == usage_alone["completion_tokens"]
            assert usage["prompt_tokens"] == usage_alone["prompt_tokens"]
        assert len({text for text, _, _ in replies.values()}) > CLIENTS  # seeds and prompts really differ

        grown = server.rss() - baseline
        print(f"load: {len(replies)} streams, {generated} tokens, mean batch {rows / steps:.2f}, "
              f"{loaded:.1f} s ({one_by_one:.1f} s one by one), RSS {baseline / 2**20:.1f} MiB → {(baseline + grown) / 2**20:.1f} MiB")
        assert grown < MEMORY_SLACK, f"RSS grew by {grown / 2**20:.1f} MiB"
        assert server.terminate() == 0
