"""One client that keeps a long-lived gRPC stream up: the gateway's and the agent's to the control
plane.

A service supplies only its session body (what to send and receive on an open stream) and its
settings; this client does the rest the same way for both:
- each attempt opens a fresh channel, runs the body on it, and closes the channel when the body
  ends (why fresh: see below);
- between attempts it waits an exponential, capped, jittered delay (slotshift.backoff); a stream
  that stayed open at least `healthy_after_s` resets the delay to the first step, so a peer that
  accepts streams and drops them at once is not hammered at the first step;
- it logs once per change of state, on the service's own logger: connected (with the attempts
  it took), lost, unreachable from the start; while the peer stays away, a DEBUG line "still
  unreachable" with the count of failed attempts when that count reaches 1, 2, 4, 8, ... (the
  first failure from the start is the "unreachable" warning), never one per attempt;
- time (the clock that measures how long a stream stayed open, the sleep between attempts) and
  the jitter's random source are injected;
- a peer that runs as several replicas of which one serves the stream at a time (the control
  plane's leader, controlplane/leadership.py) is given as `Targets`: each attempt goes to one
  address, first asking it through gRPC health whether it serves the stream's service; one that
  says NOT_SERVING, cannot be reached, or ends the stream sends the next attempt to the next
  address, at once while some address of the round is still untried, after the backoff delay
  once every address was tried.

Why a fresh channel per attempt: a grpc.aio channel that has lost its server reconnects on its
own, with a backoff of its own (growing to two minutes by default) that ours does not reset. On
one long-lived channel that backoff would stack on top of ours and keep a restarted peer
unreachable long after our delay has run out, unless both were tuned to match. A new channel per
attempt leaves ours the only backoff in play, and each attempt meets the peer afresh (a new
address behind the name, new certificates). The cost, one handshake per attempt, is nothing at
reconnection rates.
"""

from __future__ import annotations

import asyncio
import enum
import logging
import random
from collections.abc import Awaitable, Callable, Coroutine, Sequence
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from slotshift.backoff import Backoff
from slotshift.clock import Clock

STREAM_GONE: tuple[type[Exception], ...] = (grpc.aio.AioRpcError, asyncio.InvalidStateError)
"""How a dead stream shows itself to a session body: an RPC error, or (writing to a call the
server has already finished) InvalidStateError. The client takes either as the end of the
stream; anything else a body raises is a fault of its own and ends run()."""


class StreamState(enum.Enum):
    """The changes of state a service hears of (each once, as it happens)."""

    CONNECTED = "connected"
    """The body reported the stream open."""
    UNREACHABLE = "unreachable"
    """The first attempt failed: no stream has been open yet."""
    LOST = "lost"
    """An open stream ended (it broke, or the peer ended it); reconnecting."""
    CLOSED = "closed"
    """This side ended an open stream: stop() or cancellation."""


SessionBody = Callable[[grpc.aio.Channel, Callable[[], None]], Awaitable[str]]
"""`body(channel, opened)`: one stream on `channel`, from its opening to its end.

The body starts its call, calls `opened()` once the stream is established (whatever that means
for its protocol: the first write accepted, the connection made), then does its work until the
stream ends. It returns how the stream ended, for the log ("the control plane ended the
stream"), when the peer ends it or when it ends it on `ReconnectingStream.stopping`; it lets
STREAM_GONE errors propagate when the stream breaks. It cleans its call up in `finally`, and
lets CancelledError through. The channel is the client's: the body never closes it."""

StateObserver = Callable[[StreamState], str]
"""Called on each change of state, before it is logged; returns a note for the log line (what the
service does about it, e.g. "enforcing allocation 5 until it is back"), "" for none. It must not
block or await."""

Sleep = Callable[[float], Coroutine[Any, Any, None]]
"""Waits the given seconds (asyncio.sleep in production; tests pass one that returns at once)."""


HEALTH_CHECK_TIMEOUT_S = 2.0
"""Longest a replica may take to say whether it serves (Targets): a slow one counts as not."""


