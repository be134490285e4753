"""TelemetryService: takes the agents' reports into the pools' state."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping

import grpc
from opentelemetry import trace

from controlplane.core.stream_identity import StreamPeer, StreamRole
from controlplane.pool_state import PoolState, TelemetryRecord
from controlplane.service.stream_guard import StreamGuard
from slotshift.clock import Clock
from slotshift.trace_context import carrier_from_grpc_metadata, parent_from
from slotshift.v1 import telemetry_pb2, telemetry_pb2_grpc


class TelemetryIngestService(telemetry_pb2_grpc.TelemetryServiceServicer):
    """Keeps each pool's latest report, with the trace context it was sent under (decisions link
    to it). A stream's opening is a "telemetry.connect" span, the child of the agent's own connect
    span when the call's metadata carries its traceparent; it ends with the first report."""

    def __init__(
        self,
        pools: Mapping[str, PoolState],
        clock: Clock,
        on_report: Callable[[str], None] | None = None,
        *,
        tracer: trace.Tracer | None = None,
        guard: StreamGuard | None = None,
    ) -> None:
        """guard: who may stream telemetry (checked before the first report is read, and each
        report's pool before it is taken); None lets every caller in (unit tests only)."""
        self._pools = pools
        self._guard = guard
        self._clock = clock
        self._on_report = on_report
        self._tracer = tracer if tracer is not None else trace.NoOpTracer()

    async def StreamTelemetry(
        self,
        request_iterator: AsyncIterator[telemetry_pb2.TelemetryReport],
        context: grpc.aio.ServicerContext[object, object],
    ) -> telemetry_pb2.TelemetryStreamSummary:
        guard = self._guard
        peer = None if guard is None else await guard.admit(context, StreamRole.AGENT)
        received = 0
        allowed: set[str] = set()
        opening: trace.Span | None = self._tracer.start_span(
            "telemetry.connect",
            context=parent_from(carrier_from_grpc_metadata(context.invocation_metadata())),
            kind=trace.SpanKind.SERVER,
        )
        try:
            async for report in request_iterator:
                if opening is not None:
                    opening.set_attributes(
                        {"slotshift.pool": report.pool, "slotshift.agent.id": report.agent_id}
                    )
                if report.pool not in allowed:
                    await self._admit_pool(context, peer, report.pool)
                    allowed.add(report.pool)
                state = self._pools.get(report.pool)
                if state is None:
                    await context.abort(
                        grpc.StatusCode.NOT_FOUND,
                        f"pool: no pool {report.pool!r} (known: {sorted(self._pools)})",
                    )
                    return telemetry_pb2.TelemetryStreamSummary()
                state.record_telemetry(self._record(report))
                received += 1
                if self._on_report is not None:
                    self._on_report(report.pool)
                if opening is not None:
                    opening.end()
                    opening = None
        finally:
            if opening is not None:
                opening.end()
        return telemetry_pb2.TelemetryStreamSummary(reports_received=received)

    async def _admit_pool(
        self,
        context: grpc.aio.ServicerContext[object, object],
        peer: StreamPeer | None,
        pool: str,
    ) -> None:
        """Return if the stream's peer may report for `pool`; else abort, nothing recorded."""
        if self._guard is not None and peer is not None:
            await self._guard.admit_pools(context, peer, (pool,))

    def _record(self, report: telemetry_pb2.TelemetryReport) -> TelemetryRecord:
        gpus = list(report.gpus)
        engine = report.engine
        return TelemetryRecord(
            received_at_s=self._clock.monotonic(),
            agent_id=report.agent_id,
            kv_cache_usage_perc=engine.kv_cache_usage_perc if engine.scrape_ok else 0.0,
            num_requests_running=engine.num_requests_running if engine.scrape_ok else 0.0,
            num_requests_waiting=engine.num_requests_waiting if engine.scrape_ok else 0.0,
            gpu_available=report.gpu_source
            in (telemetry_pb2.GPU_SOURCE_NVML, telemetry_pb2.GPU_SOURCE_EMULATED)
            and bool(gpus),
            gpu_emulated=report.gpu_source == telemetry_pb2.GPU_SOURCE_EMULATED,
            gpu_utilization_pct=sum(g.utilization_pct for g in gpus) / len(gpus) if gpus else 0.0,
            trace_context=dict(report.trace_context),
            engine_scraped=engine.scrape_ok,
        )
