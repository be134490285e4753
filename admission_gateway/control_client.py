"""The gateway's end of `GatewayService.Connect`: limits come in, demand and acks go out.

Protocol (proto/slotshift/v1/gateway.proto):
- on every (re)connection the first message is a GatewayHello with the version in force (0 on the
  fallback split) and each tenant's limit and usage, so that a restarted control plane rebuilds
  its view of the pool before it grants anything;
- then a DemandReport every report_interval_s;
- on an AllocationUpdate newer than the applied version, every tenant is resized first and the
  AllocationAck (version and usage at that moment) is sent right after. The control plane counts
  on "once acked, this gateway admits at most limit_slots" to keep the pool within its budget, so
  the ack never precedes the resize. Updates not newer than the applied version are ignored.
- every message with figures (hello, report, ack) says when they were taken (`observed_at`, the
  gateway's wall clock), so that the control plane never lets older figures replace newer ones,
  and each report names the version in force, which heals an ack that was lost.

While the stream is down the gateway keeps enforcing the last applied limits (fail-static; with
`on_controlplane_loss: fallback`, at most the fallback split) and reconnects with exponential
backoff and jitter (slotshift.reconnect).

Traces: each connection attempt is a "controlplane.connect" span whose context goes in the call's
metadata (the control plane handles the hello under it); each update is applied in an
"allocation.apply" span, the child of the control plane's push (from
`AllocationUpdate.trace_context`). The decision the update comes from is remembered per tenant, for
the requests admitted under it to link to.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import logging
import random
from collections.abc import Callable, Mapping

import grpc
from opentelemetry import trace
from opentelemetry.context import Context

from admission_gateway.gateway_state import GatewayState, TenantLimit
from slotshift.aiotasks import Supervisor
from slotshift.clock import Clock
from slotshift.demand import TenantDemand
from slotshift.reconnect import STREAM_GONE, ReconnectingStream, StreamState
from slotshift.tls import ChannelSecurity, open_channel
from slotshift.trace_context import (
    DECISION_TRACEPARENT,
    carrier_of,
    grpc_metadata,
    parent_from,
    span_context_from,
)
from slotshift.v1 import common_pb2, gateway_pb2, gateway_pb2_grpc
from slotshift.wire import demand_to_proto, to_timestamp

logger = logging.getLogger(__name__)

TenantsObserver = Callable[[Mapping[str, tuple[bytes, ...]]], None]
"""Called with the pool's tenants and their API keys' SHA-256 digests whenever the control plane
sends them (the gateway authenticates exactly these tenants from then on)."""

_Call = grpc.aio.StreamStreamCall[gateway_pb2.GatewayMessage, gateway_pb2.ControlMessage]


class ControlClient:
    """Keeps one gateway's stream to the control plane up and applies what it pushes.

    The stream is kept up by slotshift.reconnect (a fresh channel per attempt, backoff with
    jitter, reset after a healthy stream, one log line per change of state); this class is the
    session on it and what the gateway does when it comes and goes.
    """

    def __init__(
        self,
        state: GatewayState,
        *,
        target: str,
        gateway_id: str,
        report_interval_s: float,
        queue_report_min_interval_s: float,
        reconnect_initial_s: float,
        full_report_interval_s: float = 5.0,
        reconnect_max_s: float,
        clock: Clock,
        rng: random.Random | None = None,
        tracer: trace.Tracer | None = None,
        security: ChannelSecurity | None = None,
        on_tenants: TenantsObserver | None = None,
    ) -> None:
        self._state = state
        self._on_tenants = on_tenants
        self._tracer = tracer if tracer is not None else trace.NoOpTracer()
        self._target = target
        self._gateway_id = gateway_id
        self._report_interval_s = report_interval_s
        self._queue_report_min_interval_s = min(queue_report_min_interval_s, report_interval_s)
        self._full_report_interval_s = full_report_interval_s
        self._figures: _FiguresSent | None = None
        """What the control plane holds of this gateway's figures on the open stream."""
        self._clock = clock
        self._link = ReconnectingStream(
            self._session,
            open_channel=functools.partial(open_channel, target, security),
            stream="control stream",
            peer=f"the control plane at {target}",
            initial_s=reconnect_initial_s,
            max_s=max(reconnect_max_s, reconnect_initial_s),
            clock=clock,
            rng=rng if rng is not None else random.Random(),
            logger=logger,
            on_state=self._on_state,
        )

    @property
    def connected(self) -> bool:
        """Whether the stream to the control plane is open now."""
        return self._state.controlplane_connected

    @property
    def attempts(self) -> int:
        """Connection attempts so far, successful or not."""
        return self._link.attempts

    @property
    def sessions_started(self) -> int:
        """Streams opened so far (a hello was sent on each)."""
        return self._link.sessions_started

    async def run(self) -> None:
        """Connect, and reconnect whenever the stream ends, until cancelled."""
        await self._link.run()

    async def _session(self, channel: grpc.aio.Channel, opened: Callable[[], None]) -> str:
        """One stream, from hello to its end (see slotshift.reconnect.SessionBody)."""
        stub = gateway_pb2_grpc.GatewayServiceStub(channel)
        connecting = self._tracer.start_span(
            "controlplane.connect",
            # A root: a connection belongs to no request or decision.
            context=Context(),
            kind=trace.SpanKind.CLIENT,
            attributes={
                "slotshift.pool": self._state.pool_name,
                "slotshift.gateway.id": self._gateway_id,
                "slotshift.allocation.applied_version": self._state.applied_version,
                "rpc.system": "grpc",
                "rpc.method": "slotshift.v1.GatewayService/Connect",
                "server.address": self._target,
            },
        )
        # None: messages are written with call.write, not drawn from an iterator.
        call: _Call = stub.Connect(None, metadata=grpc_metadata(carrier_of(connecting)))
        writes = asyncio.Lock()
        tasks = Supervisor("control-stream")
        try:
            try:
                await self._write(call, writes, gateway_pb2.GatewayMessage(hello=self._hello()))
            except STREAM_GONE as exc:
                connecting.set_status(trace.StatusCode.ERROR, type(exc).__name__)
                raise
            finally:
                connecting.end()
            opened()
            tasks.spawn("demand-reports", self._report_periodically(call, writes), forever=False)
            async for message in call:
                if message.HasField("allocation"):
                    await self._on_allocation(call, writes, message.allocation)
                elif message.HasField("tenants"):
                    self._on_directory(message.tenants)
            return "the control plane ended the stream"
        finally:
            await tasks.stop()
            call.cancel()

    async def _on_allocation(
        self, call: _Call, writes: asyncio.Lock, update: gateway_pb2.AllocationUpdate
    ) -> None:
        if update.pool != self._state.pool_name or update.gateway_id != self._gateway_id:
            logger.warning(
                "ignoring allocation %d addressed to gateway %r of pool %r",
                update.version,
                update.gateway_id,
                update.pool,
            )
            return
        limits = [
            TenantLimit(
                t.tenant,
                target_slots=t.target_slots,
                limit_slots=t.limit_slots,
                pause_above_slots=(
                    t.pause_above_slots if t.HasField("pause_above_slots") else None
                ),
            )
            for t in update.tenants
        ]
        carrier = dict(update.trace_context)
        with self._tracer.start_as_current_span(
            "allocation.apply",
            context=parent_from(carrier),
            kind=trace.SpanKind.CONSUMER,
            attributes={
                "slotshift.pool": update.pool,
                "slotshift.gateway.id": self._gateway_id,
                "slotshift.allocation.version": update.version,
                "slotshift.decision.id": update.decision_id,
            },
        ) as span:
            decision = span_context_from(
                {"traceparent": carrier[DECISION_TRACEPARENT]}
                if DECISION_TRACEPARENT in carrier
                else {}
            )
            applied = self._state.apply_allocation(
                update.version, limits, decision=decision, delta=update.delta
            )
            span.set_attribute("slotshift.allocation.applied", applied)
            if not applied:
                logger.debug(
                    "ignoring allocation %d: version %d is already applied",
                    update.version,
                    self._state.applied_version,
                )
                return
            # The tenants this update names: a delta leaves the others as they were.
            named = [
                self._state.tenants[t.tenant] for t in limits if t.tenant in self._state.tenants
            ]
            for tenant in named:
                span.set_attribute(
                    f"slotshift.allocation.{tenant.name}.limit_slots", tenant.admission.limit_slots
                )
                span.set_attribute(
                    f"slotshift.allocation.{tenant.name}.target_slots", tenant.target_slots
                )
            # The ack is built right after the resize, with nothing awaited in between, so the
            # usage it carries is the usage under the new limits.
            figures, delta = self._changed_figures()
            ack = gateway_pb2.AllocationAck(
                pool=self._state.pool_name,
                gateway_id=self._gateway_id,
                version=update.version,
                observed_at=to_timestamp(self._clock.wall()),
                tenants=figures,
                delta=delta,
            )
            logger.info(
                "applied allocation %d%s: %s",
                update.version,
                " (changes)" if update.delta else "",
                ", ".join(
                    f"{t.name}={t.admission.limit_slots}"
                    + (
                        ""
                        if t.admission.pause_above_slots is None
                        else f" (pause above {t.admission.pause_above_slots},"
                        f" {t.admission.in_flight} running)"
                    )
                    for t in named
                ),
            )
            await self._write(call, writes, gateway_pb2.GatewayMessage(ack=ack))

    def _on_directory(self, directory: gateway_pb2.TenantDirectory) -> None:
        """The pool's tenants changed (or the stream just opened): know every one of them before
        the allocation that follows names them, and let the gateway authenticate exactly them."""
        if directory.pool != self._state.pool_name:
            logger.warning("ignoring the tenants of pool %r", directory.pool)
            return
        tenants = {t.tenant: tuple(t.api_key_sha256) for t in directory.tenants}
        for name in tenants:
            if self._state.add_tenant(name):
                logger.info("tenant %s added (config version %d)", name, directory.config_version)
        if self._on_tenants is not None:
            self._on_tenants(tenants)

    async def _report_periodically(self, call: _Call, writes: asyncio.Lock) -> None:
        queue_started = self._state.queue_started
        # The periodic interval is counted from the end of the shortest gap, so that a gateway
        # whose queues keep starting still reports every report_interval_s, and no more often
        # than every queue_report_min_interval_s.
        wait_s = self._report_interval_s - self._queue_report_min_interval_s
        try:
            while True:
                await asyncio.sleep(self._queue_report_min_interval_s)
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(queue_started.wait(), wait_s)
                queue_started.clear()
                figures, delta = self._changed_figures()
                report = gateway_pb2.DemandReport(
                    pool=self._state.pool_name,
                    gateway_id=self._gateway_id,
                    applied_version=self._state.applied_version,
                    observed_at=to_timestamp(self._clock.wall()),
                    tenants=figures,
                    delta=delta,
                )
                await self._write(call, writes, gateway_pb2.GatewayMessage(demand=report))
        except STREAM_GONE:
            # The stream is gone; the reader sees it too and ends the session.
            return

    def _hello(self) -> gateway_pb2.GatewayHello:
        # A new stream: the control plane holds nothing of ours on it yet.
        self._figures = _FiguresSent(self._clock, self._full_report_interval_s)
        figures, _ = self._figures.next(self._state.demand(), whole=True)
        return gateway_pb2.GatewayHello(
            pool=self._state.pool_name,
            gateway_id=self._gateway_id,
            applied_version=self._state.applied_version,
            observed_at=to_timestamp(self._clock.wall()),
            tenants=figures,
        )

    def _changed_figures(self) -> tuple[list[common_pb2.TenantDemand], bool]:
        """The figures for a report or an ack, and whether they are a delta."""
        if self._figures is None:
            self._figures = _FiguresSent(self._clock, self._full_report_interval_s)
        return self._figures.next(self._state.demand(), whole=False)

    @staticmethod
    async def _write(
        call: _Call, writes: asyncio.Lock, message: gateway_pb2.GatewayMessage
    ) -> None:
        # grpc.aio allows one write in flight per call; acks and reports come from two tasks.
        async with writes:
            await call.write(message)

    def _on_state(self, change: StreamState) -> str:
        """Follow the stream's state; what the gateway enforces meanwhile, for the log line."""
        self._state.controlplane_connected = change is StreamState.CONNECTED
        if change is StreamState.CONNECTED:
            return f"gateway {self._gateway_id}, applied version {self._state.applied_version}"
        if change is StreamState.UNREACHABLE:
            return "enforcing the fallback split"
        if change is StreamState.LOST:
            if self._state.controlplane_lost():
                return "cut to at most the fallback split until it is back"
            return f"enforcing allocation {self._state.applied_version} until it is back"
        return ""


class _FiguresSent:
    """The figures the control plane holds of this gateway on one stream, so that a report or
    an ack carries only what changed (DemandReport.delta), and every tenant's figures at least
    every `full_interval_s`."""

    def __init__(self, clock: Clock, full_interval_s: float) -> None:
        self._clock = clock
        self._full_interval_s = full_interval_s
        self._held: dict[str, TenantDemand] = {}
        self._whole_due_s = 0.0

    def next(
        self, demand: list[TenantDemand], *, whole: bool
    ) -> tuple[list[common_pb2.TenantDemand], bool]:
        """What to send of `demand` now, and whether it is a delta (only the changed figures)."""
        now = self._clock.monotonic()
        if whole or now >= self._whole_due_s:
            self._held = {d.tenant: d for d in demand}
            self._whole_due_s = now + self._full_interval_s
            return [demand_to_proto(d) for d in demand], False
        changed = [d for d in demand if self._held.get(d.tenant) != d]
        for figures in changed:
            self._held[figures.tenant] = figures
        return [demand_to_proto(d) for d in changed], True
