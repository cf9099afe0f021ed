"""Speculative decoding with prompt-lookup drafts and state rollback (backend.py's part).

Before a step, a decoding sequence may append a draft (drafts.py) to the token it reads
next; the step runs them as one segment of its slot and returns the logits after each.
The sequence then samples as it would have without a draft, position by position: while
the sampled token is the draft's next one, the draft's token is the model's own and the
logits after it are valid, so it samples again. The first token that differs ends the
check; it is the next token to read, as any sampled token is.

This is the standard rejection rule for a draft that proposes one token with certainty:
sampled normally, the token equals the draft's with probability p(draft), and otherwise
follows p without it, renormalised. So sampling keeps its distribution, greedy its tokens,
and penalties, grammars, stop strings and logprobs see the same tokens in the same order
(each position samples from its own logits with the sampler's state after the tokens
before it). A seeded request draws one number a sampled token, as without drafts.

The step ran the slot's state through the whole draft. Where a token failed, the state is
rolled back to its copy from before the step and the accepted tokens are read again at the
head of the next step's segment (the next draft behind them): a pass of a memory-bound
step costs little more for a few rows, so a failed draft costs a copy of the state. A
sequence that ends within its draft reads its accepted tokens again at once, so that the
state it leaves (for the prefix cache and the Responses API) holds exactly what it read.

A draft is worth its rows where the tokens it is expected to save outweigh what its rows
add to the step. `StepCosts` learns that from the steps' own times by their rows. A draft
of k tokens, each the model's own with the sequence's chance p (drafts.py), saves
p + p² + … + pᵏ tokens, each worth a row's share of the step; its rows add what a step of
that many more rows costs. A busy batch's steps are bound by their rows, and a row's
share of the step is then what a row adds: no drafts. So drafts go where they pay, and
only as long as they do; at most `ROOM` rows a step.
"""

from __future__ import annotations

import bisect

import numpy as np

from ..rwkv.batch import StepInput
from .drafts import Drafter
from .sequence import Sequence

ROOM = 16  # rows a step may have with its drafts
PRIOR_ROW_SHARE = 0.25  # what a further row adds to a one-row step, until the steps have said


class StepCosts:
    """What a decoding step costs by its rows, learnt from the steps' times (a moving average
    for each number of rows). The first row past one costs most: on two Zen 3 cores, 0.1B
    bf16, steps of 1, 2, 3 and 5 rows took 1, 1.64, 1.93 and 2.08 times a one-row step."""

    WEIGHT = 0.1

    def __init__(self):
        self.seconds: dict[int, float] = {}
        self.seen: list[int] = []  # the row counts of `seconds`, sorted: `of` runs in every step

    def observe(self, rows: int, seconds: float) -> None:
        before = self.seconds.get(rows)
        if before is None:
            bisect.insort(self.seen, rows)
        self.seconds[rows] = seconds if before is None else before + self.WEIGHT * (seconds - before)

    def of(self, rows: int) -> float:
        """A step of `rows` rows in seconds (relative, before any step: one row = 1): seen, or
        between the nearest seen row counts, or past them along the last two's slope."""
        known = self.seconds.get(rows)
        if known is not None:
            return known
        seen, seconds = self.seen, self.seconds
        at = bisect.bisect_left(seen, rows)  # seen[:at] are below rows, seen[at:] above
        if 0 < at < len(seen):
            a, b = seen[at - 1], seen[at]
            return seconds[a] + (seconds[b] - seconds[a]) * (rows - a) / (b - a)
        if at >= 2:
            a, b = seen[at - 2], seen[at - 1]
            return seconds[b] + max(0.0, seconds[b] - seconds[a]) / (b - a) * (rows - b)
        base, at = (seconds[seen[0]], seen[0]) if at == 1 else (1.0, 1)
        one = base / (1 + PRIOR_ROW_SHARE * (at - 1))
        return base + PRIOR_ROW_SHARE * one * (rows - at)


