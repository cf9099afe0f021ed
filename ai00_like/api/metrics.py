"""What GET /metrics exports (Prometheus); the route itself is in api/operations.py.

Names and meanings follow vLLM's (`openai-and-peers.md` §3) under our prefix `rwkv:`, so
vLLM dashboards and alerts work after renaming the prefix. Two sources:

* the backend's running totals (`BackendCounters`, via GetInfo) and its gauges (requests
  running and waiting, state-cache entries and bytes), read once per scrape; the prefix
  cache's hits carry a `tier` label (memory, disk, shared: where the state came from);
* per-request histograms (time to first token, inter-token latency, end-to-end latency,
  prompt and generation lengths), observed here in the HTTP tier, which sees each
  request's events as they arrive (`RequestObserver`, fed by oai/generation.py).

Each application has its own registry (tests run several servers in one process).
Every series is labelled with its model (`model_name`, as vLLM's), one per model served
so far. A backend's totals restart at each load of its model; the collector adds up the
totals of earlier loads so that the exported counters never go down.
"""

from __future__ import annotations

import time
from collections.abc import Iterable

from prometheus_client import CollectorRegistry, Counter, Histogram
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.exposition import generate_latest

from ..messages import (
    BackendCounters,
    Finished,
    ModelInfoEvent,
    Started,
    TextPiece,
)
from .logs import current_request_stats

PREFIX = "rwkv:"
LABELS = ("model_name", "replica")  # replica: [listen] replica, for N replicas in one Prometheus

# vLLM's buckets (seconds), trimmed to what a CPU server meets.
_TTFT_BUCKETS = (0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
                 20.0, 40.0, 80.0, 160.0)
_ITL_BUCKETS = (0.001, 0.005, 0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0)
_E2E_BUCKETS = (0.1, 0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
                240.0, 480.0, 960.0)
_TOKEN_BUCKETS = (1, 2, 5, 10, 20, 50, 100, 200, 500, 1000, 2000, 5000, 10000, 20000, 50000)


class Metrics:
    def __init__(self, replica: str = "") -> None:
        self.replica = replica
        self.registry = CollectorRegistry(auto_describe=True)
        r = self.registry

        def hist(name, doc, buckets):
            return Histogram(PREFIX + name, doc, LABELS, buckets=buckets, registry=r)

        self.ttft = hist("time_to_first_token_seconds", "Time from the request's arrival to its first token.",
                         _TTFT_BUCKETS)
        self.itl = hist("inter_token_latency_seconds", "Time between two tokens of one reply.", _ITL_BUCKETS)
        self.tpot = hist("request_time_per_output_token_seconds",
                         "Per request: decode time divided by the tokens after the first.", _ITL_BUCKETS)
        self.e2e = hist("e2e_request_latency_seconds", "Time from the request's arrival to its last event.",
                        _E2E_BUCKETS)
        self.queue = hist("request_queue_time_seconds", "Time from arrival until the prompt got a slot.",
                          _E2E_BUCKETS)
        self.prefill = hist("request_prefill_time_seconds", "Time from getting a slot to the first token.",
                            _E2E_BUCKETS)
        self.decode = hist("request_decode_time_seconds", "Time from the first token to the last.", _E2E_BUCKETS)
        self.prompt_len = hist("request_prompt_tokens", "Prompt length of each request (cached part included).",
                               _TOKEN_BUCKETS)
        self.gen_len = hist("request_generation_tokens", "Tokens generated for each choice.", _TOKEN_BUCKETS)
        self.success = Counter(PREFIX + "request_success", "Choices that ended, by finish reason.",
                               (*LABELS, "finished_reason"), registry=r)
        self.aborted = Counter(PREFIX + "requests_aborted", "Requests that ended before their generation did "
                               "(the client left, or an error).", LABELS, registry=r)
        self.store_failures = Counter(PREFIX + "response_store_failures", "Responses whose store failed (a full "
                                      "disk, a store that went away); each reply was given all the same.", LABELS,
                                      registry=r)
        self.backend = BackendCollector(replica)
        r.register(self.backend)

    async def exposition(self, snapshots: tuple[ModelInfoEvent, ...], loads: dict[str, int]) -> bytes:
        self.backend.update(snapshots, loads)
        return generate_latest(self.registry)


_ZERO = BackendCounters()
_FIELDS = tuple(BackendCounters.__struct_fields__)


def _add(a: BackendCounters, b: BackendCounters) -> BackendCounters:
    return BackendCounters(*(getattr(a, f) + getattr(b, f) for f in _FIELDS))


class _ModelTotals:
    """One model's counters across its loads: a backend's totals restart with each load."""

    def __init__(self) -> None:
        self.earlier = _ZERO  # totals of the loads before the current one
        self.last = _ZERO
        self.load: int | None = None

    def update(self, counters: BackendCounters, load: int | None) -> None:
        if load != self.load:
            self.earlier = _add(self.earlier, self.last)
            self.last = _ZERO
        self.last, self.load = counters, load

    @property
    def total(self) -> BackendCounters:
        return _add(self.earlier, self.last)


