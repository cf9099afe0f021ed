"""Driving the middleware and backend threads through their message API, as the HTTP tier does."""

from __future__ import annotations

import queue
import threading

from ai00_like.messages import Cancel, Failed, Finished, Generate, Load, Started, TextPiece
from ai00_like.sampler import Nucleus, SamplingOptions

GREEDY = SamplingOptions(sampler=Nucleus(temperature=0, presence_penalty=0, frequency_penalty=0))
TIMEOUT = 60
LOAD_TIMEOUT = 300  # s: a load that compiles the kernels (numba's cache cold) on a busy machine


class Reply:
    """Collects one request's events; `wait()` blocks until every choice has ended."""

    def __init__(self, order: list | None = None, name: str = "", timeline: list | None = None):
        self.events: queue.Queue = queue.Queue()
        self.order, self.name, self.timeline = order, name, timeline

    def __call__(self, event) -> None:
        if self.order is not None and isinstance(event, Started):
            self.order.append(self.name)
        if self.timeline is not None:
            self.timeline.append((self.name, event))  # list.append is atomic: one shared log
        self.events.put(event)

    def next(self):
        return self.events.get(timeout=TIMEOUT)

    def wait(self, n: int = 1) -> "Result":
        result = Result(n)
        while not result.done:
            result.add(self.next())
        return result


class Result:
    def __init__(self, n: int):
        self.text = [""] * n
        self.tokens: list[list[int]] = [[] for _ in range(n)]
        self.finish: list[str | None] = [None] * n
        self.started: list[Started | None] = [None] * n
        self.failed: Failed | None = None
        self.usage: list[tuple[int, int] | None] = [None] * n

    @property
    def done(self) -> bool:
        return self.failed is not None or all(f is not None for f in self.finish)

    def add(self, event) -> None:
        if isinstance(event, Started):
            self.started[event.index] = event
        elif isinstance(event, TextPiece):
            self.text[event.index] += event.text
            self.tokens[event.index].extend(event.tokens)
        elif isinstance(event, Finished):
            self.finish[event.index] = event.reason
            self.usage[event.index] = (event.prompt_tokens, event.completion_tokens)
        elif isinstance(event, Failed):
            self.failed = event


def generate(middleware, prompt: str, *, options=GREEDY, max_tokens: int = 16, stop=(), n: int = 1,
             reply: Reply | None = None, cancel: Cancel | None = None, **kwargs) -> Reply:
    reply = reply or Reply()
    middleware.send(Generate(prompt=prompt, reply=reply, cancel=cancel or Cancel(), options=options,
                             max_tokens=max_tokens, stop=tuple(stop), n=n, **kwargs))
    return reply


def load(middleware, spec):
    done = threading.Event()
    box = []

    def reply(event):
        box.append(event)
        done.set()

    middleware.send(Load(spec, reply))
    assert done.wait(LOAD_TIMEOUT), "load timed out"
    return box[0]