def best_draft(chance: float, costs: StepCosts, rows: int, longest: int) -> int:
    """The draft length (0: none) that saves the most time in a step of `rows` rows without
    it: k draft tokens, each the model's own with `chance` after the ones before, save
    chance + chance² + … + chanceᵏ tokens, each worth a row's share of the step."""
    step = costs.of(rows)
    per_token = step / rows
    best, best_gain, saved, p = 0, 0.0, 0.0, 1.0
    for k in range(1, longest + 1):
        p *= chance
        saved += p
        gain = saved * per_token - (costs.of(rows + k) - step)
        if gain > best_gain:
            best, best_gain = k, gain
    return best


class Speculation:
    """The drafts of one backend's sequences, and their check after a step."""

    def __init__(self, model):
        self.model = model
        self.costs = StepCosts()
        self.drafted = self.accepted = 0  # draft tokens checked, and of them the model's own

    def propose(self, running: list[Sequence]) -> None:
        """Give decoding sequences their drafts for the next step, where they pay."""
        decoding = [s for s in running if s.pending and s.decoding and not s.cancelled]
        rows = sum(len(s.pending) for s in decoding)
        if len(decoding) != len([s for s in running if s.pending]):
            return  # a prompt in the step: its rows make it a prefill step (and the drafts' rows dear)
        for seq in decoding:
            longest = min(seq.job.draft_tokens, ROOM - rows, seq.job.max_tokens - seq.generated - 1)
            if longest <= 0 or (seq.drafter is not None and seq.drafter.paused):
                continue  # (the check below costs a small model's step a few percent: only where it may draft)
            if seq.drafter is None:
                seq.drafter = Drafter(seq.prompt + seq.fed[len(seq.prompt):] + seq.pending)
            k = best_draft(seq.drafter.chance, self.costs, rows, longest)
            if k == 0:
                if best_draft(1.0, self.costs, rows, longest):
                    seq.drafter.pause()  # its drafts fail too often; not just a step too full for any draft
                continue
            draft = seq.drafter.draft(k)
            if draft:
                seq.draft = draft
                seq.pending = seq.pending + draft
                seq.snapshot = (self.model.read_state(seq.slot), len(seq.fed))
                rows += len(draft)

    @staticmethod
    def step_input(seq: Sequence, chunk: list[int]) -> StepInput:
        """A drafting sequence's segment: the logits of its draft's tokens and the one before."""
        return StepInput(seq.slot, chunk, len(seq.draft) + 1)

    def check(self, seqs: list[Sequence], sample_round) -> list[tuple[Sequence, str]]:
        """Sample a token for each of `seqs`, and again for those with a draft while they
        sample its tokens (`sample_round(seqs, rows)` samples one row each and returns why
        each sequence ended, None to go on); returns the sequences that ended, and why."""
        rows = {id(s): s.logits if s.draft else s.logits[None] for s in seqs}
        ended, going, position = [], list(seqs), 0
        accepted = {id(s): 0 for s in seqs}
        while going:
            reasons = sample_round(going, [rows[id(s)][position] for s in going])
            still = []
            for seq, reason in zip(going, reasons):
                if reason is not None:
                    ended.append((seq, reason))
                elif position < len(seq.draft) and seq.last_token == seq.draft[position]:
                    accepted[id(seq)] += 1
                    still.append(seq)
            going, position = still, position + 1
        for seq in seqs:
            if seq.draft:
                self._settle(seq, accepted[id(seq)], rows[id(seq)], ended=any(s is seq for s, _ in ended))
        return ended

    def _settle(self, seq: Sequence, accepted: int, rows: np.ndarray, ended: bool) -> None:
        """After the check: the slot's state holds the accepted tokens and nothing after."""
        drafted, state, fed_before = len(seq.draft), *seq.snapshot
        self.drafted += drafted
        self.accepted += accepted
        seq.drafter.checked(drafted, accepted)
        read = seq.fed[fed_before:]  # what the step ran: replayed tokens, the token, the draft
        kept = read[: len(read) - drafted + accepted]
        seq.draft, seq.snapshot = [], None
        seq.logits = rows[accepted]
        if ended:  # each accepted token had set `pending` to itself; an ended sequence reads nothing more
            seq.pending = []
        if accepted == drafted:
            return
        self.model.write_state(seq.slot, state)
        del seq.fed[fed_before:]
        if ended:  # read again now: the state it leaves must hold what it read
            self.model.step([StepInput(seq.slot, kept, "none")])
            seq.fed.extend(kept)
            return
        seq.logits = None
        seq.pending = kept + seq.pending
