"""The prefix cache's disk tier: states found again after a restart and an unload, damaged
entries dropped, the folder's cap kept least recently used first, other weights never used,
and a read from disk that keeps no other stream waiting."""

from __future__ import annotations

import asyncio
import logging
import os
import threading

import numpy as np
from api_helpers import write_model
from process_helpers import parse_metrics
from serving_helpers import generate, load

from ai00_like.backend.cache_tier import decode_entry, encode_entry
from ai00_like.backend.disk_cache import SUFFIX, DiskCache
from ai00_like.backend.state_cache import token_key
from ai00_like.messages import DiskCacheSpec, Loaded, ModelSpec, Unload
from ai00_like.api.metrics import Metrics
from ai00_like.middleware import Middleware
from ai00_like.rwkv.state import State

# About 600 tokens of the World vocabulary: long enough for several checkpoints.
LONG = "User: " + " ".join(f"w{i}" for i in range(240)) + "\n\nAssistant:"
SHORT = "User: something else entirely?\n\nAssistant:"


def spec(path, cache_dir, **kwargs) -> ModelSpec:
    kwargs.setdefault("max_batch", 2)
    return ModelSpec(path=str(path), disk_cache=DiskCacheSpec(str(cache_dir), 1 << 30), checkpoint_interval=128,
                     token_chunk_size=128, **kwargs)


def unload(mw) -> None:
    done = threading.Event()
    mw.send(Unload(lambda _event: done.set()))
    assert done.wait(60)


def disk_of(mw):
    return next(t for t in next(iter(mw.models.values())).backend.cache.tiers if t.name == "disk")


def entry_files(cache_dir) -> list:
    return sorted(cache_dir.glob(f"*/*{SUFFIX}"), key=lambda p: int(p.name.split(".")[1]))


def cold_reply(model, tmp_path):
    """The reply with nothing cached (memory only, no disk tier)."""
    mw = Middleware()
    try:
        assert isinstance(load(mw, ModelSpec(path=str(model), max_batch=2)), Loaded)
        return generate(mw, LONG, max_tokens=8).wait()
    finally:
        mw.close()


def run_once(model, cache_dir, prompt=LONG):
    """One server's life: load, answer `prompt`, shut down (the disk tier's writes land)."""
    mw = Middleware()
    try:
        assert isinstance(load(mw, spec(model, cache_dir)), Loaded)
        return generate(mw, prompt, max_tokens=8).wait()
    finally:
        mw.close()


def test_a_restarted_server_reads_the_prompt_from_disk(model_files, tmp_path):
    first = run_once(model_files[0], tmp_path / "cache")
    assert first.started[0].cached_tokens == 0 and first.started[0].prompt_tokens > 500
    mw = Middleware()
    try:
        load(mw, spec(model_files[0], tmp_path / "cache"))
        second = generate(mw, LONG, max_tokens=8).wait()
        assert second.started[0].cached_tokens == second.started[0].prompt_tokens
        assert disk_of(mw).hits == 1
    finally:
        mw.close()
    assert second.tokens == first.tokens and second.text == first.text


def scrape(mw) -> dict[str, float]:
    """The model's /metrics, from a snapshot of its backend as the route takes one."""
    loaded = next(iter(mw.models.values()))
    text = asyncio.run(Metrics().exposition((loaded.describe(),), {loaded.name: 1})).decode()
    return parse_metrics(text)


