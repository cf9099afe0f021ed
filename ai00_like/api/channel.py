"""Events from the serving threads to the coroutine that waits for them.

The middleware and backend call `reply(event)` from their own threads; the event is
handed to the event loop with `call_soon_threadsafe`, so a waiting handler wakes as soon
as a token exists: no polling anywhere.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable
from typing import Any


class EventChannel:
    def __init__(self) -> None:
        self._loop = asyncio.get_running_loop()
        self._queue: asyncio.Queue = asyncio.Queue()

    def reply(self, tag: Any = None) -> Callable[[Any], None]:
        """A thread-safe callable that delivers `(tag, event)`; the tag tells several senders apart."""
        loop, put = self._loop, self._queue.put_nowait

        def deliver(event) -> None:
            try:
                loop.call_soon_threadsafe(put, (tag, event))
            except RuntimeError:  # the loop is closed: the server is shutting down
                pass

        return deliver

    async def get(self, timeout: float | None = None) -> tuple[Any, Any] | None:
        """The next (tag, event), or None when `timeout` seconds pass without one."""
        if timeout is None:
            return await self._queue.get()
        try:
            return await asyncio.wait_for(self._queue.get(), timeout)
        except asyncio.TimeoutError:
            return None

    async def first(self, timeout: float | None = None) -> Any:
        """For one-reply messages (GetInfo, Load, Embed, …): just the event."""
        item = await self.get(timeout)
        return None if item is None else item[1]
