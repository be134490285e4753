"""The client-streaming call that carries reports to the control plane, kept up by reconnection.

One stream at a time: open it, write each new report as the sampler publishes it, and when the
stream fails or the control plane ends it, wait (exponential backoff with jitter) and open a new
one. Each attempt gets a fresh channel, so this backoff is the only one in play (a long-lived
channel would add gRPC's own reconnection backoff, up to two minutes, on top). Changes of state
are logged once: connected, lost, unreachable; repeated failures go to DEBUG.

Traces: each attempt is a "telemetry.connect" span whose context goes in the call's metadata;
each report written is a "telemetry.send" span whose context goes in the report itself.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
from dataclasses import dataclass

import grpc
from opentelemetry import trace
from opentelemetry.context import Context

from slotshift.clock import Clock
from slotshift.config import ClientTlsConfig
from slotshift.tls import ChannelSecurity, load_channel_security, open_channel
from slotshift.trace_context import carrier_of, grpc_metadata
from slotshift.v1 import telemetry_pb2, telemetry_pb2_grpc
from telemetry_agent.agent_metrics import AgentMetrics
from telemetry_agent.backoff import Backoff
from telemetry_agent.latest_report import LatestReport
from telemetry_agent.report_trace import SEND_SPAN, report_attributes

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class _StreamOutcome:
    connected: bool
    """The stream was open at some point."""
    lasted_s: float
    """Seconds from opening to its end (0 if it never opened)."""
    ending: str
    """How it ended, for the logs."""


class TelemetryStream:
    """Sends the latest report over TelemetryService.StreamTelemetry, reconnecting as needed.

    publish() from the sampler; run() as a supervised task; finish() to end the stream cleanly.
    """

    def __init__(
        self,
        target: str,
        *,
        reconnect_initial_s: float,
        reconnect_max_s: float,
        clock: Clock,
        metrics: AgentMetrics,
        rng: random.Random | None = None,
        tracer: trace.Tracer | None = None,
        tls: ClientTlsConfig | None = None,
    ) -> None:
        self._target = target
        self._tls = tls
        self._security: ChannelSecurity | None = None
        self._tracer = tracer if tracer is not None else trace.NoOpTracer()
        self._backoff = Backoff(reconnect_initial_s, reconnect_max_s, rng or random.Random())
        self._reconnect_max_s = reconnect_max_s
        # A stream that stayed open this long counts as healthy and resets the backoff, so a
        # control plane that accepts and at once drops streams is not hammered at the first step.
        self._healthy_after_s = reconnect_max_s
        self._clock = clock
        self._metrics = metrics
        self._latest = LatestReport()
        self._connected = False
        self._failure_logged = False
        self._running = False
        self._finishing = asyncio.Event()
        self._finished = asyncio.Event()

    @property
    def connected(self) -> bool:
        """Whether a stream to the control plane is open now."""
        return self._connected

    async def load_credentials(self) -> None:
        """Read the TLS files (if the stream uses TLS) before run(): a missing or bad file fails
        the agent's start, not each connection attempt."""
        self._security = await asyncio.to_thread(load_channel_security, self._tls)

    def publish(self, report: telemetry_pb2.TelemetryReport) -> None:
        """Hand over the newest report; it replaces an unsent older one."""
        if self._latest.put(report):
            self._metrics.reports_superseded.inc()

    async def run(self) -> None:
        """Keep a stream open until finish(); runs as a supervised task."""
        self._running = True
        try:
            while not self._finishing.is_set():
                outcome = await self._stream_once()
                if self._finishing.is_set():
                    break
                if outcome.connected and outcome.lasted_s >= self._healthy_after_s:
                    self._backoff.reset()
                delay_s = self._backoff.next_delay_s()
                self._log_failure(outcome, delay_s)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(self._finishing.wait(), timeout=delay_s)
        finally:
            self._finished.set()

    async def finish(self, timeout_s: float) -> None:
        """Close the stream in order (the control plane sees a clean end), waiting at most
        timeout_s; the caller cancels run() if it is still going."""
        self._finishing.set()
        self._latest.interrupt()
        if not self._running:
            return
        try:
            await asyncio.wait_for(self._finished.wait(), timeout=timeout_s)
        except TimeoutError:
            logger.warning("telemetry stream did not close within %.1f s", timeout_s)

    async def _stream_once(self) -> _StreamOutcome:
        opened_at: float | None = None
        connecting = self._tracer.start_span(
            "telemetry.connect",
            context=Context(),
            kind=trace.SpanKind.CLIENT,
            attributes={
                "rpc.system": "grpc",
                "rpc.method": "slotshift.v1.TelemetryService/StreamTelemetry",
                "server.address": self._target,
            },
        )
        async with open_channel(self._target, self._security) as channel:
            stub = telemetry_pb2_grpc.TelemetryServiceStub(channel)
            # Without a request iterator grpc.aio hands back a call to write() to (its write API);
            # the stubs only describe the iterator form.
            call = stub.StreamTelemetry(  # type: ignore[call-arg]
                metadata=grpc_metadata(carrier_of(connecting))
            )
            call.add_done_callback(lambda _call: self._latest.interrupt())
            try:
                try:
                    await call.wait_for_connection()
                except grpc.aio.AioRpcError as exc:
                    connecting.set_status(trace.StatusCode.ERROR, exc.code().name)
                    raise
                finally:
                    connecting.end()
                opened_at = self._clock.monotonic()
                self._set_connected()
                await self._write_reports(call)
                if self._finishing.is_set() and not call.done():
                    await call.done_writing()
                summary = await call
                ending = f"the control plane ended it after {summary.reports_received} report(s)"
            except grpc.aio.AioRpcError as exc:
                ending = f"{exc.code().name}: {exc.details()}"
            finally:
                if not call.done():
                    call.cancel()
                self._connected = False
                self._metrics.controlplane_connected.set(0)
        lasted_s = 0.0 if opened_at is None else self._clock.monotonic() - opened_at
        return _StreamOutcome(connected=opened_at is not None, lasted_s=lasted_s, ending=ending)

    async def _write_reports(
        self,
        call: grpc.aio.StreamUnaryCall[
            telemetry_pb2.TelemetryReport, telemetry_pb2.TelemetryStreamSummary
        ],
    ) -> None:
        while not call.done() and not self._finishing.is_set():
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
                except (grpc.aio.AioRpcError, asyncio.InvalidStateError) as exc:
                    # The call has ended; awaiting it tells how. The report waits for the next
                    # one (and gets a new span then).
                    span.set_status(trace.StatusCode.ERROR, type(exc).__name__)
                    self._latest.put_back(report)
                    return
            self._metrics.reports_sent.inc()

    def _set_connected(self) -> None:
        self._connected = True
        self._metrics.controlplane_connected.set(1)
        logger.info("telemetry stream to the control plane at %s is open", self._target)
        self._failure_logged = False

    def _log_failure(self, outcome: _StreamOutcome, delay_s: float) -> None:
        if outcome.connected:
            logger.warning(
                "telemetry stream to the control plane at %s lost (%s); reconnecting",
                self._target,
                outcome.ending,
            )
        elif not self._failure_logged:
            logger.warning(
                "control plane at %s unreachable (%s); retrying with backoff up to %.1f s, "
                "sampling on meanwhile",
                self._target,
                outcome.ending,
                self._reconnect_max_s,
            )
        else:
            logger.debug(
                "control plane at %s still unreachable (%s); next try in %.2f s",
                self._target,
                outcome.ending,
                delay_s,
            )
        self._failure_logged = True
