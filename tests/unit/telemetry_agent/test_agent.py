"""The agent end to end: a real engine endpoint, a real grpc.aio control plane, its own /metrics."""

from __future__ import annotations

import asyncio
import logging
import random
import socket
from collections.abc import AsyncIterator

import aiohttp
import pytest
import pytest_asyncio
from prometheus_client.parser import text_string_to_metric_families

from slotshift.clock import ManualClock, SystemClock
from slotshift.config import AgentConfig
from slotshift.v1 import telemetry_pb2
from telemetry_agent.agent import TelemetryAgent
from telemetry_agent.gpu import GpuDeviceReading
from tests.support import free_port, wait_until
from tests.unit.telemetry_agent.fake_engine import FakeEngineMetrics
from tests.unit.telemetry_agent.fake_nvml import H200, FakeNvml
from tests.unit.telemetry_agent.fixtures import EMULATOR_GPU_GAUGES, VLLM_SCRAPE_0
from tests.unit.telemetry_agent.recording_controlplane import RecordingControlPlane


@pytest_asyncio.fixture
async def engine() -> AsyncIterator[FakeEngineMetrics]:
    server = FakeEngineMetrics(VLLM_SCRAPE_0)
    await server.start()
    yield server
    await server.stop()


@pytest_asyncio.fixture
async def controlplane() -> AsyncIterator[RecordingControlPlane]:
    server = RecordingControlPlane()
    await server.start()
    yield server
    await server.stop()


POOL_A = (("pool", "pool-a"),)
"""The labels of the agent's series about the engine of pool-a."""


def agent_config(engine: FakeEngineMetrics, target: str) -> AgentConfig:
    return AgentConfig(
        pool="pool-a",
        agent_id="",
        controlplane_target=target,
        engine_metrics_url=engine.url,
        interval_s=0.02,
        scrape_timeout_s=1.0,
        reconnect_initial_s=0.02,
        reconnect_max_s=0.1,
        metrics_port=0,
        host="127.0.0.1",
    )


async def fetch(url: str) -> tuple[int, str]:
    async with aiohttp.ClientSession() as session, session.get(url) as response:
        return response.status, await response.text()


def metric_values(text: str) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


async def test_reports_reach_the_control_plane_with_pool_time_engine_and_gpu_figures(
    engine: FakeEngineMetrics, controlplane: RecordingControlPlane
) -> None:
    clock = ManualClock(start_s=1000.0, wall_offset_s=1.7e9)
    agent = TelemetryAgent(
        agent_config(engine, controlplane.target),
        agent_id="node-7",
        gpu_reader=FakeNvml(),
        clock=clock,
        rng=random.Random(0),
    )
    await agent.start()
    try:
        await wait_until(
            lambda: len(controlplane.telemetry.reports) >= 3, message="three reports received"
        )
        assert agent.controlplane_connected
    finally:
        await agent.stop()

    report = controlplane.telemetry.reports[0]
    assert report.pool == "pool-a"
    assert report.agent_id == "node-7"
    assert report.observed_at.seconds == 1_700_001_000
    assert report.observed_at.nanos == 0
    assert report.gpu_source == telemetry_pb2.GPU_SOURCE_NVML
    assert [g.uuid for g in report.gpus] == [H200.uuid]
    assert report.gpus[0].memory_total_bytes == H200.memory_total_bytes
    assert report.engine.scrape_ok
    assert report.engine.model_name == "Qwen/Qwen2.5-3B-Instruct"
    assert report.engine.num_requests_running == 12.0
    assert report.engine.kv_cache_usage_perc == 0.4172
    assert report.engine.ttft.count == 0
    # stop() ends the stream cleanly: the control plane sees the client finish, not a cancel.
    assert controlplane.telemetry.streams_closed_by_client == 1


async def test_without_nvml_the_emulator_gpu_is_reported_as_emulated(
    engine: FakeEngineMetrics, controlplane: RecordingControlPlane
) -> None:
    engine.text = VLLM_SCRAPE_0 + EMULATOR_GPU_GAUGES
    no_driver = FakeNvml()
    no_driver.open_error = "NVML initialisation failed: NVML Shared Library Not Found"
    agent = TelemetryAgent(agent_config(engine, controlplane.target), gpu_reader=no_driver)
    await agent.start()
    try:
        await wait_until(lambda: len(controlplane.telemetry.reports) >= 1, message="a report")
    finally:
        await agent.stop()
    report = controlplane.telemetry.reports[0]
    assert report.gpu_source == telemetry_pb2.GPU_SOURCE_EMULATED
    assert [g.utilization_pct for g in report.gpus] == [67.5]
    assert report.agent_id  # the host name, as neither the call nor the config named one


