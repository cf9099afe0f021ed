"""The backend thread: owns the model, its `max_batch` slots and the prefix state cache.

Each loop: take new jobs, admit waiting sequences into free slots, build one step (every
decoding slot's next token plus prefill chunks of the others within a `token_chunk_size`
budget, see scheduler.py), run it as one batched forward, sample every slot that got
logits in one vectorised call, and send each request its text as it is produced
(sequence.py). Jobs that need no slot run between two steps (queries.py). Nothing
polls: the thread blocks on its inbox when it has nothing to do. The prefix cache's tiers
below memory (disk, shared store) read on threads of their own and post what they read
into the same inbox.
"""

from __future__ import annotations

import logging
import queue
import threading
import time

from ..messages import BackendCounters, Failed, Finished, GenerateJob
from ..rwkv.batch import StepInput
from ..sampler import sample_batch, warm_up_sampler
from ..sampler.fused import fits as fits_sampler
from .queries import Queries
from .scheduler import Scheduler, TierRead
from .sequence import Sequence
from .speculation import Speculation
from .state_cache import StateCache

log = logging.getLogger(__name__)

_STOP = object()


def tier_counters(cache: StateCache) -> dict[str, int]:
    """BackendCounters' fields of the tiers below memory: hits by where they came from, and
    each tier's writes, skipped writes and dropped entries (0 for a tier that is off)."""
    counters = {}
    for name in ("disk", "shared"):
        tier = next((t for t in cache.tiers if t.name == name), None)
        counters[f"cache_{name}_hits"] = cache.tier_hits[name]
        counters[f"cache_{name}_hit_tokens"] = cache.tier_hit_tokens[name]
        for kind in ("writes", "skipped", "dropped"):
            counters[f"cache_{name}_{kind}"] = getattr(tier, kind, 0)
    return counters


