"""The floor under any Python proxy: a bare TCP relay on uvloop, measured beside the gateway.

    python -m slotshift_tools.gateway_bench.tcp_relay --port 9000 --upstream-port 8000

Every accepted connection gets a connection of its own to the upstream, and each side's bytes
are written to the other as they are read: no HTTP, no tenant, no limit, no buffering of its own
(a side whose peer's transport is over its high-water mark stops reading until it drains). What
the gateway does per relayed event beyond this process's cost is its own work; what this
process costs is the event loop's and the kernel's, which no Python gateway avoids: one read
and one write system call per event, and the loop's wake-up between them.
"""

from __future__ import annotations

import argparse
import asyncio
from typing import cast

from slotshift_tools.gateway_bench.upstream import run_relay, serve_until_signalled


class _Side(asyncio.Protocol):
    """One connection of a pair; the other is `peer`'s."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.peer: _Side | None = None
        self._early: list[bytes] = []
        """What this side read before its peer connected."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        # uvloop's transports are not asyncio.Transport subclasses, but have its methods.
        self.transport = cast(asyncio.Transport, transport)

    def pair(self, peer: _Side) -> None:
        self.peer = peer
        if peer.transport is not None:
            for data in self._early:
                peer.transport.write(data)
        self._early.clear()

    def data_received(self, data: bytes) -> None:
        peer = self.peer
        if peer is None or peer.transport is None:
            self._early.append(data)
        else:
            peer.transport.write(data)

    def eof_received(self) -> bool:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.write_eof()
        return True

    def connection_lost(self, exc: Exception | None) -> None:
        self.transport = None
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.close()

    # Back-pressure: this side's transport is full, so its peer stops reading.
    def pause_writing(self) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.pause_reading()

    def resume_writing(self) -> None:
        if self.peer is not None and self.peer.transport is not None:
            self.peer.transport.resume_reading()


class _Accepted(_Side):
    """A client's connection: it opens its upstream connection when it is made."""

    def __init__(self, upstream_host: str, upstream_port: int) -> None:
        super().__init__()
        self._upstream = (upstream_host, upstream_port)
        self._opening: asyncio.Task[None] | None = None
        """The task opening the upstream connection, held so that it is not collected."""

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        super().connection_made(transport)
        self._opening = asyncio.get_running_loop().create_task(self._open(), name="tcp-relay-open")

    async def _open(self) -> None:
        loop = asyncio.get_running_loop()
        try:
            _, upstream = await loop.create_connection(_Side, *self._upstream)
        except OSError:
            if self.transport is not None:
                self.transport.close()
            return
        if self.transport is None:  # the client left while the upstream connection opened
            if upstream.transport is not None:
                upstream.transport.close()
            return
        upstream.pair(self)
        self.pair(upstream)


async def _main(args: argparse.Namespace) -> None:
    await serve_until_signalled(
        lambda: _Accepted(args.upstream_host, args.upstream_port), args.host, args.port
    )


def main(argv: list[str] | None = None) -> int:
    """Relay until SIGINT or SIGTERM; exit status 0."""
    return run_relay("slotshift_tools.gateway_bench.tcp_relay", _main, argv)


if __name__ == "__main__":
    raise SystemExit(main())
