"""What a decision's span says: its inputs, its policy, its outputs and why, as span attributes.

Every decision is a trace of its own (a root span named "decision"), so that one decision can be
found in Jaeger by its pool and version and read without the control plane's logs. Attribute
names are stable; docs/operations.md lists them.
"""

from __future__ import annotations

from collections.abc import Mapping

from opentelemetry import trace
from opentelemetry.util.types import AttributeValue

from controlplane.decision_log import DecisionOutcome, DecisionRecord
from slotshift.config import PoolConfig
from slotshift.demand import LatencySummary
from slotshift.trace_context import span_context_from

DECISION_SPAN = "decision"
"""Name of the root span of every decision."""


def telemetry_links(trace_context: Mapping[str, str] | None) -> list[trace.Link]:
    """A link to the agent's span that sent the telemetry report a decision used, if any."""
    span_context = span_context_from(trace_context or {})
    if span_context is None:
        return []
    return [trace.Link(span_context, {"slotshift.link": "telemetry report used"})]


def decision_attributes(
    record: DecisionRecord, pool: PoolConfig, limits_before: Mapping[str, int]
) -> dict[str, AttributeValue]:
    """The decision's span attributes, from its record and the limits in force before it."""
    attributes: dict[str, AttributeValue] = {
        "slotshift.pool": record.pool,
        "slotshift.decision.id": record.id,
        "slotshift.decision.policy": record.policy,
        "slotshift.decision.trigger": record.trigger,
        "slotshift.decision.outcome": record.outcome.value,
        "slotshift.decision.reason": record.reason,
        "slotshift.decision.version": record.version,
        "slotshift.decision.budget_slots": record.budget_slots,
        "slotshift.decision.duration_ms": record.duration_ms,
    }
    if record.fallback is not None:
        attributes["slotshift.decision.fallback"] = record.fallback
    for tenant in pool.tenants:
        name = tenant.name
        load = record.inputs.get(name)
        inputs = f"slotshift.decision.input.{name}"
        if load is not None:
            attributes[f"{inputs}.in_flight"] = load.in_flight
            attributes[f"{inputs}.queued"] = load.queued
            attributes[f"{inputs}.demand_slots"] = load.demand_slots
            if load.demand_age_s is not None:
                attributes[f"{inputs}.demand_age_s"] = load.demand_age_s
            attributes.update(_latency(f"{inputs}.ttft", load.ttft, tenant.ttft_slo_ms))
            attributes.update(_latency(f"{inputs}.e2e", load.e2e, tenant.e2e_slo_ms))
        if name in limits_before:
            attributes[f"{inputs}.limit_slots"] = limits_before[name]
        if name in record.outputs:
            attributes[f"slotshift.decision.output.{name}.limit_slots"] = record.outputs[name]
    telemetry = record.telemetry
    attributes["slotshift.decision.telemetry.present"] = telemetry is not None
    if telemetry is not None:
        prefix = "slotshift.decision.telemetry"
        attributes.update(
            {
                f"{prefix}.age_s": telemetry.age_s,
                f"{prefix}.stale": not telemetry.fresh,
                f"{prefix}.kv_cache_usage_perc": telemetry.kv_cache_usage_perc,
                f"{prefix}.num_requests_running": telemetry.num_requests_running,
                f"{prefix}.num_requests_waiting": telemetry.num_requests_waiting,
                f"{prefix}.gpu_available": telemetry.gpu_available,
                f"{prefix}.gpu_emulated": telemetry.gpu_emulated,
                f"{prefix}.gpu_utilization_pct": telemetry.gpu_utilization_pct,
            }
        )
    return attributes


def describe(
    span: trace.Span, record: DecisionRecord, pool: PoolConfig, limits_before: Mapping[str, int]
) -> None:
    """Set the decision's attributes on its span, and an error status if it was rejected.
    Nothing is built for a span that is not recorded (tracing off): at 10,000 tenants the
    attributes cost tens of milliseconds a decision."""
    if not span.is_recording():
        return
    span.set_attributes(decision_attributes(record, pool, limits_before))
    if record.outcome is DecisionOutcome.REJECTED:
        span.set_status(trace.StatusCode.ERROR, record.reason)


def _latency(
    prefix: str, latency: LatencySummary, slo_ms: float | None
) -> dict[str, AttributeValue]:
    """p50 and p99 when the window holds any sample; the SLO and whether p99 is over it when the
    tenant has one."""
    attributes: dict[str, AttributeValue] = {}
    if slo_ms is not None:
        attributes[f"{prefix}_slo_ms"] = slo_ms
    if latency.count > 0:
        attributes[f"{prefix}_p50_ms"] = latency.p50_ms
        attributes[f"{prefix}_p99_ms"] = latency.p99_ms
        if slo_ms is not None:
            attributes[f"{prefix}_over_slo"] = latency.p99_ms > slo_ms
    return attributes