class Backend:
    def __init__(self, model, tokenizer, *, token_chunk_size: int = 256, cache_bytes: int = 1 << 30,
                 checkpoint_interval: int = 256, name: str = "backend", tiers=()):
        self.model, self.tokenizer = model, tokenizer
        self.inbox: queue.Queue = queue.Queue()
        self.cache = StateCache(cache_bytes, tiers)  # tiers: the cache's CacheTiers below memory, in order
        self.scheduler = Scheduler(model, self.cache, token_chunk_size=token_chunk_size,
                                   checkpoint_interval=checkpoint_interval, post=self.inbox.put)
        self.queries = Queries(model, self.cache, token_chunk_size)
        self.speculation = Speculation(model)
        self.steps = self.step_rows = self.step_tokens = 0
        self.prompt_tokens = self.generated_tokens = self.finished = 0
        if fits_sampler(model.info.vocab):  # the compiled sampler takes only vocabularies it fits
            background = not getattr(model, "kernels_ready", True)
            warm_up_sampler(background=background, after=model.wait_for_kernels if background else None)
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ other threads call these

    def submit(self, job) -> None:
        self.inbox.put(job)

    def stop(self, error: str = "the model was unloaded") -> None:
        """End every running and waiting request with `error`, then end the thread."""
        self.inbox.put((_STOP, error))
        self._thread.join()
        for tier in self.cache.tiers:
            tier.close()  # its writes land before a load of the same model reads the folder

    @property
    def running(self) -> int:
        return sum(s is not None for s in self.scheduler.slots)

    @property
    def queued(self) -> int:
        return len(self.scheduler.waiting) + self.inbox.qsize()

    def counters(self) -> BackendCounters:
        # Plain int reads: a snapshot from another thread may be one step stale, never torn.
        cache = self.cache
        return BackendCounters(
            steps=self.steps, step_rows=self.step_rows, step_tokens=self.step_tokens, prompt_tokens=self.prompt_tokens,
            generated_tokens=self.generated_tokens, finished=self.finished, cache_queries=cache.queries,
            cache_hits=cache.hits, cache_hit_tokens=cache.hit_tokens, **tier_counters(cache),
            numpy_steps=getattr(self.model, "numpy_steps", 0), draft_tokens=self.speculation.drafted,
            draft_accepted=self.speculation.accepted)

    # ------------------------------------------------------------------ the loop

    def _loop(self) -> None:
        scheduler = self.scheduler
        while True:
            try:
                item = self.inbox.get(block=not scheduler.busy)
            except queue.Empty:
                item = None
            while item is not None:
                if isinstance(item, tuple) and item[0] is _STOP:
                    self.cache.spill()  # queued for the disk tier's writer before drain clears it
                    self._fail_all(item[1])
                    return
                self._enqueue(item)
                try:
                    item = self.inbox.get_nowait()
                except queue.Empty:
                    item = None
            try:
                self._drop_cancelled()
                scheduler.admit()
                if scheduler.running:
                    self._step()
            except Exception as exc:  # a bug must not take the server down: fail what ran
                log.exception("backend step failed")
                for seq in scheduler.running:
                    scheduler.release(seq)
                    seq.send(Failed(f"internal error: {exc}", "internal", seq.index))

    def _enqueue(self, job) -> None:
        if isinstance(job, TierRead):
            self.scheduler.tier_read(job)
            return
        if isinstance(job, GenerateJob):
            self.scheduler.waiting.extend(Sequence(job, index) for index in range(len(job.samplers)))
            return
        try:
            self.queries.run(job)
        except Exception as exc:
            log.exception("%s failed", type(job).__name__)
            job.reply(Failed(f"internal error: {exc}", "internal"))

    def _drop_cancelled(self) -> None:
        running, waiting = self.scheduler.take_cancelled()
        for seq in running:
            self._finish(seq, "cancelled", keep=False)
        for seq in waiting:
            self.finished += 1
            seq.send(Finished(seq.index, "cancelled", len(seq.prompt), 0))

    # ------------------------------------------------------------------ one step

    def _step(self) -> None:
        scheduler = self.scheduler
        ready = [s for s in scheduler.running if not s.pending and s.logits is not None]
        self.speculation.propose(scheduler.running)
        plan = scheduler.plan()
        if plan:
            inputs = [self.speculation.step_input(s, chunk) if s.draft else
                      StepInput(s.slot, chunk, "last" if len(chunk) == len(s.pending) else "none") for s, chunk in plan]
            decoding, started = all(s.decoding for s, _ in plan), time.perf_counter()
            outputs = self.model.step(inputs)
            if decoding:  # what a decoding step costs by its rows: where drafts pay (speculation.py)
                self.speculation.costs.observe(sum(len(c) for _, c in plan), time.perf_counter() - started)
            self.steps += 1
            self.step_rows += len(plan)
            self.step_tokens += sum(len(c) for _, c in plan)
            for (seq, chunk), logits in zip(plan, outputs):
                self.prompt_tokens += seq.ran(chunk)
                scheduler.after_chunk(seq, logits)
                if logits is not None:
                    ready.append(seq)
        if ready:
            self._sample(ready)

    def _sample(self, seqs: list[Sequence]) -> None:
        # Sequences with a draft sample again while they sample the draft's tokens (speculation.py).
        ended = self.speculation.check(seqs, self._sample_round)
        # Every token of the step goes out before the ended sequences' states are copied
        # into the cache.
        for seq, reason in ended:
            self._finish(seq, reason)

    def _sample_round(self, seqs: list[Sequence], rows: list) -> list[str | None]:
        """One token for each of `seqs` from its row of logits; why each ended (None: it goes on)."""
        result = sample_batch([s.sampler for s in seqs], rows)
        token_bytes = self.tokenizer.token_bytes
        reasons = []
        for n, seq in enumerate(seqs):
            token = int(result.tokens[n])
            logprob = (float(result.logprobs[n]),) if seq.sampler.options.wants_logprobs else ()
            top = (tuple(result.top_logprobs[n]),) if result.top_logprobs and result.top_logprobs[n] else ()
            self.generated_tokens += 1
            reasons.append(seq.accept(token, token_bytes(token), logprob, top))
        return reasons

    # ------------------------------------------------------------------ ending

    def _finish(self, seq: Sequence, reason: str, keep: bool = True) -> None:
        if keep:
            self.scheduler.keep(seq)
        kept = {}
        if seq.job.keep_state and seq.index == 0 and seq.slot is not None and not seq.pending:
            unfed = () if seq.last_token in (None, 0) else (seq.last_token,)
            kept = dict(state=self.model.read_state(seq.slot), fed=tuple(seq.fed), unfed=unfed)
        self.scheduler.release(seq)
        self.finished += 1
        seq.send(Finished(seq.index, reason, len(seq.prompt), seq.generated, **kept))

    def _fail_all(self, error: str) -> None:
        for seq in self.scheduler.drain():
            seq.send(Failed(error, "unloaded", seq.index))
        while True:
            try:
                job = self.inbox.get_nowait()
            except queue.Empty:
                break
            if isinstance(job, GenerateJob):
                job.reply(Failed(error, "unloaded"))
