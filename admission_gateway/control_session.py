"""One session of the gateway's control stream, from its hello to its end, on any message
stream: limits come in, demand and acks go out.

The protocol (proto/slotshift/v1/gateway.proto, and admission_gateway/control_client.py's
docstring) lives here, apart from the gRPC channel: ControlClient runs a session on each call it
opens (keeping the stream up, reconnecting, tracing the connection), and the deterministic twin
(slotshift_tools/twin) runs the same session over an in-memory stream on a virtual clock. A
stream is anything that writes `GatewayMessage`s and yields `ControlMessage`s in order (a
`grpc.aio.StreamStreamCall` is one).
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import AsyncIterator, Callable, Mapping
from dataclasses import dataclass
from typing import Protocol

from opentelemetry import trace

from admission_gateway.gateway_state import GatewayState, TenantLimit
from slotshift.aiotasks import Supervisor
from slotshift.clock import Clock
from slotshift.demand import TenantDemand
from slotshift.reconnect import STREAM_GONE
from slotshift.trace_context import DECISION_TRACEPARENT, parent_from, span_context_from
from slotshift.v1 import common_pb2, gateway_pb2
from slotshift.wire import demand_columns_to_proto, demand_to_proto, to_timestamp

logger = logging.getLogger(__name__)

TenantsObserver = Callable[[Mapping[str, tuple[bytes, ...]]], None]
"""Called with the pool's tenants and their API keys' SHA-256 digests whenever the control plane
sends them (the gateway authenticates exactly these tenants from then on)."""


class ControlStream(Protocol):
    """The gateway's end of one open control stream."""

    async def write(self, message: gateway_pb2.GatewayMessage) -> None:
        """Send `message`; one write at a time (the session serialises them). A broken stream
        raises one of slotshift.reconnect.STREAM_GONE."""

    def __aiter__(self) -> AsyncIterator[gateway_pb2.ControlMessage]:
        """The control plane's messages in order, until it ends the stream."""


