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
    """Thread-safe hand-over of (queue, item) pairs to one event loop, one wake-up per burst."""

    def __init__(self, loop: asyncio.AbstractEventLoop):
        self.loop = loop
        self.items: deque = deque()
        self.lock = threading.Lock()
        self.wake_pending = False

    def deliver(self, queue: asyncio.Queue, item) -> None:
        with self.lock:
            self.items.append((queue, item))
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
        for queue, item in items:
            queue.put_nowait(item)


_inboxes: dict[asyncio.AbstractEventLoop, _LoopInbox] = {}


def _inbox(loop: asyncio.AbstractEventLoop) -> _LoopInbox:
    inbox = _inboxes.get(loop)
    if inbox is None or inbox.loop.is_closed():
        for old in [lp for lp in _inboxes if lp.is_closed()]:
            del _inboxes[old]
        inbox = _inboxes[loop] = _LoopInbox(loop)
    return inbox


class EventChannel:
    def __init__(self) -> None:
        self._inbox = _inbox(asyncio.get_running_loop())
        self._queue: asyncio.Queue = asyncio.Queue()

    def reply(self, tag: Any = None) -> Callable[[Any], None]:
        """A thread-safe callable that delivers `(tag, event)`; the tag tells several senders apart."""
        deliver, queue = self._inbox.deliver, self._queue

        def reply(event) -> None:
            deliver(queue, (tag, event))

        return reply

    async def get(self, timeout: float | None = None) -> tuple[Any, Any] | None:
        """The next (tag, event), or None when `timeout` seconds pass without one."""
        try:
            return self._queue.get_nowait()  # the common case while tokens flow: no timer at all
        except asyncio.QueueEmpty:
            pass
        if timeout is None:
            return await self._queue.get()
        try:
            async with asyncio.timeout(timeout):  # cheaper than wait_for: no extra task
                return await self._queue.get()
        except TimeoutError:
            return None

    async def first(self, timeout: float | None = None) -> Any:
        """For one-reply messages (GetInfo, Load, Embed, …): just the event."""
        item = await self.get(timeout)
        return None if item is None else item[1]
