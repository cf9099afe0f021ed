"""The backend thread: owns the model, its `max_batch` slots and the prefix state cache.

Each loop: take new jobs, admit waiting sequences into free slots (FIFO), build one
step (every decoding slot's next token plus prefill chunks of the others within a
`token_chunk_size` budget), run it as one batched forward, sample every slot that got
logits in one vectorised call, and send each request its text as it is produced.
Nothing polls: the thread blocks on its inbox when it has nothing to do.
"""

from __future__ import annotations

import logging
import queue
import threading
from collections import deque

import numpy as np

from .messages import (
    BackendCounters,
    ChooseJob,
    Chosen,
    Embeddings,
    EmbedJob,
    Failed,
    Finished,
    GenerateJob,
    PromptScores,
    ScoreJob,
    Started,
    StateJob,
    StateRead,
    TextPiece,
)
from .rwkv.batch import StepInput
from .sampler import sample_batch
from .state_cache import CacheEntry, StateCache
from .textstream import TextStream

log = logging.getLogger(__name__)

_STOP = object()


class Sequence:
    """One choice of one request on its way through a slot."""

    def __init__(self, job: GenerateJob, index: int):
        self.job, self.index = job, index
        self.sampler = job.samplers[index]
        self.prompt = list(job.tokens)
        self.fed: list[int] = []  # tokens whose effect the slot's state holds
        self.pending: list[int] = []  # tokens to run next
        self.logits: np.ndarray | None = None  # after `fed`, when `pending` is empty
        self.slot: int | None = None
        self.generated = 0
        self.text = TextStream(job.stop)
        self.reservation: CacheEntry | None = None  # the prompt entry this sequence computes
        self.hit: CacheEntry | None = None  # set when admitted straight from a filled reservation

    @property
    def prefilling(self) -> bool:
        return len(self.fed) + len(self.pending) <= len(self.prompt)

    def send(self, event) -> None:
        self.job.reply(event)


