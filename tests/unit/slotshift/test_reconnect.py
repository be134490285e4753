"""The reconnecting stream client, driven by a scripted session body and an instant sleep."""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health, health_pb2, health_pb2_grpc

from slotshift.clock import ManualClock
from slotshift.reconnect import ReconnectingStream, Sleep, StreamState, Targets
from tests.support import wait_until

PEER = "the peer at 127.0.0.1:1"
LOGGER = "tests.reconnect"


def refused() -> grpc.aio.AioRpcError:
    return grpc.aio.AioRpcError(
        grpc.StatusCode.UNAVAILABLE, grpc.aio.Metadata(), grpc.aio.Metadata(), "refused", None
    )


@dataclass
class Script:
    """A session body that plays one step an attempt, then holds the stream open.

    Steps: "fail" (the attempt fails), "end" (opens, the peer ends it at once), "healthy"
    (opens, stays open 10 s of the clock, then the peer ends it), "hold" (opens and stays open
    until released, then ends).
    """

    clock: ManualClock
    steps: list[str]
    released: asyncio.Event = field(default_factory=asyncio.Event)
    channels: list[grpc.aio.Channel] = field(default_factory=list)

    async def body(self, channel: grpc.aio.Channel, opened: Callable[[], None]) -> str:
        self.channels.append(channel)
        step = self.steps.pop(0) if self.steps else "hold"
        if step == "fail":
            raise refused()
        if step == "boom":
            raise RuntimeError("a bug in the body")
        opened()
        if step == "healthy":
            self.clock.advance(10.0)
        elif step == "hold":
            await self.released.wait()
        return "the peer ended it"


@dataclass
class Sleeps:
    """An instant sleep that records each delay asked for."""

    delays: list[float] = field(default_factory=list)

    async def __call__(self, delay_s: float) -> None:
        self.delays.append(delay_s)


async def never_wakes(_delay_s: float) -> None:
    await asyncio.Event().wait()


@dataclass
class Harness:
    script: Script
    link: ReconnectingStream
    states: list[StreamState]


def make(steps: list[str], *, sleep: Sleep | None = None, max_s: float = 8.0) -> Harness:
    script = Script(ManualClock(), steps)
    states: list[StreamState] = []

    def on_state(state: StreamState) -> str:
        states.append(state)
        return f"note {state.value}"

    link = ReconnectingStream(
        script.body,
        open_channel=lambda: grpc.aio.insecure_channel("127.0.0.1:1"),
        stream="test stream",
        peer=PEER,
        initial_s=1.0,
        max_s=max_s,
        clock=script.clock,
        rng=random.Random(3),
        logger=logging.getLogger(LOGGER),
        on_state=on_state,
        sleep=sleep if sleep is not None else Sleeps(),
    )
    return Harness(script, link, states)


async def cancel(task: asyncio.Task[None]) -> None:
    task.cancel()
    with pytest.raises(asyncio.CancelledError):
        await task


async def test_it_reconnects_after_failures_and_after_the_peer_ends_the_stream() -> None:
    harness = make(["fail", "fail", "end", "fail"])
    link = harness.link
    task = asyncio.create_task(link.run(), name="test-link")
    try:
        await wait_until(lambda: link.connected and link.sessions_started == 2)
        assert link.attempts == 5
    finally:
        await cancel(task)
    assert not link.connected


async def test_delays_double_while_failing_and_reset_only_after_a_healthy_stream() -> None:
    sleeps = Sleeps()
    harness = make(["fail"] * 5 + ["healthy", "end"], sleep=sleeps)
    task = asyncio.create_task(harness.link.run(), name="test-link")
    try:
        await wait_until(lambda: harness.link.sessions_started == 3)
    finally:
        await cancel(task)
    # Five failures: 1, 2, 4, 8, 8 (the cap); the healthy stream resets to 1; the short-lived
    # one after it does not, so the step has doubled to 2.
    steps = [1.0, 2.0, 4.0, 8.0, 8.0, 1.0, 2.0]
    assert len(sleeps.delays) == len(steps)
    for delay, step in zip(sleeps.delays, steps, strict=True):
        assert step / 2 <= delay <= step


