"""The gateway stream (GatewayService.Connect) in memory: real protobuf messages, one transit
delay, on the virtual loop.

Each direction is a `Pipe`: a message written is serialised as gRPC would serialise it, and
parsed again at the far end `transit_s` later, in the order written (as one HTTP/2 stream
delivers). The gateway's end of a `GatewayStream` is what its ControlSession runs on
(admission_gateway/control_session.py's ControlStream); the control plane's end is the pair the
gateway stream service serves (`GatewayStreamService.serve`: the messages it reads, the sink it
writes to). Nothing here ends a stream: in the twin every gateway stays connected for the run.
"""

from __future__ import annotations

import asyncio
from collections import deque
from collections.abc import AsyncIterator, Callable
from typing import Generic, TypeVar

from google.protobuf.message import Message

from slotshift.v1 import gateway_pb2

M = TypeVar("M", bound=Message)


class Pipe(Generic[M]):
    """One direction of an in-memory stream of `M` messages (see the module docstring)."""

    def __init__(self, parse: Callable[[bytes], M], transit_s: float) -> None:
        """parse: the message type's FromString; transit_s: the one-way delay, seconds."""
        self._parse = parse
        self._transit_s = transit_s
        self._in_transit: deque[bytes] = deque()
        self._arrived: asyncio.Queue[M] = asyncio.Queue()

    async def write(self, message: M) -> None:
        """Send `message`; it arrives `transit_s` later. Never blocks."""
        self._in_transit.append(message.SerializeToString())
        # Timers of one delay fire in the order they were set, but with equal deadlines the
        # loop's heap does not promise that order: each timer lands the oldest message instead.
        asyncio.get_running_loop().call_later(self._transit_s, self._land)

    def _land(self) -> None:
        self._arrived.put_nowait(self._parse(self._in_transit.popleft()))

    def __aiter__(self) -> AsyncIterator[M]:
        return self

    async def __anext__(self) -> M:
        return await self._arrived.get()


class _GatewayEnd:
    """The gateway's end: writes go up to the control plane, reads come down from it."""

    def __init__(
        self, up: Pipe[gateway_pb2.GatewayMessage], down: Pipe[gateway_pb2.ControlMessage]
    ) -> None:
        self._up = up
        self._down = down

    async def write(self, message: gateway_pb2.GatewayMessage) -> None:
        await self._up.write(message)

    def __aiter__(self) -> AsyncIterator[gateway_pb2.ControlMessage]:
        return self._down


class GatewayStream:
    """One gateway's Connect stream: `up` carries its messages to the control plane, `down` the
    control plane's to it; `gateway_end` is the gateway's side of both."""

    def __init__(self, transit_s: float) -> None:
        self.up: Pipe[gateway_pb2.GatewayMessage] = Pipe(
            gateway_pb2.GatewayMessage.FromString, transit_s
        )
        self.down: Pipe[gateway_pb2.ControlMessage] = Pipe(
            gateway_pb2.ControlMessage.FromString, transit_s
        )
        self.gateway_end = _GatewayEnd(self.up, self.down)
