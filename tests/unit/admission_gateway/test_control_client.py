"""The control stream against a real grpc.aio server on port 0 with a test GatewayService."""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator
from dataclasses import dataclass

import grpc
import pytest
import pytest_asyncio

from admission_gateway.control_client import ControlClient
from admission_gateway.control_session import _FiguresSent
from admission_gateway.gateway_state import GatewayState
from slotshift.aiotasks import Supervisor
from slotshift.clock import ManualClock
from slotshift.demand import TenantDemand
from slotshift.v1 import gateway_pb2
from tests.support import free_port, tenant_figures, wait_until
from tests.unit.admission_gateway.conftest import make_config
from tests.unit.admission_gateway.fake_control_plane import FakeControlPlane, Session, serve, update


@dataclass
class Harness:
    fake: FakeControlPlane
    server: grpc.aio.Server
    port: int
    state: GatewayState
    client: ControlClient
    tasks: Supervisor

    async def first_session(self) -> Session:
        await wait_until(lambda: bool(self.fake.sessions and self.fake.sessions[0].received))
        return self.fake.sessions[0]


def make_client(
    state: GatewayState, port: int, clock: ManualClock, *, report_interval_s: float = 0.02
) -> ControlClient:
    return ControlClient(
        state,
        target=f"127.0.0.1:{port}",
        gateway_id="gw-1",
        report_interval_s=report_interval_s,
        queue_report_min_interval_s=0.01,
        reconnect_initial_s=0.02,
        reconnect_max_s=0.1,
        clock=clock,
    )


@pytest_asyncio.fixture
async def harness() -> AsyncIterator[Harness]:
    fake = FakeControlPlane()
    server, port = await serve(fake)
    clock = ManualClock()
    state = GatewayState(make_config("http://unused").pool("p"), make_config("x").gateway, clock)
    client = make_client(state, port, clock)
    tasks = Supervisor("test")
    tasks.spawn("control-client", client.run())
    instance = Harness(fake, server, port, state, client, tasks)
    yield instance
    await tasks.stop()
    # A test may have replaced the server (a control-plane restart): stop the current one.
    await instance.server.stop(None)


def limits(message: gateway_pb2.GatewayHello | gateway_pb2.AllocationAck) -> dict[str, int]:
    return {t.tenant: t.limit_slots for t in tenant_figures(message)}


async def test_the_first_message_is_a_hello_with_the_fallback_limits(harness: Harness) -> None:
    session = await harness.first_session()
    assert session.received[0].WhichOneof("kind") == "hello"
    hello = session.received[0].hello
    assert (hello.pool, hello.gateway_id, hello.applied_version) == ("p", "gw-1", 0)
    assert limits(hello) == {"A": 4, "B": 4}
    # Every message with figures says when they were taken, so that old ones can be told apart.
    assert hello.observed_at.seconds == int(ManualClock().wall())
    assert len(session.of_kind("hello")) == 1
    await wait_until(lambda: harness.client.connected)


async def test_demand_reports_flow_with_usage_and_latencies(harness: Harness) -> None:
    session = await harness.first_session()
    slot = await harness.state.tenants["A"].admission.acquire()
    seen = len(session.of_kind("demand"))
    # Two more reports: the later one was certainly built after the slot was taken.
    await wait_until(lambda: len(session.of_kind("demand")) >= seen + 2)
    report = session.of_kind("demand")[-1].demand
    assert (report.pool, report.gateway_id, report.applied_version) == ("p", "gw-1", 0)
    assert report.observed_at.seconds == int(ManualClock().wall())
    # Reports name only what changed: A's figures as the control plane holds them.
    tenant_a = session.held()["A"]
    assert (tenant_a.in_flight, tenant_a.admitted_total, tenant_a.limit_slots) == (1, 1, 4)
    assert (tenant_a.queue_wait.count, tenant_a.e2e.count) == (1, 0)
    slot.release()