class Targets:
    """The addresses of a peer that runs as several replicas, one of which serves the stream at
    a time: tried in turn, each asked first (gRPC health, `health_service`) whether it serves.

    open_channel: a new channel to the address it is given (the stream closes it). With one
    address nothing is asked: the address is the peer.
    """

    def __init__(
        self,
        addresses: Sequence[str],
        open_channel: Callable[[str], grpc.aio.Channel],
        *,
        health_service: str,
        check_timeout_s: float = HEALTH_CHECK_TIMEOUT_S,
    ) -> None:
        if not addresses:
            raise ValueError("Targets: at least one address")
        self.addresses = tuple(addresses)
        self._open_channel = open_channel
        self._health_service = health_service
        self._check_timeout_s = check_timeout_s
        self._index = 0
        self._round_began = 0

    @property
    def current(self) -> str:
        """The address the next attempt goes to."""
        return self.addresses[self._index]

    def open_channel(self) -> grpc.aio.Channel:
        """A new channel to the current address."""
        return self._open_channel(self.current)

    async def refusal(self, channel: grpc.aio.Channel) -> str | None:
        """Why the current address will not serve the stream (NOT_SERVING, unreachable, too
        slow to say), None when it does, or when it has no health service to ask (UNIMPLEMENTED:
        it is no replica set) or is the only address."""
        if len(self.addresses) == 1:
            return None
        stub = health_pb2_grpc.HealthStub(channel)
        request = health_pb2.HealthCheckRequest(service=self._health_service)
        try:
            response = await stub.Check(request, timeout=self._check_timeout_s)
        except grpc.aio.AioRpcError as exc:
            if exc.code() == grpc.StatusCode.UNIMPLEMENTED:
                return None
            return f"health check: {exc.code().name}"
        if response.status == health_pb2.HealthCheckResponse.SERVING:
            return None
        return (
            f"{health_pb2.HealthCheckResponse.ServingStatus.Name(response.status)} for the stream"
        )

    def served(self) -> None:
        """The current address serves: a new round of attempts begins from it."""
        self._round_began = self._index

    def advance(self) -> bool:
        """Move to the next address; whether every address of this round has now been tried."""
        self._index = (self._index + 1) % len(self.addresses)
        return self._index == self._round_began