def test_a_disk_hit_is_counted_by_its_tier_in_the_metrics(model_files, tmp_path):
    run_once(model_files[0], tmp_path / "cache")
    mw = Middleware()
    try:
        load(mw, spec(model_files[0], tmp_path / "cache"))
        from_disk = generate(mw, LONG, max_tokens=8).wait()
        from_memory = generate(mw, LONG, max_tokens=8).wait()
        got = scrape(mw)
    finally:
        mw.close()
    n = from_disk.started[0].prompt_tokens
    assert from_disk.started[0].cached_tokens == from_memory.started[0].cached_tokens == n
    hits, tokens = "rwkv:state_cache_hits_total", "rwkv:state_cache_hit_tokens_total"
    assert got[f'{hits}{{model_name="a",replica="",tier="disk"}}'] == 1
    assert got[f'{tokens}{{model_name="a",replica="",tier="disk"}}'] == n
    assert got[f'{hits}{{model_name="a",replica="",tier="memory"}}'] == 1
    assert got[f'{hits}{{model_name="a",replica="",tier="shared"}}'] == 0
    assert got[hits] == 2 and got[tokens] == 2 * n  # the sum over tiers: every hit once
    assert got["rwkv:prompt_tokens_total"] == 2 * n and got["rwkv:prompt_tokens_computed_total"] == 0
    assert got["rwkv:state_cache_disk_bytes"] == sum(p.stat().st_size for p in entry_files(tmp_path / "cache")) > 0
    assert got["rwkv:state_cache_tier_dropped_total"] == 0


def test_unload_and_load_again_finds_it_on_disk(model_files, tmp_path):
    mw = Middleware()
    try:
        load(mw, spec(model_files[0], tmp_path / "cache"))
        first = generate(mw, LONG, max_tokens=8).wait()
        unload(mw)
        load(mw, spec(model_files[0], tmp_path / "cache"))
        again = generate(mw, LONG, max_tokens=8).wait()
    finally:
        mw.close()
    assert again.started[0].cached_tokens == again.started[0].prompt_tokens
    assert again.tokens == first.tokens


def test_two_models_in_one_server_each_find_their_own_entries(model_files, tmp_path):
    """Two models on one cache folder: after a restart each reads its own prompt's state,
    and each reply is what it was before (neither read the other's)."""
    cache_dir = tmp_path / "cache"

    def serve_both():
        mw = Middleware()
        try:
            for name, path in zip("ab", model_files):
                assert isinstance(load(mw, spec(path, cache_dir, name=name)), Loaded)
            return [generate(mw, LONG, max_tokens=8, model=name).wait() for name in "ab"]
        finally:
            mw.close()

    first = serve_both()
    assert [r.started[0].cached_tokens for r in first] == [0, 0]
    assert first[0].tokens != first[1].tokens  # other weights: otherwise this proves nothing
    assert len({p.parent for p in entry_files(cache_dir)}) == 2  # a folder each
    again = serve_both()
    assert [r.started[0].cached_tokens for r in again] == [r.started[0].prompt_tokens for r in again]
    assert [r.tokens for r in again] == [r.tokens for r in first]


