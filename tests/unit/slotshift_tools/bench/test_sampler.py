"""The sampler against a fake AllocationService (gRPC, port 0) and a fake engine /metrics."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass

import aiohttp
import grpc
import pytest
from aiohttp import web

from slotshift.clock import ManualClock
from slotshift.v1 import allocation_pb2, query_pb2, query_pb2_grpc
from slotshift_tools.bench.load import TenantCounters
from slotshift_tools.bench.sampler import Sampler

ENGINE_METRICS = """\
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 90.0
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 3.0
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.25
# TYPE vllm:generation_tokens counter
vllm:generation_tokens_total{engine="0",model_name="m"} 12345.0
vllm:generation_tokens_created{engine="0",model_name="m"} 1.7e9
"""
PREFIX_CACHE = """\
# TYPE vllm:prefix_cache_queries counter
vllm:prefix_cache_queries_total{engine="0",model_name="m"} 5000.0
# TYPE vllm:prefix_cache_hits counter
vllm:prefix_cache_hits_total{engine="0",model_name="m"} 1200.0
"""
GATEWAY_WASTE = """\
# TYPE slotshift_gateway_waste_tokens_total counter
slotshift_gateway_waste_tokens_total{kind="discarded_output",tenant="B"} 5.0
"""
SIM_GPU = """\
# TYPE slotshift_sim_gpu_utilization_percent gauge
slotshift_sim_gpu_utilization_percent{engine="0",model_name="m"} 87.5
"""


class FakeAllocationService(query_pb2_grpc.AllocationServiceServicer):
    async def GetAllocation(
        self, request: query_pb2.GetAllocationRequest, context: object
    ) -> allocation_pb2.Allocation:
        assert request.pool == "seed"
        return allocation_pb2.Allocation(
            pool="seed",
            version=7,
            tenants=[
                allocation_pb2.TenantAllocation(tenant="A", limit_slots=30),
                allocation_pb2.TenantAllocation(tenant="B", limit_slots=66),
            ],
            gateways=[
                allocation_pb2.GatewayAllocation(
                    gateway_id=f"gateway-{i}",
                    tenants=[
                        allocation_pb2.GatewayTenantLimit(
                            tenant="A", target_slots=15, limit_slots=10
                        ),
                        allocation_pb2.GatewayTenantLimit(
                            tenant="B", target_slots=33, limit_slots=33
                        ),
                    ],
                )
                for i in range(2)
            ],
        )

    async def ListTenants(
        self, request: query_pb2.ListTenantsRequest, context: object
    ) -> query_pb2.ListTenantsResponse:
        return query_pb2.ListTenantsResponse(
            tenants=[
                query_pb2.TenantInfo(
                    pool="seed",
                    allocation=allocation_pb2.TenantAllocation(tenant=name),
                    in_flight=in_flight,
                    queued=queued,
                )
                for name, in_flight, queued in (("A", 20, 28), ("B", 66, 62))
            ]
        )

    async def ListPools(
        self, request: query_pb2.ListPoolsRequest, context: object
    ) -> query_pb2.ListPoolsResponse:
        return query_pb2.ListPoolsResponse()

    async def GetDecisions(
        self, request: query_pb2.GetDecisionsRequest, context: object
    ) -> query_pb2.GetDecisionsResponse:
        newest = query_pb2.Decision(
            id=2,
            outcome=query_pb2.DECISION_OUTCOME_PUBLISHED,
            outputs=[allocation_pb2.TenantAllocation(tenant="A", limit_slots=30)],
            telemetry=query_pb2.TelemetryInput(
                gpu_available=True, gpu_utilization_pct=55.0, gpu_emulated=False
            ),
        )
        newest.decided_at.FromSeconds(1_700_000_002)
        older = query_pb2.Decision(id=1, outcome=query_pb2.DECISION_OUTCOME_HELD)
        older.decided_at.FromSeconds(1_700_000_000)
        return query_pb2.GetDecisionsResponse(decisions=[newest, older])


@dataclass
class Fakes:
    target: str
    metrics_url: str
    metrics_text: list[str]
    gateway_urls: list[str]
    gateway_texts: list[str]
    """What each gateway's /metrics answers; empty: it fails with 500."""


@pytest.fixture
async def fakes() -> AsyncIterator[Fakes]:
    server = grpc.aio.server()
    query_pb2_grpc.add_AllocationServiceServicer_to_server(FakeAllocationService(), server)
    port = server.add_insecure_port("127.0.0.1:0")
    await server.start()
    text = [ENGINE_METRICS + SIM_GPU]

    gateway_texts = [GATEWAY_WASTE, GATEWAY_WASTE]

    async def metrics(_: web.Request) -> web.Response:
        return web.Response(text=text[0], content_type="text/plain")

    async def gateway_metrics(request: web.Request) -> web.Response:
        answer = gateway_texts[int(request.match_info["index"])]
        if not answer:
            raise web.HTTPInternalServerError()
        return web.Response(text=answer, content_type="text/plain")

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/gateway/{index}/metrics", gateway_metrics)
    runner = web.AppRunner(app)
    await runner.setup()
    await web.TCPSite(runner, "127.0.0.1", 0).start()
    base = f"http://127.0.0.1:{runner.addresses[0][1]}"
    try:
        yield Fakes(
            f"127.0.0.1:{port}",
            f"{base}/metrics",
            text,
            [f"{base}/gateway/{i}/metrics" for i in range(2)],
            gateway_texts,
        )
    finally:
        await runner.cleanup()
        await server.stop(None)


