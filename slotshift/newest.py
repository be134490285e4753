"""A newest-wins box: one value between a producer and one consumer; a newer value replaces an
older one not yet taken.

For figures and orders where only the latest matters (the agent's newest report, the newest
allocation for a gateway): while the consumer is slow or its stream is down, memory stays
bounded and the first value it takes afterwards is the freshest, not a backlog of stale ones.
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import Generic, TypeVar

T = TypeVar("T")


class NewestBox(Generic[T]):
    """Holds at most one value not yet taken; one consumer waits for it.

    Not thread-safe: producer and consumer run on one event loop. None is not a value: take()
    answers None for "woken without a value" or "closed".
    """

    def __init__(self) -> None:
        self._value: T | None = None
        self._ready = asyncio.Event()
        self._closed = False

    def put(self, value: T) -> bool:
        """Offer a value and wake the consumer; True if it replaced one that was never taken."""
        superseded = self._value is not None
        self._value = value
        self._ready.set()
        return superseded

    def put_back(self, value: T) -> None:
        """Return a value taken but not used, unless a newer one has arrived since (the newer
        one wins)."""
        if self._value is None:
            self._value = value
            self._ready.set()

    def wake(self) -> None:
        """Wake the waiting consumer even without a value (e.g. its stream has ended, and it
        should look again)."""
        self._ready.set()

    def close(self) -> None:
        """For good: from now on take() and take_nowait() answer None, dropping any value."""
        self._closed = True
        self._ready.set()

    def take_nowait(self) -> T | None:
        """The waiting value, without waiting; None when there is none or the box is closed."""
        if self._closed or self._value is None:
            return None
        self._ready.clear()
        value, self._value = self._value, None
        return value

    @property
    def closed(self) -> bool:
        """Whether close() was called."""
        return self._closed

    async def wait_ready(self, timeout_s: float) -> None:
        """Wait until a value is put, the box is woken or closed, or `timeout_s` passes,
        whichever is first; takes no value (a consumer holding one back waits for news with
        it). A wake without a value is consumed: the next wait waits again."""
        if not self._ready.is_set() and timeout_s > 0:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._ready.wait(), timeout_s)
        if self._value is None and not self._closed:
            self._ready.clear()

    async def take(self) -> T | None:
        """The waiting value once there is one; None if wake() came first without a value, or
        the box is closed."""
        await self._ready.wait()
        self._ready.clear()
        if self._closed:
            return None
        value, self._value = self._value, None
        return value
