"""The client-streaming call that carries reports to the control plane, kept up by reconnection.

One stream at a time: open it, write each new report as the sampler publishes it, and when the
stream fails or the control plane ends it, open a new one. Reconnection (a fresh channel per
attempt, exponential backoff with jitter, reset after a healthy stream, one log line per change
of state) is slotshift.reconnect's; this module is the session on the stream and the agent's
view of it (the connected gauge, the superseded reports).

Traces: each attempt is a "telemetry.connect" span whose context goes in the call's metadata;
each report written is a "telemetry.send" span whose context goes in the report itself.
"""

from __future__ import annotations

import asyncio
import logging
import random
from collections.abc import Callable, Sequence

import grpc
from opentelemetry import trace
from opentelemetry.context import Context

from slotshift.clock import Clock
from slotshift.config import ClientTlsConfig
from slotshift.newest import NewestBox
from slotshift.reconnect import STREAM_GONE, ReconnectingStream, StreamState, Targets
from slotshift.stream_token import bearer_metadata, read_stream_token
from slotshift.tls import ChannelSecurity, load_channel_security, open_channel
from slotshift.trace_context import carrier_of, grpc_metadata
from slotshift.v1 import telemetry_pb2, telemetry_pb2_grpc
from telemetry_agent.agent_metrics import EngineMetrics
from telemetry_agent.report_trace import SEND_SPAN, report_attributes

logger = logging.getLogger(__name__)

_Call = grpc.aio.StreamUnaryCall[
    telemetry_pb2.TelemetryReport, telemetry_pb2.TelemetryStreamSummary
]


class TelemetryStream:
    """Sends one engine's latest report over TelemetryService.StreamTelemetry, reconnecting as
    needed: an agent keeps one stream per engine (docs/architecture.md says why).

    load_credentials() first; publish() from the engine's sampler; run() as a supervised task;
    finish() to end the stream cleanly. `pool` names the stream in its log lines.
    """

    def __init__(
        self,
        target: str | Sequence[str],
        *,
        pool: str,
        reconnect_initial_s: float,
        reconnect_max_s: float,
        clock: Clock,
        metrics: EngineMetrics,
        rng: random.Random | None = None,
        tracer: trace.Tracer | None = None,
        tls: ClientTlsConfig | None = None,
        token_file: str | None = None,
    ) -> None:
        """token_file: the agents' stream token (agent.controlplane_token_file), read by
        load_credentials and presented on every stream; None sends none."""
        self._targets = Targets(
            (target,) if isinstance(target, str) else tuple(target),
            self._open_channel,
            health_service=telemetry_pb2.DESCRIPTOR.services_by_name["TelemetryService"].full_name,
        )
        self._tls = tls
        self._security: ChannelSecurity | None = None
        self._token_file = token_file
        self._auth_metadata: tuple[tuple[str, str], ...] = ()
        self._tracer = tracer if tracer is not None else trace.NoOpTracer()
        self._metrics = metrics
        # While the control plane is unreachable the sampler keeps sampling: each new report
        # replaces the unsent one, and the first sent after a reconnection is the freshest.
        self._latest: NewestBox[telemetry_pb2.TelemetryReport] = NewestBox()
        self._link = ReconnectingStream(
            self._session,
            open_channel=self._targets,
            stream=f"telemetry stream of pool {pool}",
            peer="the control plane",
            initial_s=reconnect_initial_s,
            max_s=reconnect_max_s,
            clock=clock,
            rng=rng or random.Random(),
            logger=logger,
            on_state=self._on_state,
        )

    @property
    def connected(self) -> bool:
        """Whether a stream to the control plane is open now."""
        return self._link.connected

    async def load_credentials(self) -> None:
        """Read the TLS files (if the stream uses TLS) and the stream token (if any) before
        run(): a missing or bad file fails the agent's start, not each connection attempt."""
        self._security = await asyncio.to_thread(load_channel_security, self._tls)
        token = await asyncio.to_thread(
            read_stream_token, self._token_file, field="agent.controlplane_token_file"
        )
        self._auth_metadata = bearer_metadata(token)

    def publish(self, report: telemetry_pb2.TelemetryReport) -> None:
        """Hand over the newest report; it replaces an unsent older one."""
        if self._latest.put(report):
            self._metrics.reports_superseded.inc()

    async def run(self) -> None:
        """Keep a stream open until finish(); runs as a supervised task."""
        await self._link.run()

    async def finish(self, timeout_s: float) -> None:
        """Close the stream in order (the control plane sees a clean end), waiting at most
        timeout_s; the caller cancels run() if it is still going."""
        self._link.stop()
        self._latest.wake()
        if not await self._link.wait_stopped(timeout_s):
            logger.warning("telemetry stream did not close within %.1f s", timeout_s)

    def _open_channel(self, target: str) -> grpc.aio.Channel:
        return open_channel(target, self._security)

    async def _session(self, channel: grpc.aio.Channel, opened: Callable[[], None]) -> str:
        """One stream, from its opening to its end (see slotshift.reconnect.SessionBody)."""
        connecting = self._tracer.start_span(
            "telemetry.connect",
            context=Context(),
            kind=trace.SpanKind.CLIENT,
            attributes={
                "rpc.system": "grpc",
                "rpc.method": "slotshift.v1.TelemetryService/StreamTelemetry",
                "server.address": self._targets.current,
            },
        )
        stub = telemetry_pb2_grpc.TelemetryServiceStub(channel)
        # Without a request iterator grpc.aio hands back a call to write() to (its write API);
        # the stubs only describe the iterator form.
        call: _Call = stub.StreamTelemetry(  # type: ignore[call-arg]
            metadata=(*grpc_metadata(carrier_of(connecting)), *self._auth_metadata)
        )
        call.add_done_callback(lambda _call: self._latest.wake())
        try:
            try:
                await call.wait_for_connection()
            except grpc.aio.AioRpcError as exc:
                connecting.set_status(trace.StatusCode.ERROR, exc.code().name)
                raise
            finally:
                connecting.end()
            opened()
            await self._write_reports(call)
            if self._link.stopping and not call.done():
                await call.done_writing()
            summary = await call
            return f"the control plane ended it after {summary.reports_received} report(s)"
        finally:
            if not call.done():
                call.cancel()

    async def _write_reports(self, call: _Call) -> None:
        while not call.done() and not self._link.stopping:
            report = await self._latest.take()
            if report is None:
                continue
            if call.done():
                self._latest.put_back(report)
                return
            with self._tracer.start_as_current_span(
                SEND_SPAN,
                # A root: each report is a fact of its own, which decisions link to.
                context=Context(),
                kind=trace.SpanKind.PRODUCER,
                attributes=report_attributes(report),
            ) as span:
                outgoing = telemetry_pb2.TelemetryReport()
                outgoing.CopyFrom(report)
                outgoing.trace_context.update(carrier_of(span))
                try:
                    await call.write(outgoing)
                except STREAM_GONE as exc:
                    # The call has ended; awaiting it tells how. The report waits for the next
                    # one (and gets a new span then).
                    span.set_status(trace.StatusCode.ERROR, type(exc).__name__)
                    self._latest.put_back(report)
                    return
            self._metrics.reports_sent.inc()

    def _on_state(self, change: StreamState) -> str:
        """Follow the stream's state in the connected gauge; the note for the log line."""
        self._metrics.controlplane_connected.set(1 if change is StreamState.CONNECTED else 0)
        if change in (StreamState.UNREACHABLE, StreamState.LOST):
            return "sampling on meanwhile"
        return ""
