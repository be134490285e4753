"""A message body as it arrives on a connection, for the one task that reads it: the request
bodies the gateway's HTTP server reads (http_server.py) and the engine's answers its client reads
(upstream.py). The connection feeds it; its reader waits for what comes next. Reading stops on
the connection while more than a high-water mark waits unread, and starts again once it is read,
so that a peer faster than its reader is held back by TCP, not buffered."""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator
from typing import Protocol


class Pausable(Protocol):
    """The connection a body arrives on."""

    def pause_reading(self) -> None: ...

    def resume_reading(self) -> None: ...


class BodyBuffer:
    """What has arrived of one body and not been read. `deadline_s` (the loop's clock): waits
    for more raise TimeoutError past it (None: no deadline)."""

    __slots__ = (
        "_chunks",
        "_connection",
        "_deadline_s",
        "_eof",
        "_exception",
        "_high_water_bytes",
        "_size",
        "_waiter",
    )

    def __init__(
        self, connection: Pausable, *, high_water_bytes: int, deadline_s: float | None = None
    ) -> None:
        self._chunks: deque[bytes] = deque()
        self._size = 0
        self._eof = False
        self._exception: BaseException | None = None
        self._waiter: asyncio.Future[None] | None = None
        self._connection = connection
        self._high_water_bytes = high_water_bytes
        self._deadline_s = deadline_s

    # What the connection gives it.

    def feed(self, data: bytes) -> None:
        self._chunks.append(data)
        self._size += len(data)
        if self._size > self._high_water_bytes:
            self._connection.pause_reading()
        self._wake()

    def feed_eof(self) -> None:
        self._eof = True
        self._wake()

    def set_exception(self, exc: BaseException) -> None:
        """The body will not end: a read that finds nothing more raises `exc`."""
        self._exception = exc
        self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            if not waiter.done():
                waiter.set_result(None)

    # What its reader asks.

    def exception(self) -> BaseException | None:
        return self._exception

    def is_eof(self) -> bool:
        """Whether the body has ended (what it had may still wait to be read)."""
        return self._eof

    def at_eof(self) -> bool:
        """Whether the body has ended and all of it has been read."""
        return self._eof and not self._chunks

    def read_nowait(self) -> bytes:
        """What has arrived and not been read (b"" for nothing)."""
        chunks = self._chunks
        if not chunks:
            return b""
        data = chunks.popleft() if len(chunks) == 1 else b"".join(chunks)
        chunks.clear()
        self._size = 0
        self._connection.resume_reading()
        return data

    async def readany(self) -> bytes:
        """What has arrived and not been read, waited for; b"" once the body has ended. Raises
        what `set_exception` was given when the body cannot end, TimeoutError past the
        deadline."""
        while not self._chunks:
            if self._eof:
                return b""
            await self._wait()
        return self.read_nowait()

    async def iter_any(self) -> AsyncIterator[bytes]:
        """The body's parts as they arrive."""
        while data := await self.readany():
            yield data

    async def readexactly(self, n: int) -> bytes:
        """`n` bytes of the body; asyncio.IncompleteReadError when it ends first."""
        parts: list[bytes] = []
        left = n
        chunks = self._chunks
        while left > 0:
            if not chunks:
                if self._eof:
                    raise asyncio.IncompleteReadError(b"".join(parts), n)
                await self._wait()
                continue
            data = chunks.popleft()
            if left < len(data):
                chunks.appendleft(data[left:])
                data = data[:left]
            self._size -= len(data)
            parts.append(data)
            left -= len(data)
        if self._size <= self._high_water_bytes:
            self._connection.resume_reading()
        return parts[0] if len(parts) == 1 else b"".join(parts)

    async def read(self) -> bytes:
        """The whole body."""
        parts: list[bytes] = []
        while data := await self.readany():
            parts.append(data)
        return b"".join(parts)

    async def _wait(self) -> None:
        if self._exception is not None:
            raise self._exception
        waiter = self._waiter = asyncio.get_running_loop().create_future()
        if self._deadline_s is None:
            await waiter
            return
        async with asyncio.timeout_at(self._deadline_s):
            await waiter