class BackendCollector:
    """Exports the backends' snapshots taken at the scrape that is under way, one series per
    model (label `model_name`), loaded or once loaded."""

    def __init__(self, replica: str) -> None:
        self.replica = replica
        self.snapshots: dict[str, ModelInfoEvent] = {}
        self.totals: dict[str, _ModelTotals] = {}
        self.loads: dict[str, int] = {}  # each model's loads since the server started

    def update(self, snapshots: tuple[ModelInfoEvent, ...], loads: dict[str, int]) -> None:
        """`loads` numbers each model's loads: a new one (or an unload) restarts its backend's totals."""
        self.snapshots = {s.name: s for s in snapshots}
        self.loads = dict(loads)
        for name in set(self.totals) | set(self.snapshots):
            s = self.snapshots.get(name)
            totals = self.totals.setdefault(name, _ModelTotals())
            totals.update(s.counters if s is not None else _ZERO, loads.get(name) if s is not None else None)

    def describe(self) -> Iterable[Metric]:
        return ()  # metrics depend on the snapshots; nothing to check at registration

    def collect(self) -> Iterable[Metric]:
        names = sorted(set(self.totals) | {n for n, count in self.loads.items() if count}) or [""]
        for metric, doc, read in _COUNTERS:
            family = CounterMetricFamily(PREFIX + metric, doc, labels=LABELS)
            for name in names:
                totals = self.totals.get(name)
                family.add_metric([name, self.replica], read(totals.total if totals else _ZERO))
            yield family
        loads = CounterMetricFamily(PREFIX + "model_loads", "Loads of the model (on start, on demand, by an admin).",
                                    labels=LABELS)
        for name in names:
            loads.add_metric([name, self.replica], self.loads.get(name, 0))
        yield loads
        for metric, doc, tiers, read in _TIER_COUNTERS:
            family = CounterMetricFamily(PREFIX + metric, doc, labels=(*LABELS, "tier"))
            for name in names:
                totals = self.totals.get(name)
                for tier in tiers:
                    family.add_metric([name, self.replica, tier], read(totals.total if totals else _ZERO, tier))
            yield family
        for metric, doc, read in _GAUGES:
            family = GaugeMetricFamily(PREFIX + metric, doc, labels=LABELS)
            for name in names:
                totals = self.totals.get(name)
                family.add_metric([name, self.replica], read(self.snapshots.get(name), totals.last if totals else _ZERO))
            yield family


# (metric, help, value from a model's totals); vLLM counts every prompt token, the ones a
# prefix-cache hit spared included.
_COUNTERS = (
    ("prompt_tokens", "Prompt tokens of finished and running requests (cache hits included).",
     lambda t: t.prompt_tokens + t.cache_hit_tokens),
    ("prompt_tokens_computed", "Prompt tokens run through the model (cache hits excluded).", lambda t: t.prompt_tokens),
    ("generation_tokens", "Tokens generated.", lambda t: t.generated_tokens),
    ("iterations", "Batched forward steps.", lambda t: t.steps),
    ("iteration_rows", "Sum over steps of the requests in the step (÷ iterations = mean batch size).",
     lambda t: t.step_rows),
    ("iteration_tokens", "Tokens through the model in steps (prefill chunks and decode tokens).",
     lambda t: t.step_tokens),
    ("state_cache_queries", "Prompts looked up in the prefix state cache.", lambda t: t.cache_queries),
    ("iterations_numpy", "Steps of a CPU model run on numpy while its compiled kernels compiled.",
     lambda t: t.numpy_steps),
    ("draft_tokens", "Speculative decoding: prompt-lookup draft tokens checked.", lambda t: t.draft_tokens),
    ("draft_accepted_tokens", "Speculative decoding: draft tokens that were the model's own (each saved a step).",
     lambda t: t.draft_accepted),
)


def _tier_hits(t: BackendCounters, tier: str, kind: str = "hits") -> int:
    """Hits (or their tokens) whose state came from `tier`; memory's are the rest."""
    if tier == "memory":
        return getattr(t, f"cache_{kind}") - _tier_hits(t, "disk", kind) - _tier_hits(t, "shared", kind)
    return getattr(t, f"cache_{tier}_{kind}")