class Backend:
    def __init__(self, model, tokenizer, *, token_chunk_size: int = 256, cache_bytes: int = 1 << 30,
                 checkpoint_interval: int = 256, name: str = "backend"):
        self.model, self.tokenizer = model, tokenizer
        self.token_chunk_size = max(1, token_chunk_size)
        self.checkpoint_interval = max(1, checkpoint_interval)
        self.cache = StateCache(cache_bytes)
        self.slots: list[Sequence | None] = [None] * model.max_batch
        self.waiting: deque[Sequence] = deque()
        self.inbox: queue.Queue = queue.Queue()
        self.steps = self.step_rows = self.step_tokens = 0
        self.prompt_tokens = self.generated_tokens = self.finished = 0
        self._thread = threading.Thread(target=self._loop, name=name, daemon=True)
        self._thread.start()

    # ------------------------------------------------------------------ other threads call these

    def submit(self, job: GenerateJob) -> None:
        self.inbox.put(job)

    def stop(self, error: str = "the model was unloaded") -> None:
        """End every running and waiting request with `error`, then end the thread."""
        self.inbox.put((_STOP, error))
        self._thread.join()

    @property
    def running(self) -> int:
        return sum(s is not None for s in self.slots)

    @property
    def queued(self) -> int:
        return len(self.waiting) + self.inbox.qsize()

    def counters(self) -> BackendCounters:
        # Plain int reads: a snapshot from another thread may be one step stale, never torn.
        cache = self.cache
        return BackendCounters(
            steps=self.steps, step_rows=self.step_rows, step_tokens=self.step_tokens, prompt_tokens=self.prompt_tokens,
            generated_tokens=self.generated_tokens, finished=self.finished, cache_queries=cache.queries,
            cache_hits=cache.hits, cache_hit_tokens=cache.hit_tokens)

    # ------------------------------------------------------------------ the loop

    def _loop(self) -> None:
        while True:
            busy = any(self.slots) or self.waiting
            try:
                item = self.inbox.get(block=not busy)
            except queue.Empty:
                item = None
            while item is not None:
                if isinstance(item, tuple) and item[0] is _STOP:
                    self._fail_all(item[1])
                    return
                self._enqueue(item)
                try:
                    item = self.inbox.get_nowait()
                except queue.Empty:
                    item = None
            try:
                self._drop_cancelled()
                self._admit()
                if any(self.slots):
                    self._step()
            except Exception as exc:  # a bug must not take the server down: fail what ran
                log.exception("backend step failed")
                for slot, seq in enumerate(self.slots):
                    if seq is not None:
                        self._release(seq)
                        seq.send(Failed(f"internal error: {exc}", "internal", seq.index))

    def _enqueue(self, job) -> None:
        if isinstance(job, GenerateJob):
            self.waiting.extend(Sequence(job, index) for index in range(len(job.samplers)))
            return
        # The other kinds need no slot: they run here, between two steps.
        run = {EmbedJob: self._embed, ChooseJob: self._choose, StateJob: self._read_state,
               ScoreJob: self._score}[type(job)]
        try:
            run(job)
        except Exception as exc:
            log.exception("%s failed", type(job).__name__)
            job.reply(Failed(f"internal error: {exc}", "internal"))

    def _drop_cancelled(self) -> None:
        for seq in [s for s in self.slots if s is not None and s.job.cancel.cancelled]:
            self._finish(seq, "cancelled", cache=False)
        if any(s.job.cancel.cancelled for s in self.waiting):
            for seq in [s for s in self.waiting if s.job.cancel.cancelled]:
                self.waiting.remove(seq)
                self.finished += 1
                seq.send(Finished(seq.index, "cancelled", len(seq.prompt), 0))

    def _embed(self, job: EmbedJob) -> None:
        """Between steps: embeddings need no slot, they run on a state of their own."""
        vectors = []
        for tokens in job.token_lists:
            total, state = None, None
            for start in range(0, len(tokens), self.token_chunk_size):
                hidden, state = self.model.forward_hidden(tokens[start : start + self.token_chunk_size], state)
                chunk_sum = hidden.sum(axis=0, dtype=np.float64)
                total = chunk_sum if total is None else total + chunk_sum
            mean = total / len(tokens)
            vectors.append((mean / max(np.linalg.norm(mean), 1e-12)).astype(np.float32))
        job.reply(Embeddings(tuple(vectors), sum(len(t) for t in job.token_lists)))

    def _run_chunked(self, tokens, state, full_output: bool = False):
        """model.forward over `tokens` in chunks of the step budget (bounded memory)."""
        rows = []
        logits = None
        for start in range(0, len(tokens), self.token_chunk_size):
            logits, state = self.model.forward(tokens[start : start + self.token_chunk_size], state, full_output)
            rows.append(logits)
        return (np.concatenate(rows) if full_output else logits), state

    def _prefix(self, partition: str, tokens, initial):
        """Logits and state after `tokens`, from the prefix cache where it has them."""
        entry = self.cache.lookup(partition, tokens)
        if entry is not None and entry.ready:
            state, logits = entry.state, entry.logits
            rest = tokens[entry.length :]
        else:
            state, logits, rest = initial, None, tokens
        if rest:
            logits, state = self._run_chunked(rest, state)
        return logits, state

    def _choose(self, job: ChooseJob) -> None:
        """Between steps: perplexity of each choice after the prompt (Ai00 §5.7)."""
        logits, state = self._prefix(job.partition, job.prompt, job.initial_state)
        if job.calibrate:  # the choices on their own: after end-of-text, from the initial state
            alone, alone_state = self._run_chunked((0,), job.initial_state)
        scores = []
        for choice in job.choices:
            if not choice:
                scores.append(float("inf"))
                continue
            score = _perplexity(logits, state, choice, self._run_chunked)
            if job.calibrate:
                score -= _perplexity(alone, alone_state, choice, self._run_chunked)
            scores.append(score)
        job.reply(Chosen(tuple(scores), len(job.prompt)))

    def _score(self, job: ScoreJob) -> None:
        """Each prompt token's log-probability after the tokens before it, chunk by chunk
        (a chunk's logits are reduced at once: a long prompt never holds [T, V] floats)."""
        tokens, state = job.tokens, job.initial_state
        logprobs: list[float | None] = [None]
        tops: list[tuple] = [()]
        for start in range(0, len(tokens) - 1, self.token_chunk_size):
            chunk = tokens[start : start + self.token_chunk_size]
            rows, state = self.model.forward(chunk, state, full_output=True)
            targets = list(tokens[start + 1 : start + 1 + len(chunk)])
            logp = _log_softmax(rows[: len(targets)])
            logprobs.extend(float(v) for v in logp[np.arange(len(targets)), targets])
            if job.top:
                best = np.argsort(-logp, axis=1)[:, : job.top]
                tops.extend(tuple((int(t), float(row[t])) for t in ids) for row, ids in zip(logp, best))
            else:
                tops.extend(() for _ in targets)
        job.reply(PromptScores(tuple(tokens), tuple(logprobs), tuple(tops)))

    def _read_state(self, job: StateJob) -> None:
        _, state = self._prefix(job.partition, job.tokens, job.initial_state)
        job.reply(StateRead(state.copy() if state is not None else self.model.initial_state(), len(job.tokens)))

    # ------------------------------------------------------------------ admission

    def _admit(self) -> None:
        while self.waiting and None in self.slots:
            seq = self.waiting.popleft()
            entry = seq.hit or self.cache.lookup(seq.job.partition, seq.prompt)
            if entry is not None and not entry.ready:
                entry.waiters.append(seq)  # the same prompt is being computed: wait for it
                continue
            self._place(seq, self.slots.index(None), entry)

    def _place(self, seq: Sequence, slot: int, entry: CacheEntry | None) -> None:
        seq.slot = slot
        self.slots[slot] = seq
        if entry is not None:
            self.model.write_state(slot, entry.state)
            seq.fed = seq.prompt[: entry.length]
            seq.pending = seq.prompt[entry.length :]
            seq.logits = entry.logits if not seq.pending else None
        else:
            if seq.job.initial_state is not None:
                self.model.write_state(slot, seq.job.initial_state)
            else:
                self.model.reset(slot)
            seq.fed, seq.pending = [], list(seq.prompt)
        if seq.pending:
            seq.reservation = self.cache.reserve(seq.job.partition, seq.prompt)
        cached = entry.length if entry is not None else 0
        seq.send(Started(seq.index, len(seq.prompt), cached))

    # ------------------------------------------------------------------ one step

    def _schedule(self) -> list[tuple[Sequence, list[int]]]:
        active = [s for s in self.slots if s is not None and s.pending]
        singles = [s for s in active if len(s.pending) == 1]
        prefills = [s for s in active if len(s.pending) > 1]
        plan = [(s, s.pending[:1]) for s in singles]
        budget = max(self.token_chunk_size - len(singles), 1)
        # Share the rest among prefilling slots, shortest first, so short prompts finish in
        # one step beside a long one. A chunk never crosses a checkpoint boundary, so cache
        # checkpoints land at fixed positions whatever the batch looked like.
        limits = {}
        for s in prefills:
            to_boundary = self.checkpoint_interval - len(s.fed) % self.checkpoint_interval
            limits[id(s)] = min(len(s.pending), to_boundary)
        left = budget
        for n, s in enumerate(sorted(prefills, key=lambda s: limits[id(s)])):
            share = max(1, left // (len(prefills) - n))
            take = min(limits[id(s)], share)
            if take <= 0 or left <= 0:
                break
            plan.append((s, s.pending[:take]))
            left -= take
        return plan

    def _step(self) -> None:
        ready = [s for s in self.slots if s is not None and not s.pending and s.logits is not None]
        plan = self._schedule()
        if plan:
            inputs = [StepInput(s.slot, chunk, "last" if len(chunk) == len(s.pending) else "none") for s, chunk in plan]
            outputs = self.model.step(inputs)
            self.steps += 1
            self.step_rows += len(plan)
            self.step_tokens += sum(len(c) for _, c in plan)
            for (seq, chunk), logits in zip(plan, outputs):
                self.prompt_tokens += max(0, min(len(chunk), len(seq.prompt) - len(seq.fed)))
                seq.fed.extend(chunk)
                del seq.pending[: len(chunk)]
                self._after_chunk(seq, logits)
                if logits is not None:
                    ready.append(seq)
        if ready:
            self._sample(ready)

    def _after_chunk(self, seq: Sequence, logits) -> None:
        at_prompt_end = len(seq.fed) == len(seq.prompt)
        if logits is not None:
            seq.logits = logits
        if at_prompt_end and seq.reservation is not None:
            entry, seq.reservation = seq.reservation, None
            for waiter in self.cache.fill(entry, self.model.read_state(seq.slot), logits):
                waiter.hit = entry
                self.waiting.appendleft(waiter)
        elif seq.pending and len(seq.fed) < len(seq.prompt) and len(seq.fed) % self.checkpoint_interval == 0:
            self.cache.insert(seq.job.partition, seq.fed, self.model.read_state(seq.slot))

    def _sample(self, seqs: list[Sequence]) -> None:
        result = sample_batch([s.sampler for s in seqs], np.stack([s.logits for s in seqs]))
        for n, seq in enumerate(seqs):
            token = int(result.tokens[n])
            seq.generated += 1
            self.generated_tokens += 1
            top = (tuple(result.top_logprobs[n]),) if result.top_logprobs and result.top_logprobs[n] else ()
            if token == 0 and seq.job.stop_on_eos:
                self._emit(seq, seq.text.finish(), ())
                self._finish(seq, "stop")
                continue
            piece = seq.text.push(self.tokenizer.token_bytes(token))
            logprob = (float(result.logprobs[n]),) if seq.sampler.options.wants_logprobs else ()
            self._emit(seq, piece.text, (token,), logprob, top)
            if piece.stopped:
                self._finish(seq, "stop")
            elif seq.generated >= seq.job.max_tokens:
                self._emit(seq, seq.text.finish(), ())
                self._finish(seq, "length")
            else:
                seq.pending = [token]

    def _emit(self, seq: Sequence, text: str, tokens, logprobs=(), top=()) -> None:
        if text or tokens:
            seq.send(TextPiece(seq.index, text, tuple(tokens), tuple(logprobs), top))

    # ------------------------------------------------------------------ ending

    def _finish(self, seq: Sequence, reason: str, cache: bool = True) -> None:
        if cache and seq.logits is not None and seq.fed and not seq.pending:
            # The state after everything the model has read, keyed by those tokens: the next
            # turn of a chat starts with them and computes only its new text.
            self.cache.insert(seq.job.partition, seq.fed, self.model.read_state(seq.slot), seq.logits)
        self._release(seq)
        self.finished += 1
        seq.send(Finished(seq.index, reason, len(seq.prompt), seq.generated))

    def _release(self, seq: Sequence) -> None:
        if seq.reservation is not None:
            for waiter in self.cache.abandon(seq.reservation):
                self.waiting.appendleft(waiter)
            seq.reservation = None
        if seq.slot is not None and self.slots[seq.slot] is seq:
            self.slots[seq.slot] = None
        seq.slot = None

    def _fail_all(self, error: str) -> None:
        for seq in [s for s in self.slots if s is not None] + list(self.waiting) + self.cache.clear():
            self._release(seq)
            seq.send(Failed(error, "unloaded", seq.index))
        self.waiting.clear()
        while True:
            try:
                job = self.inbox.get_nowait()
            except queue.Empty:
                break
            if isinstance(job, GenerateJob):
                job.reply(Failed(error, "unloaded"))


def _log_softmax(logits: np.ndarray) -> np.ndarray:
    logits = np.asarray(logits, dtype=np.float32)
    shifted = logits - logits.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))


def _perplexity(first_logits, state, choice, run) -> float:
    """Mean negative log-likelihood of `choice` given the logits before it and the state."""
    logp = _log_softmax(first_logits)[choice[0]]
    if len(choice) > 1:
        rest, _ = run(choice[:-1], state, full_output=True)
        logp += _log_softmax(rest)[np.arange(len(choice) - 1), list(choice[1:])].sum()
    return float(-logp / len(choice))
