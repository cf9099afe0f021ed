"""Speculative decoding benchmark: one stream's decoding rate with prompt-lookup drafts against
the same request without them (`speculative: false`), in the same run, through the serving
core (Middleware and Backend, as the HTTP tier drives them).

* the demo model, greedy, batch 1: copying tasks (a text it has begun to repeat, a
  200-line code file handed back with one change, a paragraph quoted) and a chat that
  copies nothing; the replies must be the same tokens.
* the mechanics at a larger shape (seeded bf16 `.pth`, default 0.1B; `--shape 1.5B`):
  drafts forced to be accepted 100%, 50% (the first half of each draft) and 0%, from
  the plain run's own greedy tokens, with k = 4; `--weights` keeps them packed (as
  bench/engine.py's --precisions: int8+head, nf4+head, +rounded for `exact = false`).

Rounds alternate plain and speculative runs; medians are printed as tokens/s after the
first token (the prompt's prefill left out) and their ratio, then saved as JSON.

    .venv/bin/python bench/speculative.py [--rounds 3] [--tokens 128] [--shape 0.1B] [--draft-tokens 4] [--device gpu]
        [--weights int8+head+rounded]
"""

from __future__ import annotations

import argparse
import json
import queue
import statistics
import time
from pathlib import Path

import record
from local import note
from shapes import bf16_checkpoint

from ai00_like.api.oai.prompt import render_chat
from ai00_like.api.oai.types import ChatMessage
from ai00_like.backend import speculation
from ai00_like.backend.drafts import Drafter
from ai00_like.messages import Cancel, Failed, Finished, Generate, Load, Loaded, ModelSpec, TextPiece
from ai00_like.middleware import Middleware
from ai00_like.sampler import Nucleus, SamplingOptions

MODELS = Path(__file__).resolve().parents[1] / "assets" / "models"
GREEDY = SamplingOptions(sampler=Nucleus(temperature=0, presence_penalty=0, frequency_penalty=0))
DOC = ("The quick brown fox jumps over the lazy dog. The rain in Spain stays mainly in the plain. "
       "She sells sea shells by the sea shore. Peter Piper picked a peck of pickled peppers. ") * 4
# The copying tasks: a code file of about 200 lines handed back with one change, and a
# question answered by quoting a paragraph. The prompts are what the chat route renders (blank
# lines in a message become one newline), the reply begun as a chat client's prefill would.
CODE = "\n".join(f"def step_{i}(x):\n    return x * {i % 7 + 2} + {i}\n" for i in range(67))


def chat(question: str, begun: str = "") -> str:
    return render_chat([ChatMessage(role="user", content=question)]).prompt + (" " + begun if begun else "")


COPY = chat(f"Repeat this text exactly: {DOC}", DOC[:60])
CHAT = chat("Tell me about the sea and the ships that sail on it.")
EDIT = chat(f"Return this file with `x * 2 + 0` changed to `x * 3 + 0`:\n\n{CODE}", CODE.splitlines()[0])
PARAGRAPH = ("The harbour was built in 1820 from granite cut on the island. Its walls are twelve feet "
             "thick and rise thirty feet above the low tide. Ships from three continents unloaded there "
             "until the railway came, and the old customs house still stands at the end of the quay.")
QUOTE = chat(f"{PARAGRAPH}\nQuote the sentences about the walls and the ships word for word.", '"Its walls')
TASKS = (("copy", COPY), ("code", EDIT), ("quote", QUOTE), ("chat", CHAT))


class Stream:
    """One request's tokens and the time from its first token to its end."""

    def __init__(self, mw: Middleware, prompt: str, max_tokens: int, speculative: bool):
        self.events: queue.Queue = queue.Queue()
        mw.send(Generate(prompt=prompt, reply=self.events.put, cancel=Cancel(), options=GREEDY,
                         max_tokens=max_tokens, stop_on_eos=False, speculative=speculative))
        self.tokens: list[int] = []
        first = None
        while True:
            event = self.events.get(timeout=1200)
            if isinstance(event, TextPiece) and event.tokens:
                self.tokens.extend(event.tokens)
                first = first or time.perf_counter()
            elif isinstance(event, Failed):
                raise SystemExit(f"request failed: {event.message}")
            elif isinstance(event, Finished):
                break
        self.rate = (len(self.tokens) - 1) / (time.perf_counter() - first)


def weight_options(weights: str) -> dict:
    """ModelSpec's fields for `--weights`: "auto" (the file's precision), or int8/nf4 with
    "+head" (the head quantised too) and "+rounded" (exact = false)."""
    kind, *options = weights.split("+")
    if kind == "auto":
        return {}
    return dict(quant=1000, quant_type=kind, quant_head="head" in options, exact="rounded" not in options)


