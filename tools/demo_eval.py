"""Measure the demo model's G1 formats: thinking, short JSON answers and tool calls.

    nice -n 19 .venv/bin/python tools/demo_eval.py            # 50 prompts a kind, about 1-2 min
    nice -n 19 .venv/bin/python tools/demo_eval.py --n 10 --show 3

Loads assets/models/demo.st with the project's own engine (ai00_like.rwkv.load_model, the
demo vocabulary) and decodes with the project's sampler, unconstrained (no grammar), each
reply ending at the blank line as the chat route's default stop does, or at end-of-text,
or at the token limit. Two decodings: greedy after the chat route's default repetition
penalties (Ai00's 0.3/0.3), and the chat route's default sampler (top_p 0.5, seeded).

Prompts are rendered as the server renders them (tool prompts through
ai00_like.api.oai.tools / prompt) and made from verses of the held-out books, which the model
never trained on, except for tool requests (the toy tools take names, words and numbers).
The prompts come from tools/demo_data.G1Maker with a seed the training data does not use.

Rates:
  think          prompt "User: <question> think[ a bit| a lot]\\n\\nAssistant:" (no opening
                 written for it): the reply is "<think>\\n<lines>\\n</think>\\n<answer>", the
                 thinking non-empty, the answer non-empty, ended at the blank line
  think, opened  the same with the prompt ending "Assistant: <think" (the server's think mode)
  fake think     prompt ending "Assistant: <think>\\n</think" (thinking off): a non-empty answer
                 follows at once, ended at the blank line
  JSON           "... Answer in JSON." questions: the reply (max 64 tokens) parses as JSON
  tool call      tools offered in a System turn: the reply is <tool_call>{"name": <an offered
                 name>, "arguments": {...}}</tool_call> (thinking before it allowed) that parses
  right tool     ... and names the function the request is for
  right args     ... and its arguments equal the intended ones exactly
  forced call    the prompt already ends with the call's opening, as the server writes it for
                 tool_choice naming a function: 'Assistant: <tool_call>{"name": "<f>", "arguments": '
                 (unconstrained): the reply completes it to a call that parses
  uses result    after the call and its Observation turn, the answer ends at the blank line
                 and repeats a value of the observation that the request did not contain
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(Path(__file__).resolve().parent))

import demo_data

from ai00_like.rwkv import load_model
from ai00_like.rwkv.tokenizer import load_tokenizer
from ai00_like.sampler import Nucleus, RequestSampler, SamplingOptions, sample_batch

MODEL = REPO / "assets" / "models" / "demo.st"
VOCAB = REPO / "assets" / "models" / "demo_vocab.txt"
EVAL_SEED = 424242  # not a training seed: the prompts are new
EFFORTS = (" think a bit", " think", " think a lot")
THINK_REPLY = re.compile(r"<think>\n([^\n].*?)\n</think>\n(\S.*)", re.S)
TOOL_REPLY = re.compile(r"(?:<think>\n.*?</think>\n)?<tool_call>(.*)</tool_call>", re.S)


class Decoder:
    def __init__(self, model: Path = MODEL, vocab: Path = VOCAB):
        self.engine = load_model(model)
        self.tok = load_tokenizer(vocab)

    def reply(self, prompt: str, options: SamplingOptions, max_tokens: int) -> tuple[str, str]:
        """(text, finish): finish is "stop" (blank line or end-of-text) or "length"."""
        logits, state = self.engine.forward(self.tok.encode(prompt))
        sampler = RequestSampler(options, self.tok.vocab_size)
        out: list[int] = []
        for _ in range(max_tokens):
            token = int(sample_batch([sampler], logits[None]).tokens[0])
            if token == 0:
                return self.tok.decode(out), "stop"
            out.append(token)
            text = self.tok.decode_bytes(out)
            if b"\n\n" in text:
                return text[: text.index(b"\n\n")].decode("utf-8", "replace"), "stop"
            logits, state = self.engine.forward([token], state)
        return self.tok.decode_bytes(out).decode("utf-8", "replace"), "length"


def prompts(n: int, seed: int = EVAL_SEED):
    """The prompt sets, each a list of dicts."""
    verses = demo_data.read_kjv()
    maker = demo_data.G1Maker(verses, seed)
    maker.verses = [v for v in verses if v.book in demo_data.HELD_OUT]  # questions about unseen verses
    think, json_qs, tools = [], [], []
    for i in range(n):
        q, _, _ = maker.question()
        while q.startswith("Continue the verse"):  # an effort suffix would read as the verse's words
            q, _, _ = maker.question()
        think.append({"question": q + EFFORTS[i % 3], "plain": q})
        turn = maker.json_turn(last=False)
        json_qs.append({"question": turn[len("User: "): turn.index("\n\nAssistant:")]})
    maker.verses = [v for v in verses if v.book not in demo_data.HELD_OUT]  # what the toy tools know
    for _ in range(n):
        offered, target, req, args, obs, ans = maker.tool_example()
        tools.append({"tools": offered, "target": target, "request": req, "args": args, "obs": obs, "answer": ans})
    return think, json_qs, tools


def tool_prompts(example: dict) -> tuple[str, str]:
    """The server's prompt for the request, and for the answer after the call and its result."""
    from ai00_like.api.oai.prompt import render_chat
    from ai00_like.api.oai.tools import compact, with_tools
    from ai00_like.api.oai.types import ChatMessage, FunctionCallIn, ToolCallIn

    user = ChatMessage(role="user", content=example["request"])
    call = ChatMessage(role="assistant", content=None, tool_calls=[
        ToolCallIn(function=FunctionCallIn(name=example["target"], arguments=compact(example["args"])))])
    result = ChatMessage(role="tool", content=example["obs"])
    return (render_chat(with_tools([user], example["tools"])).prompt,
            render_chat(with_tools([user, call, result], example["tools"])).prompt)


