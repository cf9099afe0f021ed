"""The prefix state cache's shared tier ([store] url = "redis://…") with Debian's real
redis-server and replicas as separate processes, each with a cache folder of its own: a
long prompt one replica read is found by another (every prompt token cached, the same
greedy reply, a shared hit in its /metrics); other weights never use it; Redis stopped
mid-way leaves both answering as before, and Redis back is used again. Plus the tier
alone against Redis (an entry of other weights under this model's key is dropped, never
used) and the config that turns it on."""

from __future__ import annotations

import logging
import shutil
import threading
import time
from contextlib import ExitStack

import numpy as np
import pytest
from api_helpers import replica_folders
from process_helpers import REDIS, RedisProcess, ServerProcess, metrics_of, process_config
import httpx

from ai00_like.backend.cache_tier import encode_entry
from ai00_like.backend.shared_cache import SharedCache
from ai00_like.backend.state_cache import token_key
from ai00_like.config import parse_config
from ai00_like.rwkv.state import State

pytestmark = pytest.mark.skipif(not shutil.which(REDIS), reason="redis-server is not installed")

PREFIX = "test-pc:"
WAIT = 60  # s: the longest a condition may take to come true (writes land on a thread)


def long_prompt(tag: str) -> str:
    """About 500 tokens: past [cache] min_tokens (256) and one checkpoint."""
    return f"{tag}: " + " ".join(f"w{i}" for i in range(200)) + " Tell me more."


def ask(server: ServerProcess, content: str) -> dict:
    body = {"model": "tiny", "messages": [{"role": "user", "content": content}], "max_tokens": 8, "temperature": 0}
    reply = httpx.post(f"http://127.0.0.1:{server.port}/v1/chat/completions", json=body, timeout=120)
    assert reply.status_code == 200, reply.text
    return reply.json()


def cached(reply: dict) -> int:
    return reply["usage"]["prompt_tokens_details"]["cached_tokens"]


def tier_metric(server: ServerProcess, name: str, tier: str = "shared") -> float:
    return metrics_of(server.port)[f'rwkv:{name}{{model_name="tiny",replica="",tier="{tier}"}}']


def wait_for(condition, what: str) -> None:
    deadline = time.monotonic() + WAIT
    while not condition():
        assert time.monotonic() < deadline, f"{what}: not within {WAIT} s"
        time.sleep(0.2)


def written(server: ServerProcess, count: int) -> None:
    """Until `server` has written `count` entries to the shared tier (its writer thread)."""
    wait_for(lambda: tier_metric(server, "state_cache_tier_writes_total") >= count, f"{count} shared writes")


@pytest.fixture(scope="module")
def replicas(tmp_path_factory):
    """Redis, replicas A and B of one model in folders of their own, and C of other weights."""
    root = tmp_path_factory.mktemp("shared-pc")
    replica_folders(root)
    store = RedisProcess(root).start()
    with ExitStack() as stack:
        stack.callback(store.stop)
        servers = []
        for name in "abc":
            config = process_config(root / name) + f'[store]\nurl = "{store.url}"\nprefix = "{PREFIX}"\nttl = 600\n'
            servers.append(stack.enter_context(ServerProcess(root / name, config)))
        yield store, *servers


def test_a_prompt_one_replica_read_is_found_by_another(replicas):
    store, a, b, _ = replicas
    prompt = long_prompt("first")
    on_a = ask(a, prompt)
    n = on_a["usage"]["prompt_tokens"]
    assert n >= 300 and cached(on_a) == 0
    # The last checkpoint (256), the prompt's end and the state after the reply.
    written(a, 3)
    before = metrics_of(b.port)
    on_b = ask(b, prompt)
    assert cached(on_b) == n
    assert on_b["choices"][0]["message"]["content"] == on_a["choices"][0]["message"]["content"]
    after = metrics_of(b.port)
    hits = 'rwkv:state_cache_hits_total{model_name="tiny",replica="",tier="%s"}'
    tokens = 'rwkv:state_cache_hit_tokens_total{model_name="tiny",replica="",tier="shared"}'
    assert after[hits % "shared"] - before[hits % "shared"] == 1 and after[tokens] - before[tokens] == n
    assert after[hits % "disk"] == before[hits % "disk"]  # its own folder has none of it
    assert after["rwkv:prompt_tokens_total"] - before["rwkv:prompt_tokens_total"] == n
    assert after["rwkv:prompt_tokens_computed_total"] == before["rwkv:prompt_tokens_computed_total"]
    keys = [k.decode() for k in store.client().keys("*pcache*")]
    assert keys and all(k.startswith(f"{PREFIX}pcache:") for k in keys)
    assert all(0 < store.client().ttl(k) <= 600 for k in keys)


