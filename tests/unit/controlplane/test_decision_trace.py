"""Each decision is a root span with its inputs, outputs and reason, linked to the telemetry it
used; what it publishes is pushed under it."""

from __future__ import annotations

from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from controlplane.core.demand_policy import DemandPolicy
from controlplane.core.policy import PolicyDecision
from controlplane.decision_loop import DecisionLoop
from controlplane.pool_state import PoolState, TelemetryRecord
from slotshift.clock import ManualClock
from slotshift.config import PoolConfig, TenantConfig
from slotshift.demand import LatencySummary, TenantDemand
from slotshift.trace_context import span_context_from, traceparent_of

POOL = PoolConfig(
    name="p",
    budget_slots=96,
    tenants=[
        TenantConfig(name="A", floor_slots=4, ttft_slo_ms=500.0),
        TenantConfig(name="B", floor_slots=4),
    ],
)
TELEMETRY_TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


@pytest.fixture
def exporter() -> InMemorySpanExporter:
    return InMemorySpanExporter()


@pytest.fixture
def tracer(exporter: InMemorySpanExporter) -> trace.Tracer:
    provider = TracerProvider(shutdown_on_exit=False)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    return provider.get_tracer("test")


def _state(clock: ManualClock) -> PoolState:
    state = PoolState(
        POOL,
        clock=clock,
        gateway_lease_ttl_s=6.0,
        telemetry_stale_after_s=5.0,
        decision_log_size=8,
    )
    clock.advance(6.0)  # past the start-up hold, so that grants follow the decisions
    state.record_telemetry(
        TelemetryRecord(
            received_at_s=clock.monotonic(),
            agent_id="agent",
            kv_cache_usage_perc=0.5,
            num_requests_running=40,
            num_requests_waiting=0,
            gpu_available=True,
            gpu_emulated=False,
            gpu_utilization_pct=90.0,
            trace_context={"traceparent": TELEMETRY_TRACEPARENT},
        )
    )
    return state


def _decisions(exporter: InMemorySpanExporter) -> list[ReadableSpan]:
    return [s for s in exporter.get_finished_spans() if s.name == "decision"]


def _carrier(span: ReadableSpan) -> dict[str, str]:
    assert span.context is not None
    return {"traceparent": traceparent_of(span.context)}


def _attributes(span: ReadableSpan) -> dict[str, Any]:
    return dict(span.attributes or {})


def test_a_published_decision_says_what_it_saw_chose_and_why(
    tracer: trace.Tracer, exporter: InMemorySpanExporter
) -> None:
    clock = ManualClock()
    state = _state(clock)
    session = state.connect_gateway("gw", 0, [])
    slow = LatencySummary(count=10, p50_ms=300.0, p90_ms=600.0, p99_ms=900.0)
    state.record_demand(
        session,
        0,
        [TenantDemand("A", in_flight=2, ttft=slow), TenantDemand("B", queued=30)],
        observed_at_wall_s=clock.wall(),
    )
    session.mailbox.take_nowait()
    clock.advance(1.0)
    # Whatever runs around it, a decision starts a trace of its own.
    with tracer.start_as_current_span("outer"):
        record = DecisionLoop(state, DemandPolicy(), clock=clock, tracer=tracer).decide_once()
    (span,) = _decisions(exporter)
    attributes = _attributes(span)
    assert span.parent is None
    assert attributes["slotshift.decision.id"] == record.id
    assert attributes["slotshift.decision.outcome"] == "published"
    assert attributes["slotshift.decision.reason"] == record.reason
    assert attributes["slotshift.decision.version"] == state.allocation.version
    assert attributes["slotshift.decision.trigger"] == "period"
    assert attributes["slotshift.decision.input.A.in_flight"] == 2
    assert attributes["slotshift.decision.input.B.queued"] == 30
    assert attributes["slotshift.decision.input.B.demand_slots"] == 30
    assert attributes["slotshift.decision.input.B.demand_age_s"] == 1.0
    assert attributes["slotshift.decision.input.A.limit_slots"] == 48
    assert attributes["slotshift.decision.input.A.ttft_p99_ms"] == 900.0
    assert attributes["slotshift.decision.input.A.ttft_slo_ms"] == 500.0
    assert attributes["slotshift.decision.input.A.ttft_over_slo"] is True
    assert "slotshift.decision.input.B.ttft_slo_ms" not in attributes
    assert attributes["slotshift.decision.output.B.limit_slots"] == record.outputs["B"]
    assert attributes["slotshift.decision.telemetry.age_s"] == 1.0
    assert attributes["slotshift.decision.telemetry.stale"] is False
    assert attributes["slotshift.decision.telemetry.kv_cache_usage_perc"] == 0.5
    assert attributes["slotshift.decision.telemetry.gpu_utilization_pct"] == 90.0

    telemetry = span_context_from({"traceparent": TELEMETRY_TRACEPARENT})
    assert [link.context for link in span.links] == [telemetry]

    # What it published waits to be pushed under it, and names it as the limits' decision.
    delivery = session.mailbox.take_nowait()
    assert delivery is not None
    assert delivery.allocation.version == state.allocation.version
    assert delivery.cause == delivery.decision == _carrier(span)


def test_later_regrants_are_pushed_under_the_decision_whose_limits_they_carry(
    tracer: trace.Tracer, exporter: InMemorySpanExporter
) -> None:
    clock = ManualClock()
    state = _state(clock)
    session = state.connect_gateway("gw", 0, [TenantDemand("A", in_flight=40, limit_slots=48)])
    state.record_demand(session, 0, [TenantDemand("A", in_flight=40), TenantDemand("B", queued=60)])
    DecisionLoop(state, DemandPolicy(), clock=clock, tracer=tracer).decide_once()
    (decision,) = _decisions(exporter)
    first = session.mailbox.take_nowait()
    assert first is not None
    # A drains: B's raise is granted at the next report, outside any decision.
    state.record_demand(session, first.allocation.version, [TenantDemand("B", in_flight=60)])
    regrant = session.mailbox.take_nowait()
    assert regrant is not None
    assert regrant.allocation.version > first.allocation.version
    assert regrant.cause == regrant.decision == _carrier(decision)


def test_a_rejected_decision_is_an_error_span_with_its_reason(
    tracer: trace.Tracer, exporter: InMemorySpanExporter
) -> None:
    class Greedy:
        name = "greedy"
        needs_advice = False

        def decide(self, snapshot: object, pool: PoolConfig, state: object | None) -> object:
            return PolicyDecision(limits={"A": 90, "B": 90}, reason="greedy")

    clock = ManualClock()
    DecisionLoop(
        _state(clock),
        Greedy(),  # type: ignore[arg-type]
        clock=clock,
        tracer=tracer,
    ).decide_once()
    (span,) = _decisions(exporter)
    assert span.status.status_code is trace.StatusCode.ERROR
    assert "sum to 180" in str(span.status.description)
    assert _attributes(span)["slotshift.decision.outcome"] == "rejected"


def test_without_a_tracer_decisions_push_without_trace_context() -> None:
    clock = ManualClock()
    state = _state(clock)
    session = state.connect_gateway("gw", 0, [])
    state.record_demand(session, 0, [TenantDemand("B", queued=30)])
    session.mailbox.take_nowait()
    DecisionLoop(state, DemandPolicy(), clock=clock).decide_once()
    delivery = session.mailbox.take_nowait()
    assert delivery is not None
    assert delivery.cause == {} and delivery.decision == {}