def needles(example: dict) -> list[str]:
    """Values of the observation that the reference answer repeats and the request lacks."""
    values = set(re.findall(r"\d+(?::\d+)?", example["obs"])) | set(re.findall(r"[A-Za-z]{4,}", example["obs"]))
    return [v for v in values if re.search(rf"\b{re.escape(v)}\b", example["answer"])
            and not re.search(rf"\b{re.escape(v)}\b", example["request"])]


def parse_call(text: str):
    m = TOOL_REPLY.fullmatch(text.strip())
    if not m:
        return None
    try:
        call = json.loads(m.group(1))
    except ValueError:
        return None
    if not (isinstance(call, dict) and list(call) == ["name", "arguments"] and isinstance(call["arguments"], dict)):
        return None
    return call


def measure(dec: Decoder, n: int, options_list, show: int = 0) -> dict:
    think, json_qs, tools = prompts(n)
    results = {}
    for label, options in options_list:
        counts = dict.fromkeys(("think", "think_opened", "fake_think", "json", "tool_call", "right_tool",
                                "right_args", "forced_call", "uses_result"), 0)
        examples: dict[str, list] = {k: [] for k in counts}

        def note(key, prompt, text, ok):
            counts[key] += ok
            if len(examples[key]) < show:
                examples[key].append((ok, prompt[-80:], text))

        for p in think:
            base = f"User: {p['question']}\n\nAssistant:"
            text, finish = dec.reply(base, options, 200)
            m = THINK_REPLY.fullmatch(text.strip())
            note("think", base, text, bool(m and finish == "stop" and text.startswith(" <think>")))
            text, finish = dec.reply(base + " <think", options, 200)
            m = THINK_REPLY.fullmatch("<think" + text)
            note("think_opened", base + " <think", text, bool(m and finish == "stop"))
            fake = f"User: {p['plain']}\n\nAssistant: <think>\n</think"
            text, finish = dec.reply(fake, options, 200)
            note("fake_think", fake, text, bool(text.startswith(">\n") and text[2:].strip() and finish == "stop"))
        for p in json_qs:
            prompt = f"User: {p['question']}\n\nAssistant:"
            text, finish = dec.reply(prompt, options, 64)
            try:
                json.loads(text)
                ok = True
            except ValueError:
                ok = False
            note("json", prompt, text, ok)
        for ex in tools:
            first, second = tool_prompts(ex)
            text, finish = dec.reply(first, options, 100)
            call = parse_call(text)
            offered = {t.function.name for t in ex["tools"]}
            well_formed = bool(call and call["name"] in offered)
            note("tool_call", first, text, well_formed)
            note("right_tool", first, text, bool(well_formed and call["name"] == ex["target"]))
            note("right_args", first, text, bool(well_formed and call["name"] == ex["target"]
                                                  and call["arguments"] == ex["args"]))
            opening = f' <tool_call>{{"name": "{ex["target"]}", "arguments": '
            text, finish = dec.reply(first + opening, options, 100)
            call = parse_call(opening + text)
            note("forced_call", first + opening, text, bool(call and call["name"] == ex["target"]))
            text, finish = dec.reply(second, options, 100)
            want = needles(ex)
            note("uses_result", second, text, bool(finish == "stop" and want and any(
                re.search(rf"\b{re.escape(v)}\b", text) for v in want)))
        results[label] = {k: v / n for k, v in counts.items()}
        results[label + " examples"] = examples
    return results


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--n", type=int, default=50, help="prompts of each kind")
    p.add_argument("--model", default=str(MODEL))
    p.add_argument("--vocab", default=str(VOCAB))
    p.add_argument("--show", type=int, default=0, help="print this many replies of each kind")
    args = p.parse_args()
    start = time.time()
    dec = Decoder(Path(args.model), Path(args.vocab))
    options_list = [
        ("greedy", SamplingOptions(sampler=Nucleus(temperature=0))),  # the route's penalties, argmax
        ("sampled", SamplingOptions(sampler=Nucleus(), seed=1)),  # the chat route's defaults, seeded
    ]
    results = measure(dec, args.n, options_list, args.show)
    for label, _ in options_list:
        rates = results[label]
        print(f"{label:8s} " + "  ".join(f"{k} {v:.0%}" for k, v in rates.items()))
        for key, shown in results[label + " examples"].items():
            for ok, prompt, text in shown:
                print(f"  [{key} {'ok' if ok else 'FAIL'}] …{prompt!r} → {text!r}")
    print(f"{args.n} prompts of each kind, {time.time() - start:.0f} s")


if __name__ == "__main__":
    main()
