"""The jobs that need no slot: embeddings, choice perplexities, prompt scores and state
reads. The backend runs them between two steps, each on a state of its own, starting
from the prefix cache where it holds the prompt.
"""

from __future__ import annotations

import numpy as np

from ..messages import (
    Chosen,
    ChooseJob,
    Embeddings,
    EmbedJob,
    PromptScores,
    ScoreJob,
    StateJob,
    StateRead,
)
from .state_cache import StateCache


class Queries:
    def __init__(self, model, cache: StateCache, token_chunk_size: int):
        self.model, self.cache = model, cache
        self.token_chunk_size = max(1, token_chunk_size)
        self.handlers = {EmbedJob: self.embed, ChooseJob: self.choose, StateJob: self.read_state,
                         ScoreJob: self.score}

    def run(self, job) -> None:
        self.handlers[type(job)](job)

    def embed(self, job: EmbedJob) -> None:
        """The mean of the last layer's hidden states, normalised."""
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

    def choose(self, job: ChooseJob) -> None:
        """Perplexity of each choice after the prompt (Ai00 §5.7)."""
        logits, state = self._prefix(job.partition, job.prompt, job.initial_state)
        if job.calibrate:  # the choices on their own: after end-of-text, from the initial state
            alone, alone_state = self._run_chunked((0,), job.initial_state)
        scores = []
        for choice in job.choices:
            if not choice:
                scores.append(float("inf"))
                continue
            score = self._perplexity(logits, state, choice)
            if job.calibrate:
                score -= self._perplexity(alone, alone_state, choice)
            scores.append(score)
        job.reply(Chosen(tuple(scores), len(job.prompt)))

    def score(self, job: ScoreJob) -> None:
        """Each prompt token's log-probability after the tokens before it, chunk by chunk
        (a chunk's logits are reduced at once: a long prompt never holds [T, V] floats)."""
        tokens, state = job.tokens, job.initial_state
        logprobs: list[float | None] = [None]
        tops: list[tuple] = [()]
        for start in range(0, len(tokens) - 1, self.token_chunk_size):
            chunk = tokens[start : start + self.token_chunk_size]
            rows, state = self.model.forward(chunk, state, full_output=True)
            targets = list(tokens[start + 1 : start + 1 + len(chunk)])
            logp = log_softmax(rows[: len(targets)])
            logprobs.extend(float(v) for v in logp[np.arange(len(targets)), targets])
            if job.top:
                best = np.argsort(-logp, axis=1)[:, : job.top]
                tops.extend(tuple((int(t), float(row[t])) for t in ids) for row, ids in zip(logp, best))
            else:
                tops.extend(() for _ in targets)
        job.reply(PromptScores(tuple(tokens), tuple(logprobs), tuple(tops)))

    def read_state(self, job: StateJob) -> None:
        _, state = self._prefix(job.partition, job.tokens, job.initial_state)
        job.reply(StateRead(state.copy() if state is not None else self.model.initial_state(), len(job.tokens)))

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
            state, logits, rest = entry.state, entry.logits, tokens[entry.length :]
        else:
            state, logits, rest = initial, None, tokens
        if rest:
            logits, state = self._run_chunked(rest, state)
        return logits, state

    def _perplexity(self, first_logits, state, choice) -> float:
        """Mean negative log-likelihood of `choice` given the logits before it and the state."""
        logp = log_softmax(first_logits)[choice[0]]
        if len(choice) > 1:
            rest, _ = self._run_chunked(choice[:-1], state, full_output=True)
            logp += log_softmax(rest)[np.arange(len(choice) - 1), list(choice[1:])].sum()
        return float(-logp / len(choice))


def log_softmax(logits: np.ndarray) -> np.ndarray:
    logits = np.asarray(logits, dtype=np.float32)
    shifted = logits - logits.max(axis=-1, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=-1, keepdims=True))