async def test_one_log_line_per_change_of_state(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG, logger=LOGGER)
    harness = make(["fail"] * 5 + ["end"] + ["fail"] * 3)
    task = asyncio.create_task(harness.link.run(), name="test-link")
    try:
        await wait_until(lambda: harness.link.sessions_started == 2)
    finally:
        await cancel(task)
    lines = [(r.levelname, r.getMessage()) for r in caplog.records if r.name == LOGGER]
    expected = [
        ("WARNING", f"cannot reach {PEER} (UNAVAILABLE: refused); note unreachable; retrying"),
        ("DEBUG", f"{PEER} still unreachable after 2 attempt(s) (UNAVAILABLE: refused); next in"),
        ("DEBUG", f"{PEER} still unreachable after 4 attempt(s) (UNAVAILABLE: refused); next in"),
        ("INFO", f"connected to {PEER} after 6 attempts: the test stream is open; note connected"),
        ("WARNING", f"the test stream to {PEER} was lost (the peer ended it); note lost; recon"),
        ("DEBUG", f"{PEER} still unreachable after 1 attempt(s) (UNAVAILABLE: refused); next in"),
        ("DEBUG", f"{PEER} still unreachable after 2 attempt(s) (UNAVAILABLE: refused); next in"),
        ("INFO", f"connected to {PEER} after 4 attempts: the test stream is open; note connected"),
        ("INFO", f"closing the test stream to {PEER}"),
    ]
    assert [level for level, _ in lines] == [level for level, _ in expected]
    for (_, message), (_, start) in zip(lines, expected, strict=True):
        assert message.startswith(start)
    assert harness.states == [
        StreamState.UNREACHABLE,
        StreamState.CONNECTED,
        StreamState.LOST,
        StreamState.CONNECTED,
        StreamState.CLOSED,
    ]


@pytest.mark.parametrize(
    ("steps", "sleep"),
    [
        pytest.param(["hold"], None, id="while the stream is open"),
        pytest.param(["fail"], never_wakes, id="while waiting to retry"),
    ],
)
async def test_cancelling_re_raises_and_leaves_no_task_behind(
    steps: list[str], sleep: Sleep | None
) -> None:
    harness = make(steps, sleep=sleep)
    before = asyncio.all_tasks()
    task = asyncio.create_task(harness.link.run(), name="test-link")
    await wait_until(lambda: harness.link.attempts == 1 and bool(harness.script.channels))
    # Let it reach its wait (the open stream, or the pause between attempts).
    for _ in range(5):
        await asyncio.sleep(0)
    await cancel(task)
    left = [t for t in asyncio.all_tasks() - before if not t.done()]
    assert [t.get_name() for t in left if t.get_name().startswith("test stream/")] == []
    assert not harness.link.connected
    assert await harness.link.wait_stopped(0.0)


async def test_stop_while_waiting_to_retry_ends_run_at_once() -> None:
    harness = make(["fail"], sleep=never_wakes)
    task = asyncio.create_task(harness.link.run(), name="test-link")
    await wait_until(lambda: harness.link.attempts == 1)
    harness.link.stop()
    assert await harness.link.wait_stopped(5.0)
    await task
    assert harness.link.attempts == 1


async def test_stop_lets_the_body_end_an_open_stream(caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.INFO, logger=LOGGER)
    harness = make(["hold"])
    task = asyncio.create_task(harness.link.run(), name="test-link")
    await wait_until(lambda: harness.link.connected)
    harness.link.stop()
    assert harness.link.stopping
    # The owner wakes a body that waits on something of its own; it sees `stopping` and ends.
    harness.script.released.set()
    assert await harness.link.wait_stopped(5.0)
    await task
    assert harness.states == [StreamState.CONNECTED, StreamState.CLOSED]
    assert caplog.records[-1].getMessage() == f"closing the test stream to {PEER}"
    assert harness.link.attempts == 1


