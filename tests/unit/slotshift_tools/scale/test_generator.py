"""A simulated gateway speaks the gateway protocol as the real one does, against a stand-in
control plane (a real grpc.aio server on port 0 that records what it reads and sends what the
test puts in its outbox)."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator

import grpc
import pytest

from slotshift.clock import SystemClock
from slotshift.v1 import allocation_pb2, gateway_pb2, gateway_pb2_grpc
from slotshift_tools.scale.budget import check_budget
from slotshift_tools.scale.generator import GeneratorSpec, Recorder, gateway_name, run_generator
from tests.support import tenant_figures, wait_until

POOL = "scale"
TENANTS = ("a", "b")


class StandInControlPlane(gateway_pb2_grpc.GatewayServiceServicer):
    def __init__(self) -> None:
        self.received: list[gateway_pb2.GatewayMessage] = []
        self.outbox: asyncio.Queue[gateway_pb2.ControlMessage] = asyncio.Queue()

    async def Connect(  # type: ignore[override]
        self,
        request_iterator: AsyncIterator[gateway_pb2.GatewayMessage],
        context: grpc.aio.ServicerContext[object, object],
    ) -> None:
        async def read() -> None:
            async for message in request_iterator:
                self.received.append(message)

        reader = asyncio.create_task(read(), name="stand-in/reader")
        try:
            while True:
                await context.write(await self.outbox.get())
        finally:
            reader.cancel()
            await asyncio.gather(reader, return_exceptions=True)

    def of_kind(self, kind: str) -> list[gateway_pb2.GatewayMessage]:
        return [m for m in self.received if m.WhichOneof("kind") == kind]


def update(version: int, limits: dict[str, int]) -> gateway_pb2.ControlMessage:
    return gateway_pb2.ControlMessage(
        allocation=gateway_pb2.AllocationUpdate(
            pool=POOL,
            gateway_id=gateway_name(0),
            version=version,
            decision_id=version * 10,
            budget_slots=10,
            tenants=[
                allocation_pb2.GatewayTenantLimit(tenant=t, target_slots=n, limit_slots=n)
                for t, n in limits.items()
            ],
        )
    )


@pytest.fixture
async def controlplane() -> AsyncIterator[tuple[StandInControlPlane, int]]:
    server = grpc.aio.server()
    stand_in = StandInControlPlane()
    gateway_pb2_grpc.add_GatewayServiceServicer_to_server(stand_in, server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    try:
        yield stand_in, port
    finally:
        await server.stop(grace=None)


async def test_hello_acks_and_reports_follow_the_real_gateways_protocol(
    controlplane: tuple[StandInControlPlane, int],
) -> None:
    stand_in, port = controlplane
    clock = SystemClock()
    spec = GeneratorSpec(
        index=0,
        target=f"127.0.0.1:{port}",
        pool=POOL,
        tenants=TENANTS,
        nominal=(6, 4),
        gateway_indexes=(0,),
        gateways_total=2,
        report_interval_s=0.05,
        dynamics="fluctuating",
        seed=1,
        origin_wall_s=clock.wall(),
        deadline_wall_s=clock.wall() + 60.0,
        out_dir="unused",
    )
    stop = asyncio.Event()
    generator = asyncio.create_task(run_generator(spec, stop.is_set, clock), name="generator")
    try:
        await wait_until(lambda: bool(stand_in.received), message="the hello")
        hello = stand_in.received[0]
        assert hello.WhichOneof("kind") == "hello", "the hello comes first"
        assert hello.hello.pool == POOL
        assert hello.hello.gateway_id == gateway_name(0)
        assert hello.hello.applied_version == 0
        # The static fallback split: nominal share // gateways.
        assert [(t.tenant, t.limit_slots, t.in_flight) for t in tenant_figures(hello.hello)] == [
            ("a", 3, 0),
            ("b", 2, 0),
        ]

        stand_in.outbox.put_nowait(
            gateway_pb2.ControlMessage(tenants=gateway_pb2.TenantDirectory(pool=POOL))
        )
        stand_in.outbox.put_nowait(update(1, {"a": 5, "b": 1}))
        await wait_until(lambda: bool(stand_in.of_kind("ack")), message="the first ack")
        first_ack = stand_in.of_kind("ack")[0].ack
        assert first_ack.version == 1
        assert first_ack.gateway_id == gateway_name(0)
        assert [(t.tenant, t.limit_slots) for t in tenant_figures(first_ack)] == [
            ("a", 5),
            ("b", 1),
        ]

        stand_in.outbox.put_nowait(update(1, {"a": 0, "b": 0}))  # not newer: ignored
        stand_in.outbox.put_nowait(update(2, {"a": 2, "b": 6}))
        await wait_until(
            lambda: any(m.demand.applied_version == 2 for m in stand_in.of_kind("demand")),
            message="a report under version 2",
        )
    finally:
        stop.set()
        recorder: Recorder = await generator

    assert [a.ack.version for a in stand_in.of_kind("ack")] == [1, 2]
    reports = stand_in.of_kind("demand")
    assert reports, "reports every interval"
    last = reports[-1].demand
    assert last.observed_at.seconds > 0
    assert all(r.demand.delta for r in reports), "within 5 s of the hello, every report is a delta"
    # The figures as the control plane holds them: the hello's, then each message's changes.
    held = {t.tenant: t for t in tenant_figures(hello.hello)}
    for message in stand_in.received[1:]:
        carrier = message.demand if message.HasField("demand") else message.ack
        held.update({t.tenant: t for t in tenant_figures(carrier)})
    assert list(held) == list(TENANTS)
    for tenant in held.values():
        assert tenant.queued <= 8
        assert tenant.admitted_total >= tenant.completed_total + tenant.in_flight - 3

    assert recorder.errors == []
    assert recorder.stale_updates == 1
    assert [(u[2], u[3]) for u in recorder.updates] == [(1, 10), (2, 20)]
    assert [a[1] for a in recorder.acks] == [1, 2]
    assert len(recorder.directories) == 1
    assert len(recorder.reports) >= len(reports) - 1
    assert recorder.loop_lags, "the loop was probed"
    times, cells, values = recorder.held.arrays()
    assert cells[:2].tolist() == [0, 1], "held slots are logged from the start"
    assert values[:2].tolist() == [3, 2]
    # The stand-in grants without a care for the budget; the check only has to read the log.
    assert check_budget(times, cells, values, budget_slots=10).events == len(times)