class ReconnectingStream:
    """Keeps one stream to a peer open: opens it, and opens it again whenever it ends.

    run() as a supervised task; stop() (or cancelling run()) to end it. One run() at a time.
    """

    def __init__(
        self,
        body: SessionBody,
        *,
        open_channel: Callable[[], grpc.aio.Channel] | Targets,
        stream: str,
        peer: str,
        initial_s: float,
        max_s: float,
        clock: Clock,
        rng: random.Random,
        logger: logging.Logger,
        on_state: StateObserver | None = None,
        healthy_after_s: float | None = None,
        sleep: Sleep = asyncio.sleep,
    ) -> None:
        """body: the service's session (see SessionBody).
        open_channel: a new channel to the peer each call; the client closes it. Or the
        `Targets` of a peer with several replicas (the module docstring says how they are tried).
        stream, peer: for the log lines, e.g. "telemetry stream", "the control plane at HOST:PORT"
        (with Targets: "the control plane", the address is added).
        initial_s, max_s: the first delay between attempts and the cap on it (seconds); ValueError
        unless 0 < initial_s <= max_s.
        healthy_after_s: seconds a stream must stay open to reset the delay; max_s by default (a
        stream that outlived the longest wait was no flapping).
        logger: the service's logger; every line goes there.
        """
        self._body = body
        self._targets = open_channel if isinstance(open_channel, Targets) else None
        self._open_channel = (
            open_channel.open_channel if isinstance(open_channel, Targets) else open_channel
        )
        self._stream = stream
        self._peer_name = peer
        self._max_s = max_s
        self._backoff = Backoff(initial_s, max_s, rng)
        self._healthy_after_s = max_s if healthy_after_s is None else healthy_after_s
        self._clock = clock
        self._logger = logger
        self._on_state = on_state
        self._sleep = sleep
        self.attempts = 0
        """Attempts to open the stream so far, successful or not."""
        self.sessions_started = 0
        """Streams opened so far (the body called opened())."""
        self._connected = False
        self._opened_at: float | None = None
        # Failed attempts since the stream was last open (or since the start).
        self._failures = 0
        self._stopping = asyncio.Event()
        self._running = False
        self._ended = asyncio.Event()

    @property
    def _peer(self) -> str:
        if self._targets is None:
            return self._peer_name
        return f"{self._peer_name} at {self._targets.current}"

    @property
    def connected(self) -> bool:
        """Whether a stream is open now."""
        return self._connected

    @property
    def stopping(self) -> bool:
        """Whether stop() was called: a body ends its stream cleanly when it sees this."""
        return self._stopping.is_set()

    async def run(self) -> None:
        """Open the stream, and open it again whenever it ends, until stop() or cancellation.

        Returns after stop(); re-raises CancelledError; raises whatever a body raises other than
        STREAM_GONE (a fault, not the network's). RuntimeError if another run() is going.
        """
        if self._running:
            raise RuntimeError(f"the {self._stream} to {self._peer} is already running")
        self._running = True
        self._ended.clear()
        try:
            while not self._stopping.is_set():
                delay_s = await self._attempt()
                if delay_s is None:
                    break
                await self._pause(delay_s)
        finally:
            self._running = False
            self._ended.set()

    def stop(self) -> None:
        """Ask run() to end: at once if it is waiting between attempts, else as soon as the body
        ends its stream (the body watches `stopping`; the owner wakes it if it is blocked)."""
        self._stopping.set()

    async def wait_stopped(self, timeout_s: float) -> bool:
        """After stop(): wait, at most timeout_s, for run() to end; whether it has (True at once
        if no run() is going). The owner cancels run() if it has not."""
        if not self._running:
            return True
        try:
            await asyncio.wait_for(self._ended.wait(), timeout=timeout_s)
        except TimeoutError:
            return False
        return True

    async def _attempt(self) -> float | None:
        """One stream on a fresh channel; the delay before the next attempt, None when
        stopping."""
        self.attempts += 1
        self._opened_at = None
        channel = self._open_channel()
        try:
            refusal = None if self._targets is None else await self._targets.refusal(channel)
            if refusal is not None:
                ending = refusal
            else:
                try:
                    ending = await self._body(channel, self._opened)
                except STREAM_GONE as exc:
                    ending = _describe(exc)
            if self._stopping.is_set():
                return None
            if self._targets is None:
                return self._ended_with(ending)
            # The next attempt goes to the next replica: at once while the round has some left
            # untried, after the backoff once all were (or after a stream that was open).
            was_open = self._opened_at is not None
            delay_s = self._ended_with(ending, pause=was_open)
            if self._targets.advance() and not was_open:
                delay_s = self._backoff.next_delay_s()
            return delay_s
        finally:
            # Stopped, cancelled, or the body failed: the stream was ours to end.
            if self._connected:
                self._change(StreamState.CLOSED)
                self._logger.info("closing the %s to %s", self._stream, self._peer)
            await channel.close(None)

    def _opened(self) -> None:
        if self._opened_at is not None:
            return
        self._opened_at = self._clock.monotonic()
        self.sessions_started += 1
        if self._targets is not None:
            self._targets.served()
        tries = self._failures + 1
        self._failures = 0
        note = self._change(StreamState.CONNECTED)
        self._logger.info(
            "connected to %s%s: the %s is open%s",
            self._peer,
            f" after {tries} attempts" if tries > 1 else "",
            self._stream,
            note,
        )

    def _ended_with(self, ending: str, *, pause: bool = True) -> float:
        """Log the end of an attempt as a change of state (or not), and draw the next delay
        (0 without `pause`: a failed attempt that another replica follows at once)."""
        if self._opened_at is not None:
            if self._clock.monotonic() - self._opened_at >= self._healthy_after_s:
                self._backoff.reset()
            note = self._change(StreamState.LOST)
            self._logger.warning(
                "the %s to %s was lost (%s)%s; reconnecting", self._stream, self._peer, ending, note
            )
            return self._backoff.next_delay_s()
        self._failures += 1
        delay_s = self._backoff.next_delay_s() if pause else 0.0
        if self._failures == 1 and self.sessions_started == 0:
            note = self._change(StreamState.UNREACHABLE)
            self._logger.warning(
                "cannot reach %s (%s)%s; retrying with backoff up to %.1f s",
                self._peer,
                ending,
                note,
                self._max_s,
            )
        elif self._failures & (self._failures - 1) == 0:
            # Powers of two: a line now and then with the count, not one per attempt.
            self._logger.debug(
                "%s still unreachable after %d attempt(s) (%s); next in %.2f s",
                self._peer,
                self._failures,
                ending,
                delay_s,
            )
        return delay_s

    def _change(self, state: StreamState) -> str:
        """Enter `state`; the service's note for the log line, as "; note" (or "")."""
        self._connected = state is StreamState.CONNECTED
        note = "" if self._on_state is None else self._on_state(state)
        return f"; {note}" if note else ""

    async def _pause(self, delay_s: float) -> None:
        """Wait delay_s on the injected sleep, or until stop(), whichever comes first."""
        sleeping = asyncio.create_task(self._sleep(delay_s), name=f"{self._stream}/backoff")
        stopping = asyncio.create_task(self._stopping.wait(), name=f"{self._stream}/stop")
        try:
            await asyncio.wait((sleeping, stopping), return_when=asyncio.FIRST_COMPLETED)
        finally:
            # Also on cancellation: neither helper outlives the pause.
            sleeping.cancel()
            stopping.cancel()
            await asyncio.wait((sleeping, stopping))
        if not sleeping.cancelled() and (exc := sleeping.exception()) is not None:
            raise exc


def _describe(exc: Exception) -> str:
    if isinstance(exc, grpc.aio.AioRpcError):
        return f"{exc.code().name}: {exc.details()}"
    return "the stream had already ended"