async def test_a_failing_engine_is_reported_as_such_and_counted(
    engine: FakeEngineMetrics, controlplane: RecordingControlPlane
) -> None:
    engine.status = 503
    no_driver = FakeNvml()
    no_driver.open_error = "NVML initialisation failed: NVML Shared Library Not Found"
    agent = TelemetryAgent(agent_config(engine, controlplane.target), gpu_reader=no_driver)
    await agent.start()
    try:
        await wait_until(lambda: len(controlplane.telemetry.reports) >= 2, message="reports")
        status, text = await fetch(f"http://127.0.0.1:{agent.metrics_port}/metrics")
    finally:
        await agent.stop()
    report = controlplane.telemetry.reports[0]
    assert not report.engine.scrape_ok
    assert "HTTP 503" in report.engine.scrape_error
    assert report.gpu_source == telemetry_pb2.GPU_SOURCE_UNAVAILABLE
    assert "Not Found" in report.gpu_unavailable_reason
    assert list(report.gpus) == []
    assert status == 200
    values = metric_values(text)
    errors = values[
        ("slotshift_agent_scrape_errors_total", (("pool", "pool-a"), ("reason", "http_status")))
    ]
    assert errors >= 2
    assert (
        values[("slotshift_agent_scrape_errors_total", (("pool", "pool-a"), ("reason", "timeout")))]
        == 0
    )
    assert values[("slotshift_agent_gpu_available", POOL_A)] == 0


async def test_own_metrics_and_health_endpoint(
    engine: FakeEngineMetrics, controlplane: RecordingControlPlane
) -> None:
    agent = TelemetryAgent(agent_config(engine, controlplane.target), gpu_reader=FakeNvml())
    await agent.start()
    try:
        await wait_until(lambda: len(controlplane.telemetry.reports) >= 2, message="reports")
        base = f"http://127.0.0.1:{agent.metrics_port}"
        metrics_status, text = await fetch(f"{base}/metrics")
        health_status, health = await fetch(f"{base}/health")
    finally:
        await agent.stop()
    assert metrics_status == 200
    values = metric_values(text)
    assert values[("slotshift_agent_scrapes_total", POOL_A)] >= 2
    assert values[("slotshift_agent_reports_sent_total", POOL_A)] >= 1
    assert values[("slotshift_agent_controlplane_connected", POOL_A)] == 1
    assert values[("slotshift_agent_gpu_available", POOL_A)] == 1
    assert values[("slotshift_agent_last_scrape_duration_seconds", POOL_A)] >= 0
    assert health_status == 200
    assert '"controlplane_connected": true' in health
    assert '"gpu_source": "GPU_SOURCE_NVML"' in health


async def test_reconnects_after_the_control_plane_restarts_on_the_same_port(
    engine: FakeEngineMetrics, caplog: pytest.LogCaptureFixture
) -> None:
    first = RecordingControlPlane()
    await first.start()
    agent = TelemetryAgent(agent_config(engine, first.target), gpu_reader=FakeNvml())
    second: RecordingControlPlane | None = None
    await agent.start()
    try:
        with caplog.at_level(logging.DEBUG, logger="telemetry_agent.report_stream"):
            await wait_until(lambda: len(first.telemetry.reports) >= 2, message="first reports")
            await first.stop()
            await wait_until(lambda: not agent.controlplane_connected, message="loss noticed")
            # Sampling goes on while the control plane is away, and retries fail quietly.
            scrapes = engine.requests
            await wait_until(lambda: engine.requests >= scrapes + 3, message="sampling on")
            await wait_until(
                lambda: any("still unreachable" in r.getMessage() for r in caplog.records),
                message="a failed retry",
            )
            second = RecordingControlPlane(port=first.port)
            await second.start()
            restarted = second
            await wait_until(
                lambda: len(restarted.telemetry.reports) >= 2, message="reports after restart"
            )
            assert agent.controlplane_connected
    finally:
        await agent.stop()
        if second is not None:
            await second.stop()
    messages = [r.getMessage() for r in caplog.records]
    assert sum(" is open" in m for m in messages) == 2
    assert sum(" lost " in m for m in messages) == 1
    # The loss was the state change worth a warning; the failed retries after it are DEBUG.
    unreachable = [r for r in caplog.records if "unreachable" in r.getMessage()]
    assert unreachable
    assert all(r.levelno == logging.DEBUG for r in unreachable)
    assert second.telemetry.reports[0].pool == "pool-a"


def superseded(agent: TelemetryAgent) -> float:
    value = agent.metrics.registry.get_sample_value(
        "slotshift_agent_reports_superseded_total", {"pool": "pool-a"}
    )
    return value or 0.0