class ControlSession:
    """What the gateway says and does on its control stream (one stream at a time): the hello,
    a demand report every report_interval_s (sooner when a queue starts), each allocation
    applied and acknowledged, the pool's tenant directory taken in. Reports and acks carry only
    the figures that changed since the last message on the stream, and all of them at least
    every full_report_interval_s."""

    def __init__(
        self,
        state: GatewayState,
        *,
        gateway_id: str,
        report_interval_s: float,
        queue_report_min_interval_s: float,
        full_report_interval_s: float,
        clock: Clock,
        tracer: trace.Tracer | None = None,
        on_tenants: TenantsObserver | None = None,
    ) -> None:
        self._state = state
        self._gateway_id = gateway_id
        self._report_interval_s = report_interval_s
        self._queue_report_min_interval_s = min(queue_report_min_interval_s, report_interval_s)
        self._full_report_interval_s = full_report_interval_s
        self._clock = clock
        self._tracer = tracer if tracer is not None else trace.NoOpTracer()
        self._on_tenants = on_tenants
        self._figures: _FiguresSent | None = None
        """What the control plane holds of this gateway's figures on the open stream."""

    @property
    def gateway_id(self) -> str:
        return self._gateway_id

    async def run(
        self,
        stream: ControlStream,
        opened: Callable[[], None],
        *,
        connecting: trace.Span | None = None,
    ) -> str:
        """One stream from its hello to its end: writes the hello, calls `opened()` once it is
        written, then reports periodically and applies what arrives until the control plane ends
        the stream (returns how it ended, for the log). STREAM_GONE errors propagate when the
        stream breaks; CancelledError goes through. `connecting`, the connection attempt's span,
        ends once the hello is written (with an error status if it could not be)."""
        writes = asyncio.Lock()
        tasks = Supervisor("control-stream")
        try:
            try:
                await self._write(stream, writes, gateway_pb2.GatewayMessage(hello=self._hello()))
            except STREAM_GONE as exc:
                if connecting is not None:
                    connecting.set_status(trace.StatusCode.ERROR, type(exc).__name__)
                raise
            finally:
                if connecting is not None:
                    connecting.end()
            opened()
            tasks.spawn("demand-reports", self._report_periodically(stream, writes), forever=False)
            async for message in stream:
                if message.HasField("allocation"):
                    update = message.allocation
                    if update.epoch < self._state.epoch:
                        return self._refuse_epoch(update)
                    await self._on_allocation(stream, writes, update)
                elif message.HasField("tenants"):
                    self._on_directory(message.tenants)
            return "the control plane ended the stream"
        finally:
            await tasks.stop()

    def _refuse_epoch(self, update: gateway_pb2.AllocationUpdate) -> str:
        """An update from a leader older than one whose update is applied: a deposed leader
        (cut off from the store, say) must not hand out budget. The stream to it ends, so that
        the client moves on to the leader; its update is not applied nor acknowledged."""
        logger.warning(
            "refusing allocation %d of leader epoch %d: epoch %d is in force",
            update.version,
            update.epoch,
            self._state.epoch,
        )
        return f"it is a deposed leader (epoch {update.epoch} < {self._state.epoch})"

    async def _on_allocation(
        self, stream: ControlStream, writes: asyncio.Lock, update: gateway_pb2.AllocationUpdate
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
                "slotshift.leader.epoch": update.epoch,
            },
        ) as span:
            decision = span_context_from(
                {"traceparent": carrier[DECISION_TRACEPARENT]}
                if DECISION_TRACEPARENT in carrier
                else {}
            )
            applied = self._state.apply_allocation(
                update.version, limits, decision=decision, delta=update.delta, epoch=update.epoch
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
            if span.is_recording():
                for tenant in named:
                    span.set_attribute(
                        f"slotshift.allocation.{tenant.name}.limit_slots",
                        tenant.admission.limit_slots,
                    )
                    span.set_attribute(
                        f"slotshift.allocation.{tenant.name}.target_slots", tenant.target_slots
                    )
            # The ack is built right after the resize, with nothing awaited in between, so the
            # usage it carries is the usage under the new limits.
            figures = self._changed_figures()
            ack = gateway_pb2.AllocationAck(
                pool=self._state.pool_name,
                gateway_id=self._gateway_id,
                version=update.version,
                observed_at=to_timestamp(self._clock.wall()),
                tenants=figures.tenants,
                columns=figures.columns,
                delta=figures.delta,
                tokens=() if figures.delta else self._tokens(),
            )
            # The line's text costs more than applying the update: built only when logged.
            if logger.isEnabledFor(logging.INFO):
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
            await self._write(stream, writes, gateway_pb2.GatewayMessage(ack=ack))

    def _on_directory(self, directory: gateway_pb2.TenantDirectory) -> None:
        """The pool's tenants changed (or the stream just opened): know every one of them before
        the allocation that follows names them, and let the gateway authenticate exactly them."""
        if directory.pool != self._state.pool_name:
            logger.warning("ignoring the tenants of pool %r", directory.pool)
            return
        if self._figures is not None:
            self._figures.columns = directory.reads_demand_columns
        tenants = {t.tenant: tuple(t.api_key_sha256) for t in directory.tenants}
        for name in tenants:
            if self._state.add_tenant(name):
                logger.info("tenant %s added (config version %d)", name, directory.config_version)
        if self._on_tenants is not None:
            self._on_tenants(tenants)

    async def _report_periodically(self, stream: ControlStream, writes: asyncio.Lock) -> None:
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
                figures = self._changed_figures()
                report = gateway_pb2.DemandReport(
                    pool=self._state.pool_name,
                    gateway_id=self._gateway_id,
                    applied_version=self._state.applied_version,
                    observed_at=to_timestamp(self._clock.wall()),
                    tenants=figures.tenants,
                    columns=figures.columns,
                    delta=figures.delta,
                    tokens=() if figures.delta else self._tokens(),
                )
                await self._write(stream, writes, gateway_pb2.GatewayMessage(demand=report))
        except STREAM_GONE:
            # The stream is gone; the reader sees it too and ends the session.
            return

    def _hello(self) -> gateway_pb2.GatewayHello:
        # A new stream: the control plane holds nothing of ours on it yet.
        self._figures = _FiguresSent(self._clock, self._full_report_interval_s)
        figures = self._figures.next(self._state.demand(), whole=True)
        return gateway_pb2.GatewayHello(
            pool=self._state.pool_name,
            gateway_id=self._gateway_id,
            applied_version=self._state.applied_version,
            observed_at=to_timestamp(self._clock.wall()),
            tenants=figures.tenants,
            tokens=self._tokens(),
        )

    def _tokens(self) -> list[common_pb2.TenantTokens]:
        """Every tenant's tokens per model here, for a full report (never a delta: the counts
        move with every request, and the control plane needs them only every few seconds)."""
        return [
            common_pb2.TenantTokens(
                tenant=name,
                model=model,
                prompt_tokens_total=totals.prompt_tokens_total,
                completion_tokens_total=totals.completion_tokens_total,
            )
            for name, tenant in self._state.tenants.items()
            for model, totals in tenant.tokens.items()
        ]

    def _changed_figures(self) -> _Figures:
        """The figures for a report or an ack."""
        if self._figures is None:
            self._figures = _FiguresSent(self._clock, self._full_report_interval_s)
        return self._figures.next(self._state.demand(), whole=False)

    @staticmethod
    async def _write(
        stream: ControlStream, writes: asyncio.Lock, message: gateway_pb2.GatewayMessage
    ) -> None:
        # grpc.aio allows one write in flight per call; acks and reports come from two tasks.
        async with writes:
            await stream.write(message)


@dataclass(frozen=True, slots=True)
class _Figures:
    """Figures to send, in the form the control plane reads: as one message a tenant, or as
    columns once it has said it reads them (TenantDirectory.reads_demand_columns)."""

    tenants: list[common_pb2.TenantDemand]
    columns: common_pb2.TenantDemandColumns | None
    delta: bool


class _FiguresSent:
    """The figures the control plane holds of this gateway on one stream, so that a report or
    an ack carries only what changed (DemandReport.delta), and every tenant's figures at least
    every `full_interval_s`."""

    def __init__(self, clock: Clock, full_interval_s: float) -> None:
        self._clock = clock
        self._full_interval_s = full_interval_s
        self._held: dict[str, TenantDemand] = {}
        self._whole_due_s = 0.0
        self.columns = False
        """Whether the control plane on this stream reads columns (its directory said so)."""

    def next(self, demand: list[TenantDemand], *, whole: bool) -> _Figures:
        """What to send of `demand` now, and whether it is a delta (only the changed figures)."""
        now = self._clock.monotonic()
        if whole or now >= self._whole_due_s:
            self._held = {d.tenant: d for d in demand}
            self._whole_due_s = now + self._full_interval_s
            return self._as_sent(demand, delta=False)
        changed = [d for d in demand if self._held.get(d.tenant) != d]
        for figures in changed:
            self._held[figures.tenant] = figures
        return self._as_sent(changed, delta=True)

    def _as_sent(self, demand: list[TenantDemand], *, delta: bool) -> _Figures:
        if self.columns:
            return _Figures([], demand_columns_to_proto(demand), delta)
        return _Figures([demand_to_proto(d) for d in demand], None, delta)
