"""Events from the serving threads to the coroutines that wait for them.

The middleware and backend call `reply(event)` from their own threads. Events are handed
to the event loop through one inbox per loop: the first event of a burst schedules one
wake-up (`call_soon_threadsafe`), later ones join it. A batched step that produces a
token for each of 16 streams thus wakes the loop once, not 16 times, and a waiting
handler still runs as soon as its token exists: no polling anywhere.
"""

from __future__ import annotations

import asyncio
import threading
from collections import deque
from collections.abc import Callable
from typing import Any


class _LoopInbox:
    """Thread-safe hand-over of (channel, item) pairs to one event loop, one wake-up per burst."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop = loop
        self.items: deque = deque()
        self.lock = threading.Lock()
        self.wake_pending = False

    def deliver(self, channel: "EventChannel", item) -> None:
        with self.lock:
            self.items.append((channel, item))
            if self.wake_pending:
                return
            self.wake_pending = True
        try:
            self.loop.call_soon_threadsafe(self._flush)
        except RuntimeError:  # the loop is closed: the server is shutting down
            pass

    def _flush(self) -> None:
        with self.lock:
            items, self.items = self.items, deque()
            self.wake_pending = False
        for channel, item in items:
            channel.put(item)


_inboxes: dict[asyncio.AbstractEventLoop, _LoopInbox] = {}


def _inbox(loop: asyncio.AbstractEventLoop) -> _LoopInbox:
    inbox = _inboxes.get(loop)
    if inbox is None or inbox.loop.is_closed():
        for old in [lp for lp in _inboxes if lp.is_closed()]:
            del _inboxes[old]
        inbox = _inboxes[loop] = _LoopInbox(loop)
    return inbox


class EventChannel:
    """One consumer's events, in order. Not an asyncio.Queue: a stream takes one event per
    token, and a bare future with a plain timer is a good deal cheaper per wait than a
    queue getter under `asyncio.timeout`."""

    def __init__(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._inbox = _inbox(self._loop)
        self._items: deque = deque()
        self._waiter: asyncio.Future | None = None

    def reply(self, tag: Any = None) -> Callable[[Any], None]:
        """A thread-safe callable that delivers `(tag, event)`; the tag tells several senders apart."""
        deliver = self._inbox.deliver

        def reply(event) -> None:
            deliver(self, (tag, event))

        return reply

    def put(self, item) -> None:
        """On the loop's thread: queue `item` and wake the waiting consumer."""
        self._items.append(item)
        waiter = self._waiter
        if waiter is not None and not waiter.done():
            waiter.set_result(None)

    @property
    def ready(self) -> bool:
        """Whether `get` has an item at once: events that reached the loop together (a step
        the loop was late for) can then go out together."""
        return bool(self._items)

    async def get(self, timeout: float | None = None) -> tuple[Any, Any] | None:
        """The next (tag, event), or None when `timeout` seconds pass without one."""
        if not self._items:
            waiter = self._waiter = self._loop.create_future()
            timer = None if timeout is None else self._loop.call_later(timeout, _wake, waiter)
            try:
                await waiter
            finally:
                self._waiter = None
                if timer is not None:
                    timer.cancel()
            if not self._items:
                return None
        return self._items.popleft()

    async def first(self, timeout: float | None = None) -> Any:
        """For one-reply messages (GetInfo, Load, Embed, …): just the event."""
        item = await self.get(timeout)
        return None if item is None else item[1]


def _wake(waiter: asyncio.Future) -> None:
    if not waiter.done():
        waiter.set_result(None)