async def test_while_the_control_plane_is_away_only_the_latest_report_waits(
    engine: FakeEngineMetrics,
) -> None:
    port = free_port()
    agent = TelemetryAgent(
        agent_config(engine, f"127.0.0.1:{port}"), gpu_reader=FakeNvml(), clock=SystemClock()
    )
    await agent.start()
    controlplane: RecordingControlPlane | None = None
    try:
        await wait_until(lambda: "pool-a" in agent.last_reports, message="a first sample")
        first_sampled = agent.last_reports["pool-a"].observed_at.ToNanoseconds()
        await wait_until(
            lambda: superseded(agent) >= 3,
            message="unsent reports replaced by newer ones",
        )
        controlplane = RecordingControlPlane(port=port)
        await controlplane.start()
        started = controlplane
        await wait_until(lambda: len(started.telemetry.reports) >= 1, message="a report")
    finally:
        await agent.stop()
        if controlplane is not None:
            await controlplane.stop()
    # The first report delivered is a fresh one, not the oldest of a backlog.
    assert controlplane.telemetry.reports[0].observed_at.ToNanoseconds() > first_sampled


async def test_a_busy_metrics_port_fails_start_and_leaves_nothing_running(
    engine: FakeEngineMetrics,
) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        config = agent_config(engine, f"127.0.0.1:{free_port()}").model_copy(
            update={"metrics_port": taken.getsockname()[1]}
        )
        agent = TelemetryAgent(config, gpu_reader=FakeNvml())
        with pytest.raises(OSError, match="already in use"):
            await agent.start()
        # stop() after a failed start returns at once and is harmless.
        await asyncio.wait_for(agent.stop(), timeout=1.0)
    assert engine.requests == 0


GPU_1 = GpuDeviceReading(
    index=1,
    uuid="GPU-0c8e1d2f-3a4b-4c5d-8e6f-7a8b9c0d1e2f",
    name="NVIDIA H200",
    utilization_pct=12.0,
    memory_used_bytes=20_000_000_000,
    memory_total_bytes=150_754_820_096,
)


async def test_two_engines_report_their_own_pools_and_gpus_and_a_stalled_one_holds_no_other(
    controlplane: RecordingControlPlane,
) -> None:
    engine_a, engine_b = FakeEngineMetrics(VLLM_SCRAPE_0), FakeEngineMetrics(VLLM_SCRAPE_0)
    await engine_a.start()
    await engine_b.start()
    base = agent_config(engine_a, controlplane.target).model_dump()
    config = AgentConfig.model_validate(
        {
            **base,
            "pool": None,
            "engine_metrics_url": None,
            "scrape_timeout_s": 0.5,
            "engines": [
                {"pool": "pool-a", "metrics_url": engine_a.url, "gpus": [H200.uuid]},
                {"pool": "pool-b", "metrics_url": engine_b.url, "gpus": [GPU_1.uuid]},
            ],
        }
    )
    agent = TelemetryAgent(config, gpu_reader=FakeNvml([H200, GPU_1]))
    await agent.start()
    try:
        await wait_until(
            lambda: {r.pool for r in controlplane.telemetry.reports} == {"pool-a", "pool-b"},
            message="reports of both pools",
        )
        engine_b.stall = True
        stalled_at = len(controlplane.telemetry.reports)
        await wait_until(
            lambda: (
                sum(r.pool == "pool-a" for r in controlplane.telemetry.reports[stalled_at:]) >= 10
            ),
            message="pool-a reporting on while pool-b's engine does not answer",
        )
        await wait_until(
            lambda: any(
                r.pool == "pool-b" and not r.engine.scrape_ok
                for r in controlplane.telemetry.reports
            ),
            message="pool-b's timed-out scrape reported",
        )
        status, text = await fetch(f"http://127.0.0.1:{agent.metrics_port}/metrics")
    finally:
        await agent.stop()
        await engine_a.stop()
        await engine_b.stop()
    reports = controlplane.telemetry.reports
    for pool, gpu in (("pool-a", H200), ("pool-b", GPU_1)):
        own = [r for r in reports if r.pool == pool]
        assert own
        assert all([g.uuid for g in r.gpus] == [gpu.uuid] for r in own), pool
        assert all(r.gpus[0].utilization_pct == gpu.utilization_pct for r in own), pool
    timed_out = next(r for r in reports if r.pool == "pool-b" and not r.engine.scrape_ok)
    assert "no answer within 0.5 s" in timed_out.engine.scrape_error
    assert all(r.engine.scrape_ok for r in reports if r.pool == "pool-a")
    # One stream per engine, each ended cleanly on stop.
    assert controlplane.telemetry.streams_opened == 2
    assert controlplane.telemetry.streams_closed_by_client == 2
    assert status == 200
    values = metric_values(text)
    pool_b = (("pool", "pool-b"), ("reason", "timeout"))
    assert values[("slotshift_agent_scrape_errors_total", pool_b)] >= 1
    assert (
        values[("slotshift_agent_scrape_errors_total", (("pool", "pool-a"), ("reason", "timeout")))]
        == 0
    )
    assert (
        values[("slotshift_agent_gpu_utilization_ratio", (("gpu", "1"), ("pool", "pool-b")))]
        == 0.12
    )
    assert (
        "slotshift_agent_gpu_utilization_ratio",
        (("gpu", "1"), ("pool", "pool-a")),
    ) not in values
