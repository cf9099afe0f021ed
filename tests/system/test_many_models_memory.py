"""An unloaded model gives its memory back to the system: the server process's resident
memory returns to within 10% of what it was before the model was loaded (CPU)."""

from __future__ import annotations

import json
import time
import urllib.request

from process_helpers import ServerProcess

from ai00_like.rwkv.formats.safetensors import write_safetensors
from ai00_like.rwkv.synthetic import make_checkpoint

MiB = 1 << 20


def post(server, path: str, body: dict) -> dict:
    request = urllib.request.Request(f"http://127.0.0.1:{server.port}{path}", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=300) as response:
        return json.loads(response.read())


def settled_rss(server) -> int:
    """The process's resident memory once it stops moving (freed pages go back in steps)."""
    last = server.rss()
    for _ in range(20):
        time.sleep(0.2)
        now = server.rss()
        if abs(now - last) < 2 * MiB:
            return now
        last = now
    return last


def test_rss_is_back_within_ten_percent_after_an_unload(tmp_path):
    # Of the same head size as the big one, so that the first request compiles every kernel
    # the big one runs (compiled code is not given back).
    warm = make_checkpoint("7", n_layer=1, n_embd=128, head_size=64, vocab=65536, seed=6)
    write_safetensors(warm, tmp_path / "warm.st", dtype="fp32")
    # About 200 MiB of fp32 weights: large beside the runtime, small for the machine.
    big = make_checkpoint("7", n_layer=6, n_embd=768, head_size=64, vocab=65536, seed=7)
    write_safetensors(big, tmp_path / "big.st", dtype="fp32")
    config = f"""
[model]
path = "{tmp_path}"
name = ""
[[models]]
name = "warm.st"
device = "cpu"
precision = "fp32"
cache_bytes = 1048576
max_batch = 2
load = "startup"
[[models]]
name = "big.st"
device = "cpu"
precision = "fp32"
cache_bytes = 1048576
max_batch = 2
[responses]
store = false
[listen]
ip = "127.0.0.1"
"""
    chat = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}
    with ServerProcess(tmp_path, config) as server:
        # The kernels of the same weight form compiled and run once: their code stays.
        post(server, "/v1/chat/completions", {**chat, "model": "warm"})
        before = settled_rss(server)
        post(server, "/v1/chat/completions", {**chat, "model": "big"})
        loaded = settled_rss(server)
        assert loaded - before > 150 * MiB, (before, loaded)
        post(server, "/admin/models/unload", {"model": "big"})
        after = settled_rss(server)
        assert after <= before * 1.10, f"{before / MiB:.0f} MiB before, {loaded / MiB:.0f} loaded, {after / MiB:.0f} after"
