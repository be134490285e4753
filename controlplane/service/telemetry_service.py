"""TelemetryService: takes the agents' reports into the pools' state."""

from __future__ import annotations

from collections.abc import AsyncIterator, Callable, Mapping

import grpc

from controlplane.pool_state import PoolState, TelemetryRecord
from slotshift.clock import Clock
from slotshift.v1 import telemetry_pb2, telemetry_pb2_grpc


class TelemetryIngestService(telemetry_pb2_grpc.TelemetryServiceServicer):
    def __init__(
        self,
        pools: Mapping[str, PoolState],
        clock: Clock,
        on_report: Callable[[str], None] | None = None,
    ) -> None:
        self._pools = pools
        self._clock = clock
        self._on_report = on_report

    async def StreamTelemetry(
        self,
        request_iterator: AsyncIterator[telemetry_pb2.TelemetryReport],
        context: grpc.aio.ServicerContext[object, object],
    ) -> telemetry_pb2.TelemetryStreamSummary:
        received = 0
        async for report in request_iterator:
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
        return telemetry_pb2.TelemetryStreamSummary(reports_received=received)

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
        )