def test_a_damaged_entry_is_dropped_with_a_warning_and_never_used(model_files, tmp_path, caplog):
    cache_dir = tmp_path / "cache"
    first = run_once(model_files[0], cache_dir)
    n = first.started[0].prompt_tokens
    longest = next(p for p in entry_files(cache_dir) if int(p.name.split(".")[1]) == n)  # the prompt's
    data = bytearray(longest.read_bytes())
    data[len(data) // 2] ^= 0xFF
    longest.write_bytes(bytes(data))
    with caplog.at_level(logging.WARNING, logger="ai00_like.backend.disk_cache"):
        mw = Middleware()
        try:
            load(mw, spec(model_files[0], cache_dir))
            second = generate(mw, LONG, max_tokens=8).wait()
            assert disk_of(mw).dropped == 1 and disk_of(mw).hits == 0
            assert scrape(mw)['rwkv:state_cache_tier_dropped_total{model_name="a",replica="",tier="disk"}'] == 1
            model_key = disk_of(mw).model_key
        finally:
            mw.close()
    assert any("checksum" in r.getMessage() for r in caplog.records), caplog.text
    assert second.started[0].cached_tokens == 0
    assert second.tokens == first.tokens
    # Computed again, and written again whole: the file now reads back.
    decode_entry(longest.read_bytes(), model_key)


def test_other_weights_never_use_the_entry(tmp_path):
    cache_dir, model = tmp_path / "cache", tmp_path / "m.st"
    write_model(model, seed=3)
    run_once(model, cache_dir)
    write_model(model, seed=9)  # the same file name, size and architecture; other weights
    expected = cold_reply(model, tmp_path)
    mw = Middleware()
    try:
        load(mw, spec(model, cache_dir))
        reply = generate(mw, LONG, max_tokens=8).wait()
        assert disk_of(mw).hits == 0
    finally:
        mw.close()
    assert reply.started[0].cached_tokens == 0
    assert reply.tokens == expected.tokens


def test_a_read_from_disk_keeps_no_other_stream_waiting(model_files, tmp_path):
    cache_dir = tmp_path / "cache"
    run_once(model_files[0], cache_dir)
    mw = Middleware()
    gate = threading.Event()
    try:
        load(mw, spec(model_files[0], cache_dir))
        disk = disk_of(mw)
        read = disk._load
        disk._load = lambda *args: (gate.wait(60), read(*args))[1]  # the disk is slow: held until told
        long = generate(mw, LONG, max_tokens=4)
        short = generate(mw, SHORT, max_tokens=4).wait()  # ends while the long one's read is held
        assert short.finish == ["length"]
        assert long.events.empty()  # not started: it waits for its state, not in a slot
        gate.set()
        result = long.wait()
        assert result.started[0].cached_tokens == result.started[0].prompt_tokens
    finally:
        gate.set()
        mw.close()


# ------------------------------------------------------------------------------ the tier alone

KEY = "a" * 64


def state(seed: int) -> State:
    rng = np.random.default_rng(seed)
    return State(*(rng.standard_normal(shape).astype(np.float32) for shape in ((2, 64), (2, 2, 32, 32), (2, 64))))


def tokens(n: int, start: int = 1) -> bytes:
    return token_key(range(start, start + n))


def test_the_longest_prefix_on_disk_is_found_and_read_back(tmp_path):
    disk = DiskCache(tmp_path, KEY, 1 << 20)
    disk.put("", tokens(4), state(1), None)
    disk.put("", tokens(8), state(2), np.arange(5, dtype=np.float32))
    disk.flush()
    assert disk.find("", tokens(10)) == 8
    assert disk.find("", tokens(8)) == 8  # the whole prompt: it has logits
    assert disk.find("", tokens(6)) == 4
    assert disk.find("", tokens(4)) == 0  # a checkpoint without logits cannot end a prompt
    assert disk.find("", tokens(10), above=8) == 0
    assert disk.find("other", tokens(10)) == 0
    got = []
    done = threading.Event()
    disk.fetch("", tokens(10), 4, lambda n, s, logits: (got.append((n, s, logits)), done.set()))
    assert done.wait(30)
    assert got[0][0] == 8 and np.array_equal(got[0][1].wkv, state(2).wkv) and list(got[0][2]) == [0, 1, 2, 3, 4]
    disk.close()


def test_the_cap_removes_the_least_recently_used_first(tmp_path):
    one = len(encode_entry(state(1), None, KEY))
    disk = DiskCache(tmp_path, KEY, 2 * one + one // 2)  # room for two
    disk.put("", tokens(3, 1), state(1), None)
    disk.put("", tokens(3, 100), state(2), None)
    disk.flush()
    for n, path in enumerate(sorted(tmp_path.glob(f"*/*{SUFFIX}"))):  # both long unused
        os.utime(path, ns=(10**18 + n, 10**18 + n))
    done = threading.Event()
    disk.fetch("", tokens(3, 1), 0, lambda *_: done.set())  # used: now the most recent
    assert done.wait(30)
    disk.put("", tokens(3, 200), state(3), None)
    disk.flush()
    assert disk.find("", tokens(4, 1)) == 3
    assert disk.find("", tokens(4, 100)) == 0  # the least recently used went
    assert disk.find("", tokens(4, 200)) == 3
    assert len(list(tmp_path.glob(f"*/*{SUFFIX}"))) == 2
    disk.close()


def test_another_models_key_finds_nothing(tmp_path):
    mine = DiskCache(tmp_path, KEY, 1 << 20)
    mine.put("", tokens(4), state(1), np.zeros(3, np.float32))
    mine.close()
    other = DiskCache(tmp_path, "b" * 64, 1 << 20)
    assert other.find("", tokens(4)) == 0
    other.close()