def test_other_weights_never_use_a_shared_entry(replicas):
    _, a, _, c = replicas
    prompt = long_prompt("weights")
    ask(a, prompt)
    written(a, 6)  # after the first test's 3
    on_c = ask(c, prompt)
    assert cached(on_c) == 0
    assert tier_metric(c, "state_cache_hits_total") == 0


def test_redis_stopped_mid_way_leaves_both_answering_and_back_is_used_again(replicas):
    store, a, b, _ = replicas
    store.stop()
    try:
        for n in range(2):  # each replica fails to write, and fails to look up, and answers
            prompt = long_prompt(f"outage {n}")
            on_a, on_b = ask(a, prompt), ask(b, prompt)
            assert cached(on_a) == cached(on_b) == 0
            assert on_a["choices"][0]["message"]["content"] == on_b["choices"][0]["message"]["content"]
        again = ask(b, long_prompt("outage 0"))  # from B's own memory meanwhile
        assert cached(again) == again["usage"]["prompt_tokens"]
        for server in (a, b):  # one warning per outage, not one per request
            failed = [line for line in server.lines if "shared tier failed" in line]
            assert len(failed) == 1, failed
    finally:
        store.start()  # the same port, empty
    writes = tier_metric(a, "state_cache_tier_writes_total")
    tries = iter(range(1000))

    def a_writes_again() -> bool:
        ask(a, long_prompt(f"back {next(tries)}"))  # a failing tier is tried again after a pause
        return tier_metric(a, "state_cache_tier_writes_total") > writes

    wait_for(a_writes_again, "writes to Redis once it is back")
    assert any("shared tier works again" in line for line in a.lines)

    def b_reads_what_a_wrote() -> bool:
        # B's pause began with its own last failure, which on a busy machine can come
        # seconds after A's: each try is a prompt B has never read, so a hit is Redis's.
        prompt = long_prompt(f"back again {next(tries)}")
        writes = tier_metric(a, "state_cache_tier_writes_total")
        ask(a, prompt)
        written(a, writes + 3)
        on_b = ask(b, prompt)
        return cached(on_b) == on_b["usage"]["prompt_tokens"]

    wait_for(b_reads_what_a_wrote, "B reads from Redis once it is back")


# ---------------------------------------------------------------------------------- the tier alone


def _state(seed: int) -> State:
    rng = np.random.default_rng(seed)
    return State(*(rng.standard_normal(shape).astype(np.float32) for shape in ((2, 64), (2, 2, 32, 32), (2, 64))))


def fetch(tier: SharedCache, key: bytes) -> tuple:
    got, done = [], threading.Event()
    tier.fetch("", key, 0, lambda *result: (got.append(result), done.set()))
    assert done.wait(30)
    return got[0]


def test_the_tier_finds_the_longest_prefix_and_drops_another_models_entry(tmp_path, caplog):
    store = RedisProcess(tmp_path).start()
    mine, other = "a" * 64, "b" * 64
    tier = SharedCache(store.url, mine, prefix=PREFIX, ttl=600, min_tokens=4)
    try:
        prompt = token_key(range(1, 11))
        tier.put("", prompt[:4 * 3], _state(0), None)  # under min_tokens: not written
        tier.put("", prompt[:4 * 4], _state(1), None)
        tier.put("", prompt[:4 * 8], _state(2), np.arange(3, dtype=np.float32))
        tier.flush()
        assert tier.writes == 2
        length, state, logits = fetch(tier, prompt)
        assert length == 8 and np.array_equal(state.wkv, _state(2).wkv) and list(logits) == [0, 1, 2]
        assert fetch(tier, prompt[:4 * 8])[0] == 8  # the whole prompt: it has logits
        assert fetch(tier, prompt[:4 * 5])[0] == 4
        # Another model's entry under this model's key (a collision, a forged key): refused.
        key = tier.key(tier.digest("", prompt[:4 * 8]), True)
        store.client().set(key, encode_entry(_state(3), np.zeros(3, np.float32), other))
        with caplog.at_level(logging.WARNING, logger="ai00_like.backend.cache_tier"):
            assert fetch(tier, prompt) == (0, None, None)  # the prompt is computed instead
        assert tier.dropped == 1 and "another model" in caplog.text
        assert not store.client().exists(key)
        assert fetch(tier, prompt)[0] == 4  # the next longest, now that it is gone
    finally:
        tier.close()
        store.stop()


@pytest.mark.parametrize("extra,on", [("", False), ('[store]\nurl = "redis://127.0.0.1:1/0"\n', True),
                                      ('[store]\nurl = "redis://127.0.0.1:1/0"\n[cache]\nshared = false\n', False)])
def test_the_tier_is_on_only_with_a_store_url(extra, on):
    spec = parse_config(extra, source="c.toml", base_dir=".").disk_cache()
    assert (spec.shared is not None) == on
    if on:
        assert spec.shared.url == "redis://127.0.0.1:1/0" and spec.shared.prefix == "ai00:"
