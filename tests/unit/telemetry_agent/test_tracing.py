"""The agent's traces and the figures of its latest report on /metrics."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest_asyncio
from opentelemetry import trace
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from slotshift.trace_context import span_context_from
from slotshift.v1 import telemetry_pb2
from telemetry_agent.agent import TelemetryAgent
from telemetry_agent.agent_metrics import AgentMetrics
from tests.support import wait_until
from tests.unit.telemetry_agent.fake_engine import FakeEngineMetrics
from tests.unit.telemetry_agent.fake_nvml import H200, FakeNvml
from tests.unit.telemetry_agent.fixtures import VLLM_SCRAPE_0
from tests.unit.telemetry_agent.recording_controlplane import RecordingControlPlane
from tests.unit.telemetry_agent.test_agent import agent_config


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


def _report(*, scrape_ok: bool) -> telemetry_pb2.TelemetryReport:
    return telemetry_pb2.TelemetryReport(
        pool="p",
        gpus=[
            telemetry_pb2.GpuSample(
                index=0, utilization_pct=87.0, memory_used_bytes=10, memory_total_bytes=20
            )
        ],
        engine=telemetry_pb2.EngineSample(
            scrape_ok=scrape_ok,
            num_requests_running=12,
            num_requests_waiting=3,
            kv_cache_usage_perc=0.25,
        ),
    )


def test_the_latest_reports_figures_are_gauges_with_base_units() -> None:
    latest: list[telemetry_pb2.TelemetryReport] = []
    metrics = AgentMetrics(latest_reports=lambda: latest[-1:])
    value = metrics.registry.get_sample_value
    assert value("slotshift_agent_engine_requests_running", {"pool": "p"}) is None
    latest.append(_report(scrape_ok=True))
    assert value("slotshift_agent_engine_requests_running", {"pool": "p"}) == 12
    assert value("slotshift_agent_engine_requests_waiting", {"pool": "p"}) == 3
    assert value("slotshift_agent_engine_kv_cache_usage_ratio", {"pool": "p"}) == 0.25
    gpu = {"pool": "p", "gpu": "0"}
    assert value("slotshift_agent_gpu_utilization_ratio", gpu) == 0.87
    assert value("slotshift_agent_gpu_memory_used_bytes", gpu) == 10
    assert value("slotshift_agent_gpu_memory_total_bytes", gpu) == 20
    latest.append(_report(scrape_ok=False))
    assert value("slotshift_agent_engine_kv_cache_usage_ratio", {"pool": "p"}) is None, (
        "a failed scrape leaves no stale figure behind"
    )


async def test_each_report_carries_the_context_of_the_span_that_sent_it(
    engine: FakeEngineMetrics, controlplane: RecordingControlPlane
) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider(resource=Resource({"service.name": "agent"}), shutdown_on_exit=False)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    agent = TelemetryAgent(
        agent_config(engine, controlplane.target),
        agent_id="node-7",
        gpu_reader=FakeNvml([H200]),
        tracer_provider=provider,
    )
    await agent.start()
    try:
        await wait_until(lambda: len(controlplane.telemetry.reports) >= 2, message="two reports")
    finally:
        await agent.stop()
    sends = {
        s.context.span_id: s
        for s in exporter.get_finished_spans()
        if s.name == "telemetry.send" and s.context is not None
    }
    for report in controlplane.telemetry.reports:
        sent_by = span_context_from(report.trace_context)
        assert sent_by is not None
        span = sends[sent_by.span_id]
        assert span.parent is None, "each report is a trace of its own"
        assert span.kind is trace.SpanKind.PRODUCER
        assert span.attributes is not None
        assert span.attributes["slotshift.agent.id"] == "node-7"
        assert span.attributes["slotshift.telemetry.scrape_ok"] is True
        assert span.attributes["slotshift.telemetry.gpu_source"] == "GPU_SOURCE_NVML"
    (latest,) = agent.last_reports.values()
    assert not latest.trace_context, "the context goes on the sent copy only"

    connects = [s for s in exporter.get_finished_spans() if s.name == "telemetry.connect"]
    assert connects
    opened_with = span_context_from(controlplane.telemetry.stream_metadata[0])
    assert opened_with is not None
    assert opened_with.span_id in {s.context.span_id for s in connects if s.context is not None}