async def test_figures_go_as_columns_once_the_control_plane_says_it_reads_them(
    harness: Harness,
) -> None:
    session = await harness.first_session()
    await wait_until(lambda: bool(session.of_kind("demand")), message="a report")
    assert not any(m.demand.HasField("columns") for m in session.of_kind("demand")), (
        "a control plane that has not said it reads columns gets one message a tenant"
    )
    await session.context.write(
        gateway_pb2.ControlMessage(
            tenants=gateway_pb2.TenantDirectory(pool="p", reads_demand_columns=True)
        )
    )
    await session.push(3, A=(4, 4), B=(4, 4))
    await wait_until(lambda: bool(session.of_kind("ack")), message="the ack")
    ack = session.of_kind("ack")[0].ack
    assert ack.HasField("columns") and not ack.tenants
    slot = await harness.state.tenants["A"].admission.acquire()
    await wait_until(lambda: session.held()["A"].in_flight == 1, message="A's report")
    assert all(not m.demand.tenants for m in session.of_kind("demand")[-1:])
    slot.release()


async def test_a_queue_that_starts_is_reported_at_once() -> None:
    fake = FakeControlPlane()
    server, port = await serve(fake)
    clock = ManualClock()
    state = GatewayState(make_config("http://unused").pool("p"), make_config("x").gateway, clock)
    # A periodic report would come only after an hour: any report that comes is the queue's.
    client = make_client(state, port, clock, report_interval_s=3600.0)
    tasks = Supervisor("test")
    tasks.spawn("control-client", client.run())
    admission_a = state.tenants["A"].admission
    running = [await admission_a.acquire() for _ in range(admission_a.limit_slots)]
    waiter = asyncio.create_task(admission_a.acquire())
    try:
        await wait_until(lambda: bool(fake.sessions and fake.sessions[0].of_kind("demand")))
        [report] = fake.sessions[0].of_kind("demand")
        tenant_a = next(t for t in tenant_figures(report.demand) if t.tenant == "A")
        assert (tenant_a.in_flight, tenant_a.queued) == (admission_a.limit_slots, 1)
        assert not state.queue_started.is_set()
    finally:
        waiter.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await waiter
        for slot in running:
            slot.release()
        await tasks.stop()
        await server.stop(None)


async def test_an_update_is_applied_then_acked(harness: Harness) -> None:
    admission_a = harness.state.tenants["A"].admission
    running = [await admission_a.acquire() for _ in range(3)]
    session = await harness.first_session()
    await session.push(5, A=(6, 2))
    await wait_until(lambda: bool(session.of_kind("ack")))
    ack = session.of_kind("ack")[0].ack
    assert (ack.pool, ack.gateway_id, ack.version) == ("p", "gw-1", 5)
    assert ack.observed_at.seconds == int(ManualClock().wall())
    # The ack carries the new limits (applied before acking) and the usage at that moment: the
    # three running requests were not cancelled by the shrink.
    assert limits(ack) == {"A": 2, "B": 0}
    assert next(t.in_flight for t in tenant_figures(ack) if t.tenant == "A") == 3
    assert harness.state.applied_version == 5
    assert (admission_a.limit_slots, harness.state.tenants["A"].target_slots) == (2, 6)
    assert harness.state.tenants["B"].admission.limit_slots == 0
    await wait_until(lambda: any(m.demand.applied_version == 5 for m in session.of_kind("demand")))
    for slot in running:
        slot.release()


async def test_stale_and_misaddressed_updates_are_ignored(harness: Harness) -> None:
    session = await harness.first_session()
    await session.push(5, A=(3, 3), B=(5, 5))
    await session.push(3, A=(1, 1), B=(1, 1))
    await session.push(5, A=(2, 2), B=(2, 2))
    await session.push(9, gateway_id="someone-else", A=(1, 1))
    await session.push(6, A=(4, 4), B=(4, 4))
    await wait_until(lambda: len(session.of_kind("ack")) == 2)
    assert [m.ack.version for m in session.of_kind("ack")] == [5, 6]
    assert harness.state.applied_version == 6
    assert harness.state.tenants["A"].admission.limit_slots == 4