def _sampler(
    fakes: Fakes,
    channel: grpc.aio.Channel,
    session: aiohttp.ClientSession,
    *,
    gateways: bool = False,
) -> Sampler:
    counters = {"A": TenantCounters(sent=60, completed=12, outstanding=48), "B": TenantCounters()}
    return Sampler(
        stub=query_pb2_grpc.AllocationServiceStub(channel),
        session=session,
        pool="seed",
        engine_metrics_url=fakes.metrics_url,
        counters=counters,
        clock=ManualClock(start_s=1010.0),
        origin_s=1000.0,
        interval_s=0.5,
        gateway_metrics_urls=fakes.gateway_urls if gateways else (),
        rpc_timeout_s=1.0,
    )


async def test_a_sample_reads_the_control_plane_and_the_engine(fakes: Fakes) -> None:
    async with (
        grpc.aio.insecure_channel(fakes.target) as channel,
        aiohttp.ClientSession() as session,
    ):
        sampler = _sampler(fakes, channel, session)
        sample = await sampler.sample()
    assert sample.t_s == 10.0
    assert sample.version == 7
    assert sample.limits == {"A": 30, "B": 66}
    assert sample.granted == {"A": 20, "B": 66}
    assert sample.demand == {"A": 48, "B": 128}
    assert sample.outstanding == {"A": 48, "B": 0}
    assert sample.completed == {"A": 12, "B": 0}
    assert (sample.engine_running, sample.engine_waiting) == (90.0, 3.0)
    assert sample.kv_cache_usage == 0.25
    assert sample.engine_generation_tokens == 12345.0
    # No prefix-cache counters exported, no gateways given: unknown, not zero.
    assert (sample.engine_prefix_cache_queries, sample.engine_prefix_cache_hits) == (None, None)
    assert sample.gateway_waste_tokens is None
    assert (sample.gpu_utilization_pct, sample.gpu_emulated) == (87.5, True)
    assert sorted(sampler.decisions) == [1, 2]
    newest = sampler.decisions[2]
    assert (newest.outcome, newest.decided_at_wall_s) == ("published", 1_700_000_002.0)
    assert newest.outputs == {"A": 30}
    assert sampler.decisions[1].outcome == "held"


async def test_without_the_emulators_gauge_the_gpu_comes_from_the_agents_telemetry(
    fakes: Fakes,
) -> None:
    fakes.metrics_text[0] = ENGINE_METRICS
    async with (
        grpc.aio.insecure_channel(fakes.target) as channel,
        aiohttp.ClientSession() as session,
    ):
        sample = await _sampler(fakes, channel, session).sample()
    assert (sample.gpu_utilization_pct, sample.gpu_emulated) == (55.0, False)


async def test_a_silent_control_plane_leaves_its_part_of_the_sample_empty(fakes: Fakes) -> None:
    async with (
        grpc.aio.insecure_channel("127.0.0.1:9") as channel,
        aiohttp.ClientSession() as session,
    ):
        sample = await _sampler(fakes, channel, session).sample()
    assert sample.version is None
    assert sample.limits == {}
    assert sample.engine_running == 90.0


async def test_a_sample_reads_the_waste_counters_of_the_engine_and_every_gateway(
    fakes: Fakes,
) -> None:
    fakes.metrics_text[0] = ENGINE_METRICS + PREFIX_CACHE
    async with (
        grpc.aio.insecure_channel(fakes.target) as channel,
        aiohttp.ClientSession() as session,
    ):
        sample = await _sampler(fakes, channel, session, gateways=True).sample()
    assert (sample.engine_prefix_cache_queries, sample.engine_prefix_cache_hits) == (5000, 1200)
    assert sample.gateway_waste_tokens == {"B": {"discarded_output": 10.0}}
    assert sample.engine_read_s == sample.gateway_read_s == 10.0  # the clock did not move


async def test_a_silent_gateway_makes_the_waste_reading_unknown(fakes: Fakes) -> None:
    fakes.gateway_texts[1] = ""
    async with (
        grpc.aio.insecure_channel(fakes.target) as channel,
        aiohttp.ClientSession() as session,
    ):
        sample = await _sampler(fakes, channel, session, gateways=True).sample()
    assert sample.gateway_waste_tokens is None
    assert sample.gateway_read_s is None
    assert sample.engine_generation_tokens == 12345.0
