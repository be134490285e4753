"""Integration, a real control plane on port 0: queries, errors naming the field, health,
reflection in both versions, telemetry taken into decisions."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from pathlib import Path

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2

from controlplane.server import ControlPlane
from slotshift.config import parse_config
from slotshift.v1 import query_pb2, query_pb2_grpc, telemetry_pb2, telemetry_pb2_grpc
from tests.stream_tokens import StreamTokens
from tests.support import wait_until


@pytest.fixture
def tokens(tmp_path: Path) -> StreamTokens:
    return StreamTokens.write(tmp_path / "stream-tokens")


@pytest.fixture
async def control_plane(tokens: StreamTokens) -> AsyncIterator[ControlPlane]:
    config = parse_config(
        {
            "pools": [
                {
                    "name": "default",
                    "budget_slots": 10,
                    "decision_period_s": 0.05,
                    "tenants": [{"name": "A", "floor_slots": 1}, {"name": "B", "floor_slots": 1}],
                },
                {
                    "name": "second",
                    "budget_slots": 4,
                    "policy": "static",
                    "tenants": [{"name": "C"}],
                },
            ],
            "controlplane": {"grpc_port": 0, "metrics_port": 0},
        }
    )
    server = ControlPlane(tokens.apply(config))
    await server.start()
    try:
        yield server
    finally:
        await server.stop()


@pytest.fixture
async def channel(control_plane: ControlPlane) -> AsyncIterator[grpc.aio.Channel]:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{control_plane.grpc_port}") as channel:
        yield channel


async def test_queries_answer_for_every_pool(channel: grpc.aio.Channel) -> None:
    stub = query_pb2_grpc.AllocationServiceStub(channel)
    pools = await stub.ListPools(query_pb2.ListPoolsRequest())
    assert [(p.name, p.budget_slots, p.policy) for p in pools.pools] == [
        ("default", 10, "demand"),
        ("second", 4, "static"),
    ]
    allocation = await stub.GetAllocation(query_pb2.GetAllocationRequest(pool="default"))
    assert sum(t.limit_slots for t in allocation.tenants) == 10
    tenants = await stub.ListTenants(query_pb2.ListTenantsRequest())
    assert [(t.pool, t.allocation.tenant) for t in tenants.tenants] == [
        ("default", "A"),
        ("default", "B"),
        ("second", "C"),
    ]
    decisions = await stub.GetDecisions(query_pb2.GetDecisionsRequest(pool="default", limit=3))
    assert 1 <= len(decisions.decisions) <= 3
    newest = decisions.decisions[0]
    assert newest.policy == "demand"
    assert newest.reason
    assert [o.tenant for o in newest.outputs] == ["A", "B"]
    assert sum(o.limit_slots for o in newest.outputs) == 10
    assert [d.id for d in decisions.decisions] == sorted(
        (d.id for d in decisions.decisions), reverse=True
    )
    changes = await stub.GetDecisions(
        query_pb2.GetDecisionsRequest(pool="default", limit=3, changes_only=True)
    )
    assert [d.id for d in changes.decisions] == [d.id for d in decisions.decisions]
    oldest = changes.decisions[-1]
    if oldest.id == 1:
        assert [o.tenant for o in oldest.outputs] == ["A", "B"], "the first names every tenant"
    for decision in changes.decisions:
        assert {i.tenant for i in decision.inputs} <= {"A", "B"}
    times = await stub.GetDecisions(
        query_pb2.GetDecisionsRequest(pool="default", limit=3, without_tenants=True)
    )
    assert [(d.id, d.decided_at, d.duration_ms, d.version, d.reason) for d in times.decisions] == [
        (d.id, d.decided_at, d.duration_ms, d.version, d.reason) for d in decisions.decisions
    ]
    assert not any(d.inputs or d.outputs for d in times.decisions)


@pytest.mark.parametrize(
    ("call", "request_message", "code", "field"),
    [
        pytest.param(
            "GetAllocation",
            query_pb2.GetAllocationRequest(),
            grpc.StatusCode.INVALID_ARGUMENT,
            "pool",
            id="missing-pool",
        ),
        pytest.param(
            "GetAllocation",
            query_pb2.GetAllocationRequest(pool="nope"),
            grpc.StatusCode.NOT_FOUND,
            "pool",
            id="unknown-pool",
        ),
        pytest.param(
            "ListTenants",
            query_pb2.ListTenantsRequest(pool="nope"),
            grpc.StatusCode.NOT_FOUND,
            "pool",
            id="unknown-pool-tenants",
        ),
        pytest.param(
            "GetDecisions",
            query_pb2.GetDecisionsRequest(pool="default", limit=-1),
            grpc.StatusCode.INVALID_ARGUMENT,
            "limit",
            id="negative-limit",
        ),
    ],
)
async def test_invalid_arguments_name_the_field(
    channel: grpc.aio.Channel, call: str, request_message: object, code: grpc.StatusCode, field: str
) -> None:
    stub = query_pb2_grpc.AllocationServiceStub(channel)
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await getattr(stub, call)(request_message)
    assert raised.value.code() == code
    assert (raised.value.details() or "").startswith(f"{field}:")


async def test_health_is_serving_then_not_serving_on_stop(control_plane: ControlPlane) -> None:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{control_plane.grpc_port}") as channel:
        stub = health_pb2_grpc.HealthStub(channel)
        for service in ("", "slotshift.v1.AllocationService", "slotshift.v1.GatewayService"):
            reply = await stub.Check(health_pb2.HealthCheckRequest(service=service))
            assert reply.status == health_pb2.HealthCheckResponse.SERVING
        watch = stub.Watch(health_pb2.HealthCheckRequest(service=""))
        first = await watch.read()
        assert first.status == health_pb2.HealthCheckResponse.SERVING
        # A watcher sees NOT_SERVING first and hangs up, as a load balancer would; the server waits
        # for open streams up to its grace period, so stopping runs beside the watcher.
        stopping = asyncio.create_task(control_plane.stop(), name="stop-control-plane")
        second = await watch.read()
        assert second.status == health_pb2.HealthCheckResponse.NOT_SERVING
        watch.cancel()
        await stopping


@pytest.mark.parametrize(
    "service", ["grpc.reflection.v1alpha.ServerReflection", "grpc.reflection.v1.ServerReflection"]
)
async def test_reflection_lists_services_in_both_versions(
    channel: grpc.aio.Channel, service: str
) -> None:
    call = channel.stream_stream(
        f"/{service}/ServerReflectionInfo",
        request_serializer=reflection_pb2.ServerReflectionRequest.SerializeToString,
        response_deserializer=reflection_pb2.ServerReflectionResponse.FromString,
    )
    # grpc.aio allows a stream call without an iterator (then write() feeds it); the stubs do not.
    stream = call()  # type: ignore[call-arg]
    await stream.write(reflection_pb2.ServerReflectionRequest(list_services=""))
    reply: reflection_pb2.ServerReflectionResponse = await stream.read()
    await stream.done_writing()
    names = {s.name for s in reply.list_services_response.service}
    assert {"slotshift.v1.AllocationService", "grpc.health.v1.Health", service} <= names


async def test_telemetry_reaches_the_decisions(
    control_plane: ControlPlane, channel: grpc.aio.Channel, tokens: StreamTokens
) -> None:
    stub = telemetry_pb2_grpc.TelemetryServiceStub(channel)
    report = telemetry_pb2.TelemetryReport(
        pool="default",
        agent_id="agent-1",
        gpu_source=telemetry_pb2.GPU_SOURCE_EMULATED,
        gpus=[telemetry_pb2.GpuSample(index=0, utilization_pct=67.0)],
        engine=telemetry_pb2.EngineSample(
            scrape_ok=True, kv_cache_usage_perc=0.4, num_requests_running=12
        ),
    )

    async def reports() -> AsyncIterator[telemetry_pb2.TelemetryReport]:
        yield report

    summary = await stub.StreamTelemetry(reports(), metadata=tokens.agent_metadata)
    assert summary.reports_received == 1
    queries = query_pb2_grpc.AllocationServiceStub(channel)

    async def decided_with_telemetry() -> bool:
        reply = await queries.GetDecisions(query_pb2.GetDecisionsRequest(pool="default", limit=1))
        telemetry = reply.decisions[0].telemetry
        return telemetry.age_s >= 0 and telemetry.gpu_emulated

    await wait_until(decided_with_telemetry, message="a decision that saw the telemetry")
    reply = await queries.GetDecisions(query_pb2.GetDecisionsRequest(pool="default", limit=1))
    telemetry = reply.decisions[0].telemetry
    assert telemetry.fresh
    assert telemetry.gpu_available
    assert telemetry.gpu_utilization_pct == pytest.approx(67.0)
    assert telemetry.kv_cache_usage_perc == pytest.approx(0.4)


async def test_telemetry_for_an_unknown_pool_is_refused(
    channel: grpc.aio.Channel, tokens: StreamTokens
) -> None:
    stub = telemetry_pb2_grpc.TelemetryServiceStub(channel)

    async def reports() -> AsyncIterator[telemetry_pb2.TelemetryReport]:
        yield telemetry_pb2.TelemetryReport(pool="nope")

    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await stub.StreamTelemetry(reports(), metadata=tokens.agent_metadata)
    assert raised.value.code() == grpc.StatusCode.NOT_FOUND
    assert (raised.value.details() or "").startswith("pool:")
