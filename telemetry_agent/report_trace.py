"""What the span that sends a telemetry report says about it.

Each report the agent sends is a root span, "telemetry.send"; its context travels in the report
(`TelemetryReport.trace_context`), and every control-plane decision that uses the report links to
it, so a decision's trace leads to the figures it was based on.
"""

from __future__ import annotations

from opentelemetry.util.types import AttributeValue

from slotshift.v1 import telemetry_pb2

SEND_SPAN = "telemetry.send"
"""Name of the span of one report's sending."""


def report_attributes(report: telemetry_pb2.TelemetryReport) -> dict[str, AttributeValue]:
    """The report's figures as span attributes (named after its fields)."""
    engine = report.engine
    attributes: dict[str, AttributeValue] = {
        "slotshift.pool": report.pool,
        "slotshift.agent.id": report.agent_id,
        "slotshift.telemetry.gpu_source": telemetry_pb2.GpuSource.Name(report.gpu_source),
        "slotshift.telemetry.scrape_ok": engine.scrape_ok,
    }
    if engine.scrape_ok:
        attributes.update(
            {
                "slotshift.telemetry.num_requests_running": engine.num_requests_running,
                "slotshift.telemetry.num_requests_waiting": engine.num_requests_waiting,
                "slotshift.telemetry.kv_cache_usage_perc": engine.kv_cache_usage_perc,
            }
        )
    else:
        attributes["slotshift.telemetry.scrape_error"] = engine.scrape_error
    if report.gpus:
        attributes["slotshift.telemetry.gpu_utilization_pct"] = sum(
            g.utilization_pct for g in report.gpus
        ) / len(report.gpus)
    else:
        attributes["slotshift.telemetry.gpu_unavailable_reason"] = report.gpu_unavailable_reason
    return attributes