async def test_after_a_restart_it_reconnects_with_a_new_hello_and_keeps_its_limits(
    harness: Harness,
) -> None:
    session = await harness.first_session()
    await session.push(5, A=(7, 7))
    await wait_until(lambda: bool(session.of_kind("ack")))
    await harness.server.stop(None)
    await wait_until(lambda: not harness.client.connected, message="connection lost")
    # Fail-static: the last applied limits stay in force while the control plane is away.
    assert harness.state.tenants["A"].admission.limit_slots == 7
    assert harness.state.tenants["B"].admission.limit_slots == 0

    restarted = FakeControlPlane()
    harness.server, _ = await serve(restarted, harness.port)
    await wait_until(lambda: bool(restarted.sessions and restarted.sessions[0].received))
    hello = restarted.sessions[0].received[0]
    assert hello.WhichOneof("kind") == "hello"
    assert hello.hello.applied_version == 5
    assert limits(hello.hello) == {"A": 7, "B": 0}
    await wait_until(lambda: harness.client.connected)
    assert harness.client.sessions_started == 2


async def test_it_connects_once_a_control_plane_comes_up_later(
    caplog: pytest.LogCaptureFixture,
) -> None:
    caplog.set_level(logging.INFO, logger="admission_gateway.control_client")
    port = free_port()
    clock = ManualClock()
    state = GatewayState(make_config("http://unused").pool("p"), make_config("x").gateway, clock)
    client = make_client(state, port, clock)
    tasks = Supervisor("test")
    tasks.spawn("control-client", client.run())
    fake = FakeControlPlane()
    server: grpc.aio.Server | None = None
    try:
        await wait_until(lambda: client.attempts >= 3, message="three failed attempts")
        assert (client.sessions_started, client.connected) == (0, False)
        server, _ = await serve(fake, port)
        await wait_until(lambda: bool(fake.sessions and fake.sessions[0].received))
        assert fake.sessions[0].received[0].hello.applied_version == 0
        await wait_until(lambda: client.connected, message="connected")
        # Logged once per change, not once per attempt.
        messages = [
            r.getMessage().split(" at ")[0]
            for r in caplog.records
            if r.name == "admission_gateway.control_client"
        ]
        assert messages == ["cannot reach the control plane", "connected to the control plane"]
    finally:
        await tasks.stop()
        if server is not None:
            await server.stop(None)


async def test_a_stream_ended_by_the_control_plane_right_after_an_update_is_reopened() -> None:
    fake = FakeControlPlane(hang_up_with=update(4, A=(2, 2), B=(6, 6)))
    server, port = await serve(fake)
    clock = ManualClock()
    state = GatewayState(make_config("http://unused").pool("p"), make_config("x").gateway, clock)
    client = make_client(state, port, clock)
    tasks = Supervisor("test")
    task = tasks.spawn("control-client", client.run())
    try:
        await wait_until(lambda: len(fake.sessions) >= 2 and bool(fake.sessions[1].received))
        assert fake.sessions[1].received[0].hello.applied_version == 4
        assert state.tenants["B"].admission.limit_slots == 6
        assert not task.done()
        assert not tasks.failures
    finally:
        await tasks.stop()
        await server.stop(None)


def test_figures_name_only_what_changed_and_everything_once_per_interval() -> None:
    clock = ManualClock()
    sent = _FiguresSent(clock, full_interval_s=5.0)
    a, b = TenantDemand("A", in_flight=1), TenantDemand("B", in_flight=2)
    whole = sent.next([a, b], whole=True)
    assert not whole.delta and [t.tenant for t in whole.tenants] == ["A", "B"]
    assert whole.columns is None, "a control plane that has not said it reads columns"
    sent.columns = True
    changed = sent.next([a, TenantDemand("B", in_flight=3)], whole=False)
    assert changed.delta and not changed.tenants and changed.columns is not None
    assert list(zip(changed.columns.tenant, changed.columns.in_flight, strict=True)) == [("B", 3)]
    nothing = sent.next([a, TenantDemand("B", in_flight=3)], whole=False)
    assert nothing.delta and nothing.columns is not None and not nothing.columns.tenant
    clock.advance(5.0)
    again = sent.next([a, TenantDemand("B", in_flight=3)], whole=False)
    assert not again.delta and again.columns is not None
    assert list(again.columns.tenant) == ["A", "B"], "whole once per interval"