async def test_a_fault_in_the_body_ends_run_and_closes_the_channel() -> None:
    harness = make(["boom"])
    with pytest.raises(RuntimeError, match="a bug in the body"):
        await harness.link.run()
    [channel] = harness.script.channels
    # A closed channel refuses new calls.
    with pytest.raises(grpc.aio.UsageError, match="closed"):
        await channel.unary_unary("/x", None, None)(b"")


async def test_a_second_run_at_once_is_refused() -> None:
    harness = make(["hold"])
    task = asyncio.create_task(harness.link.run(), name="test-link")
    try:
        await wait_until(lambda: harness.link.connected)
        with pytest.raises(RuntimeError, match="already running"):
            await harness.link.run()
    finally:
        await cancel(task)


def test_a_cap_below_the_first_delay_is_refused() -> None:
    with pytest.raises(ValueError, match="initial_s"):
        make([], max_s=0.5)


SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING


async def _health_server(status: int) -> tuple[grpc.aio.Server, Any, str]:
    server = grpc.aio.server()
    servicer = health.aio.HealthServicer()  # type: ignore[attr-defined]
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    await servicer.set(SERVICE, status)
    return server, servicer, f"127.0.0.1:{port}"


SERVICE = "test.Stream"


async def test_targets_skip_a_replica_that_does_not_serve_and_follow_the_one_that_does() -> None:
    follower, follower_health, follower_at = await _health_server(NOT_SERVING)
    leader, leader_health, leader_at = await _health_server(SERVING)
    try:
        sleeps = Sleeps()
        clock = ManualClock()
        bodies: list[str] = []
        release = asyncio.Event()
        targets = Targets(
            [follower_at, leader_at], grpc.aio.insecure_channel, health_service=SERVICE
        )

        async def body(channel: grpc.aio.Channel, opened: Callable[[], None]) -> str:
            bodies.append(targets.current)
            opened()
            await release.wait()
            release.clear()
            return "the peer ended it"

        link = ReconnectingStream(
            body,
            open_channel=targets,
            stream="test stream",
            peer="the peer",
            initial_s=1.0,
            max_s=8.0,
            clock=clock,
            rng=random.Random(3),
            logger=logging.getLogger(LOGGER),
            sleep=sleeps,
        )
        task = asyncio.create_task(link.run(), name="test-link")
        try:
            await wait_until(lambda: link.connected)
            # The follower said NOT_SERVING; the leader was tried at once, without a delay.
            assert bodies == [leader_at] and sleeps.delays == [0.0]
            # The leader steps down and ends the stream; the other replica now leads.
            await leader_health.set(SERVICE, NOT_SERVING)
            await follower_health.set(SERVICE, SERVING)
            release.set()
            await wait_until(lambda: len(bodies) == 2 and link.connected)
            assert bodies == [leader_at, follower_at]
        finally:
            await cancel(task)
    finally:
        await follower.stop(None)
        await leader.stop(None)


async def test_targets_back_off_once_a_whole_round_failed() -> None:
    first, _, first_at = await _health_server(NOT_SERVING)
    second, _, second_at = await _health_server(NOT_SERVING)
    try:
        sleeps = Sleeps()
        targets = Targets([first_at, second_at], grpc.aio.insecure_channel, health_service=SERVICE)

        async def body(channel: grpc.aio.Channel, opened: Callable[[], None]) -> str:
            raise AssertionError("no replica serves: no stream is opened")

        link = ReconnectingStream(
            body,
            open_channel=targets,
            stream="test stream",
            peer="the peer",
            initial_s=1.0,
            max_s=8.0,
            clock=ManualClock(),
            rng=random.Random(3),
            logger=logging.getLogger(LOGGER),
            sleep=sleeps,
        )
        task = asyncio.create_task(link.run(), name="test-link")
        try:
            await wait_until(lambda: link.attempts >= 6)
        finally:
            await cancel(task)
        # Rounds of two: the second address at once, then the backoff (1, 2, 4: doubling).
        delays = sleeps.delays[:6]
        assert delays[0::2] == [0.0, 0.0, 0.0]
        for delay, step in zip(delays[1::2], [1.0, 2.0, 4.0], strict=True):
            assert step / 2 <= delay <= step
    finally:
        await first.stop(None)
        await second.stop(None)