# (metric, help, its tiers, value from a model's totals and a tier), labelled `tier`: where
# a prefix state came from. Summed over `tier`, the hits are the prompts that started from a
# cached state, and the tokens the part of prompt_tokens that was not computed.
_HIT_TIERS, _LOWER_TIERS = ("memory", "disk", "shared"), ("disk", "shared")
_TIER_COUNTERS = (
    ("state_cache_hits", "Prompts that started from a cached prefix state, by where the state came from.",
     _HIT_TIERS, _tier_hits),
    ("state_cache_hit_tokens", "Prompt tokens a cache hit spared, by where the state came from.", _HIT_TIERS,
     lambda t, tier: _tier_hits(t, tier, "hit_tokens")),
    ("state_cache_tier_writes", "Prefix states written to a tier below memory.", _LOWER_TIERS,
     lambda t, tier: getattr(t, f"cache_{tier}_writes")),
    ("state_cache_tier_skipped", "Prefix states not written to a tier: its queue was full or the state too big.",
     _LOWER_TIERS, lambda t, tier: getattr(t, f"cache_{tier}_skipped")),
    ("state_cache_tier_dropped", "Entries of a tier dropped unused: damaged, or of other weights.", _LOWER_TIERS,
     lambda t, tier: getattr(t, f"cache_{tier}_dropped")),
)
# (metric, help, value from a model's snapshot, None when it is not loaded, and its current load's totals)
_GAUGES = (
    ("num_requests_running", "Requests in a slot (prefilling or decoding).", lambda s, t: s.running if s else 0),
    ("num_requests_waiting", "Requests waiting for a slot.", lambda s, t: s.waiting if s else 0),
    ("batch_size_max", "Slots of the model (its max_batch).", lambda s, t: s.slots if s else 0),
    ("batch_size_mean", "Mean requests per batched step since the model was loaded.",
     lambda s, t: t.step_rows / t.steps if s and t.steps else 0.0),
    ("state_cache_entries", "Prefix states held in the cache.", lambda s, t: s.cache_entries if s else 0),
    ("state_cache_bytes", "Bytes held by the prefix state cache.", lambda s, t: s.cache_bytes if s else 0),
    ("state_cache_disk_bytes", "Bytes of the prefix cache's disk tier (its folder, every model's entries in it).",
     lambda s, t: s.disk_cache_bytes if s else 0),
    ("state_cache_usage_perc", "Cache bytes over its budget (0-1).",
     lambda s, t: s.cache_bytes / s.spec.cache_bytes if s and s.spec.cache_bytes else 0.0),
    ("model_loaded", "1 while the model is loaded.", lambda s, t: 1 if s else 0),
    ("kernels_compiling", "1 while a CPU model serves on numpy as its compiled kernels compile.",
     lambda s, t: 1 if s and s.kernels_compiling else 0),
    ("model_memory_bytes", "What the loaded model holds: weights, slot states and its prefix cache's budget.",
     lambda s, t: s.memory_bytes if s else 0),
)


class RequestObserver:
    """Times one request's generation from its events (prompt p, choice i → index)."""

    def __init__(self, metrics: Metrics | None, model_name: str, prompts: int, n: int):
        self.metrics, self.n = metrics, n
        self.labels = (model_name, metrics.replica if metrics is not None else "")
        self.arrival = time.monotonic()
        self.started: dict[int, float] = {}  # prompt → when it got a slot
        self.first: dict[int, float] = {}  # choice → first token
        self.last: dict[int, float] = {}  # choice → latest token
        self.ended: set[int] = set()
        self.closed = False
        self.stats = current_request_stats()  # the request log's record of this request, if any
        # Looked up once: the inter-token histogram is observed for every token.
        self.itl = metrics.itl.labels(*self.labels) if metrics is not None else None

    def event(self, index: int, event) -> None:
        now = time.monotonic()
        m, labels = self.metrics, self.labels
        if isinstance(event, Started):
            prompt = index // self.n
            if prompt not in self.started:
                self.started[prompt] = now
                if m is not None:
                    m.queue.labels(*labels).observe(now - self.arrival)
        elif isinstance(event, TextPiece) and event.tokens:
            if index not in self.first:
                self.first[index] = now
                if m is not None:
                    m.ttft.labels(*labels).observe(now - self.arrival)
                    m.prefill.labels(*labels).observe(now - self.started.get(index // self.n, self.arrival))
                if self.stats is not None and self.stats.ttft is None:
                    self.stats.ttft = now - self.arrival
            elif self.itl is not None:
                # A piece may carry several tokens (a multi-token character); they share the gap.
                gap = (now - self.last[index]) / len(event.tokens)
                for _ in event.tokens:
                    self.itl.observe(gap)
            self.last[index] = now
        elif isinstance(event, Finished) and index not in self.ended:
            self.ended.add(index)
            if self.stats is not None:
                self.stats.completion_tokens += event.completion_tokens
                if index % self.n == 0:
                    self.stats.prompt_tokens += event.prompt_tokens
            if m is None or event.reason == "cancelled":
                return  # nobody reads a cancelled choice: counted as aborted instead
            m.success.labels(*labels, event.reason).inc()
            m.e2e.labels(*labels).observe(now - self.arrival)
            m.gen_len.labels(*labels).observe(event.completion_tokens)
            if index % self.n == 0:
                m.prompt_len.labels(*labels).observe(event.prompt_tokens)
            if index in self.first:
                decode = self.last[index] - self.first[index]
                m.decode.labels(*labels).observe(decode)
                if event.completion_tokens > 1:
                    m.tpot.labels(*labels).observe(decode / (event.completion_tokens - 1))

    def close(self, unfinished: bool) -> None:
        if unfinished and not self.closed and self.metrics is not None:
            self.metrics.aborted.labels(*self.labels).inc()
        self.closed = True