def load(path: Path, tokenizer: str | None, draft_tokens: int, device: str, weights: str = "auto") -> Middleware:
    mw, box = Middleware(), queue.Queue()
    spec = ModelSpec(path=str(path), tokenizer=tokenizer, max_batch=4, draft_tokens=draft_tokens, device=device,
                     **weight_options(weights))
    mw.send(Load(spec, box.put))
    if not isinstance(box.get(timeout=1200), Loaded):
        raise SystemExit(f"could not load {path}")
    model = next(iter(mw.models.values())).model
    if hasattr(model, "wait_for_kernels"):
        model.wait_for_kernels()  # a cold kernel cache serves on numpy meanwhile: not what is measured
    return mw


def compare(mw: Middleware, prompt: str, tokens: int, rounds: int) -> dict:
    """Plain and speculative runs of one greedy request, alternating; medians and sameness."""
    Stream(mw, prompt, 4, False)  # the prompt's state into the prefix cache
    counts = next(iter(mw.models.values())).backend.speculation
    drafted, accepted = counts.drafted, counts.accepted
    plain, spec, same = [], [], True
    for _ in range(rounds):
        a, b = Stream(mw, prompt, tokens, False), Stream(mw, prompt, tokens, True)
        plain.append(a.rate)
        spec.append(b.rate)
        same = same and a.tokens == b.tokens
    return {"plain_tps": statistics.median(plain), "speculative_tps": statistics.median(spec),
            "ratio": statistics.median(spec) / statistics.median(plain), "same_tokens": same,
            "drafted": counts.drafted - drafted, "accepted": counts.accepted - accepted}


class ForcedDrafter(Drafter):
    """Drafts from a known reply: right for the first `right` tokens of each, then wrong. How
    long a draft, and whether to draft at all, is the backend's choice as for any draft."""

    reply: list[int] = []
    prompt_length = 0
    right = 4

    def draft(self, k: int) -> list[int]:
        at = len(self.tokens) - self.prompt_length  # tokens of the reply the sequence has
        truth = self.reply[at : at + k]
        return [t if i < self.right else (t + 1) % 1000 for i, t in enumerate(truth)]


def forced(mw: Middleware, prompt: str, tokens: int, rounds: int, k: int) -> dict:
    reference = Stream(mw, prompt, tokens + 8, False)
    loaded = next(iter(mw.models.values()))
    ForcedDrafter.reply = reference.tokens
    ForcedDrafter.prompt_length = len(loaded.encode(prompt))
    speculation.Drafter = ForcedDrafter
    results = {}
    try:
        for right, name in ((k, "100%"), (k // 2, "50%"), (0, "0%")):
            ForcedDrafter.right = right
            note(f"forced drafts, {name} accepted")
            results[name] = compare(mw, prompt, tokens, rounds)
    finally:
        speculation.Drafter = Drafter
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--shape", default="0.1B", help="the forced-draft mechanics' shape (bench/shapes.py)")
    parser.add_argument("--draft-tokens", type=int, default=4, help="the longest draft ([model] draft_tokens)")
    parser.add_argument("--device", default="auto", help="[model] device: cpu, gpu or an adapter index")
    parser.add_argument("--skip-demo", action="store_true", help="only the forced drafts at --shape")
    parser.add_argument("--weights", default="auto", help="the forced drafts' model: auto, or e.g. int8+head+rounded")
    parser.add_argument("--no-save", action="store_true", help=record.NO_SAVE_HELP)
    args = parser.parse_args()
    results = {}
    if not args.skip_demo:
        note("demo model")
        mw = load(MODELS / "demo.st", str(MODELS / "demo_vocab.txt"), args.draft_tokens, args.device)
        try:
            for task, prompt in TASKS:
                note(f"demo, {task}")
                results[f"demo_{task}"] = compare(mw, prompt, args.tokens, args.rounds)
        finally:
            mw.close()
    note(f"{args.shape} shape, forced drafts")
    mw = load(bf16_checkpoint(args.shape), None, args.draft_tokens, args.device, args.weights)
    try:
        results[f"forced_{args.shape}"] = forced(mw, CHAT, args.tokens, args.rounds, args.draft_tokens)
    finally:
        mw.close()
    print(f"{'run':<24} {'plain t/s':>10} {'spec t/s':>10} {'ratio':>7}  same  drafted accepted")
    rows = [(f"demo {task}", results.get(f"demo_{task}")) for task, _ in TASKS]
    rows += [(f"{args.shape} forced {k}", v) for k, v in results[f"forced_{args.shape}"].items()]
    for name, r in [(n, r) for n, r in rows if r is not None]:
        print(f"{name:<24} {r['plain_tps']:>10.1f} {r['speculative_tps']:>10.1f} {r['ratio']:>7.2f}  {r['same_tokens']!s:<5} "
              f"{r['drafted']:>7} {r['accepted']:>8}")
    print(json.dumps(results))
    record.save("speculative", results, args)


if __name__ == "__main__":
    main()
