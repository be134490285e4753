"""A control plane stand-in: a real grpc.aio server whose TelemetryService records every report."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import grpc

from slotshift.v1 import telemetry_pb2, telemetry_pb2_grpc


class RecordingTelemetry(telemetry_pb2_grpc.TelemetryServiceServicer):
    """Keeps every report received, and counts streams opened and ended by the client."""

    def __init__(self) -> None:
        self.reports: list[telemetry_pb2.TelemetryReport] = []
        self.streams_opened = 0
        self.streams_closed_by_client = 0
        self.stream_metadata: list[dict[str, str]] = []
        """The text metadata each stream was opened with."""

    async def StreamTelemetry(
        self,
        request_iterator: AsyncIterator[telemetry_pb2.TelemetryReport],
        context: grpc.aio.ServicerContext[Any, Any],
    ) -> telemetry_pb2.TelemetryStreamSummary:
        self.streams_opened += 1
        self.stream_metadata.append(
            {k: v for k, v in context.invocation_metadata() or () if isinstance(v, str)}
        )
        received = 0
        async for report in request_iterator:
            self.reports.append(report)
            received += 1
        self.streams_closed_by_client += 1
        return telemetry_pb2.TelemetryStreamSummary(reports_received=received)


class RecordingControlPlane:
    """Serves RecordingTelemetry on 127.0.0.1:port (0 picks one)."""

    def __init__(self, port: int = 0) -> None:
        self.telemetry = RecordingTelemetry()
        self._server = grpc.aio.server()
        telemetry_pb2_grpc.add_TelemetryServiceServicer_to_server(self.telemetry, self._server)
        self.port = self._server.add_insecure_port(f"127.0.0.1:{port}")
        self.target = f"127.0.0.1:{self.port}"

    async def start(self) -> None:
        await self._server.start()

    async def stop(self) -> None:
        await self._server.stop(grace=None)
