"""GatewayService: the long-lived stream on which gateways report and allocations are pushed."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Mapping
from typing import Protocol

import grpc
from opentelemetry import trace

from controlplane.core.allocation import Allocation
from controlplane.core.push import GatewayRow, Push, PushSlots, Waiting, next_push
from controlplane.core.stream_identity import StreamRole
from controlplane.pool_state import PoolState
from controlplane.registry import Delivery, GatewaySession
from controlplane.service import convert
from controlplane.service.stream_guard import StreamGuard
from controlplane.token_ledger import TokenCount
from slotshift.clock import Clock, SystemClock
from slotshift.demand_columns import DemandColumns
from slotshift.trace_context import (
    DECISION_TRACEPARENT,
    carrier_from_grpc_metadata,
    carrier_of,
    parent_from,
)
from slotshift.v1 import gateway_pb2, gateway_pb2_grpc
from slotshift.wire import demand_columns_from_proto, from_timestamp

AckObserver = Callable[[str, float], None]
"""Called with (pool, seconds from publishing a version to the gateway's acknowledgement)."""


class UpdateSink(Protocol):
    """Where one gateway's stream writes: the gRPC call's servicer context, or any other
    ordered stream of `ControlMessage`s (the deterministic twin's in-memory one)."""

    async def write(self, message: gateway_pb2.ControlMessage) -> None:
        """Send `message` to the gateway; one write at a time (the writer never overlaps
        them)."""


class GatewayStreamService(gateway_pb2_grpc.GatewayServiceServicer):
    """One Connect call per gateway connection: a reader takes reports and acknowledgements into
    the pool's state; a writer sends every allocation that lands in the session's mailbox. When
    either side ends, the other is stopped and the gateway is marked disconnected.

    Traces: the hello is handled in a "gateway.connect" span, the child of the gateway's own
    connect span when the call's metadata carries its traceparent; each allocation sent is an
    "allocation.push" span, the child of what published it (a decision, a connection), whose
    context travels in `AllocationUpdate.trace_context` to the gateway.
    """

    def __init__(
        self,
        pools: Mapping[str, PoolState],
        on_ack: AckObserver | None = None,
        *,
        tracer: trace.Tracer | None = None,
        clock: Clock | None = None,
        push_min_interval_s: float = 0.0,
        guard: StreamGuard | None = None,
    ) -> None:
        """guard: who may call Connect (checked before the hello is read, and the hello's pool
        before anything is sent); None lets every caller in, for a service that no network
        reaches (unit tests; the twin calls `serve` directly)."""
        self._pools = pools
        self._guard = guard
        self._on_ack = on_ack
        self._tracer = tracer if tracer is not None else trace.NoOpTracer()
        self._tracing = not isinstance(self._tracer, trace.NoOpTracer)
        """Whether pushes are traced; without, a push carries its cause's context as it is (what
        a no-op span would carry) and costs no span."""
        self._clock = clock or SystemClock()
        self._push_min_interval_s = push_min_interval_s
        self.epoch = 0
        """The leader epoch every update carries (AllocationUpdate.epoch): set by the control
        plane when its replica takes the lease (controlplane/leadership.py); 0 without one."""

    # Written with context.write rather than as a generator, so that reading and writing run
    # side by side; the generated base class only knows the generator form.
    async def Connect(  # type: ignore[override]
        self,
        request_iterator: AsyncIterator[gateway_pb2.GatewayMessage],
        context: grpc.aio.ServicerContext[object, object],
    ) -> None:
        guard = self._guard
        peer = None if guard is None else await guard.admit(context, StreamRole.GATEWAY)
        first = await anext(request_iterator, None)
        if first is None:
            return
        if not first.HasField("hello"):
            await context.abort(
                grpc.StatusCode.INVALID_ARGUMENT, "hello: the first message must be a hello"
            )
        hello = first.hello
        if not hello.gateway_id:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, "hello.gateway_id: required")
        if guard is not None and peer is not None:
            # Before the pool is looked up: a peer not allowed there learns nothing of it.
            await guard.admit_pools(context, peer, (hello.pool,))
        state = self._pools.get(hello.pool)
        if state is None:
            await context.abort(
                grpc.StatusCode.NOT_FOUND,
                f"hello.pool: no pool {hello.pool!r} (known: {sorted(self._pools)})",
            )
        assert state is not None  # abort raises; this tells the type checker
        await self.serve(
            state,
            hello,
            request_iterator,
            context,
            parent=carrier_from_grpc_metadata(context.invocation_metadata()),
        )

    async def serve(
        self,
        state: PoolState,
        hello: gateway_pb2.GatewayHello,
        messages: AsyncIterator[gateway_pb2.GatewayMessage],
        sink: UpdateSink,
        *,
        parent: Mapping[str, str] | None = None,
    ) -> None:
        """One gateway's stream after its (valid) hello, until it ends: the gateway connects to
        `state`, its reports and acknowledgements are read from `messages`, and what lands in
        its session's mailbox is written to `sink`; when either side ends, the other is stopped
        and the gateway is marked disconnected. `parent` (W3C) is the gateway's connect span.
        Connect runs it on a gRPC call; the twin on an in-memory stream."""
        with self._tracer.start_as_current_span(
            "gateway.connect",
            context=parent_from(parent or {}),
            kind=trace.SpanKind.SERVER,
            attributes={
                "slotshift.pool": hello.pool,
                "slotshift.gateway.id": hello.gateway_id,
                "slotshift.allocation.applied_version": hello.applied_version,
            },
        ) as span:
            session = state.connect_gateway(
                hello.gateway_id,
                hello.applied_version,
                _demands(hello),
                observed_at_wall_s=_observed_at(hello),
                trace_context=carrier_of(span),
            )
            state.record_tokens(session, _tokens(hello))
        reader = asyncio.create_task(
            self._read(state, session, messages),
            name=f"gateway-reader/{hello.gateway_id}",
        )
        writer = asyncio.create_task(
            self._write(state, session, sink), name=f"gateway-writer/{hello.gateway_id}"
        )
        try:
            done, _ = await asyncio.wait({reader, writer}, return_when=asyncio.FIRST_COMPLETED)
            for task in done:
                task.result()  # re-raises what ended it
        finally:
            for task in (reader, writer):
                task.cancel()
            await asyncio.gather(reader, writer, return_exceptions=True)
            state.disconnect_gateway(session)

    async def _read(
        self,
        state: PoolState,
        session: GatewaySession,
        messages: AsyncIterator[gateway_pb2.GatewayMessage],
    ) -> None:
        async for message in messages:
            kind = message.WhichOneof("kind")
            if kind == "demand":
                report = message.demand
                state.record_demand(
                    session,
                    report.applied_version,
                    _demands(report),
                    observed_at_wall_s=_observed_at(report),
                    delta=report.delta,
                )
                if not report.delta:
                    state.record_tokens(session, _tokens(report))
            elif kind == "ack":
                ack = message.ack
                latency = state.record_ack(
                    session,
                    ack.version,
                    _demands(ack),
                    observed_at_wall_s=_observed_at(ack),
                    delta=ack.delta,
                )
                if not ack.delta:
                    state.record_tokens(session, _tokens(ack))
                if latency is not None and self._on_ack is not None:
                    self._on_ack(state.pool.name, latency)
            # A second hello on the same stream, or a kind this version does not know, is ignored:
            # newer gateways may send more.

    async def _write(
        self,
        state: PoolState,
        session: GatewaySession,
        sink: UpdateSink,
    ) -> None:
        """Send what lands in the session's mailbox: the first update whole, then only what
        changed; one that may wait (core/push.py) waits for the gateway's next push slot
        (PushSlots), and goes out carrying the newest limits then. An urgent one goes at once
        and takes the next slot."""
        pushed: GatewayRow | None = None
        slots = PushSlots(self._push_min_interval_s)
        mailbox = session.mailbox
        while (delivery := await mailbox.take()) is not None:
            target = _row_of(delivery, session.gateway_id)
            if target is None:
                continue  # not this gateway's any more (it reconnected elsewhere)
            push = next_push(pushed, target, _waiting(state, session.gateway_id, target))
            # A change that may wait is held until the gateway's next push slot; whatever comes
            # meanwhile replaces it (and may be urgent: then it goes at once). The same
            # allocation comes again when requests start to queue at the gateway
            # (PoolState._queue_started): what was held may be waited for now.
            # A new directory (a key added or revoked) goes out even with no limit moved.
            if push.columns is not None and push.columns.size == 0 and session.directory is None:
                continue
            while not push.urgent and self._clock.monotonic() < slots.free_at_s:
                await mailbox.wait_ready(slots.free_at_s - self._clock.monotonic())
                if mailbox.closed:
                    return
                newer = mailbox.take_nowait()
                newer_target = None if newer is None else _row_of(newer, session.gateway_id)
                if newer is not None and newer_target is not None:
                    delivery, target = newer, newer_target
                    push = next_push(pushed, target, _waiting(state, session.gateway_id, target))
            if push.columns is not None and push.columns.size == 0 and session.directory is None:
                continue  # nothing new for this gateway (an update looked at again)
            directory, session.directory = session.directory, None
            if directory is not None:
                # Before the allocation, so that the gateway knows every tenant it names.
                await sink.write(
                    gateway_pb2.ControlMessage(tenants=convert.directory_to_proto(directory))
                )
            await self._push(delivery, session.gateway_id, target, push, sink)
            pushed = target
            slots.took(self._clock.monotonic())

    async def _push(
        self,
        delivery: Delivery,
        gateway_id: str,
        target: GatewayRow,
        push: Push,
        sink: UpdateSink,
    ) -> None:
        allocation = delivery.allocation
        update = gateway_pb2.AllocationUpdate(
            pool=allocation.pool,
            gateway_id=gateway_id,
            version=allocation.version,
            decision_id=allocation.decision_id,
            budget_slots=allocation.budget_slots,
            tenants=convert.row_to_proto(target, push.columns),
            delta=push.columns is not None,
            epoch=self.epoch,
        )
        decision = delivery.decision.get("traceparent")
        if decision:
            update.trace_context[DECISION_TRACEPARENT] = decision
        if not self._tracing:
            update.trace_context.update(delivery.cause)
            await sink.write(gateway_pb2.ControlMessage(allocation=update))
            return
        with self._tracer.start_as_current_span(
            "allocation.push",
            context=parent_from(delivery.cause),
            kind=trace.SpanKind.PRODUCER,
        ) as span:
            if span.is_recording():
                # Per tenant only what this update names: a whole pool's worth of attributes on
                # every push would cost more than the push.
                span.set_attributes(_push_attributes(allocation, gateway_id, update))
            update.trace_context.update(carrier_of(span))
            await sink.write(gateway_pb2.ControlMessage(allocation=update))


def _row_of(delivery: Delivery, gateway_id: str) -> GatewayRow | None:
    cells = delivery.allocation.cells
    row = cells.row(gateway_id)
    return None if row is None else GatewayRow.of(cells, row)


def _waiting(state: PoolState, gateway_id: str, target: GatewayRow) -> Waiting | None:
    """Who waits for slots at `gateway_id`, in `target`'s columns; None when they differ (the
    pool's tenants just changed)."""
    if state.tenants != target.tenants:
        return None
    return state.waiting_at(gateway_id)


def _push_attributes(
    allocation: Allocation, gateway_id: str, update: gateway_pb2.AllocationUpdate
) -> dict[str, str | int | bool]:
    attributes: dict[str, str | int | bool] = {
        "slotshift.pool": allocation.pool,
        "slotshift.gateway.id": gateway_id,
        "slotshift.allocation.version": allocation.version,
        "slotshift.decision.id": allocation.decision_id,
        "slotshift.allocation.delta": update.delta,
    }
    for limit in update.tenants:
        attributes[f"slotshift.allocation.{limit.tenant}.limit_slots"] = limit.limit_slots
        attributes[f"slotshift.allocation.{limit.tenant}.target_slots"] = limit.target_slots
    return attributes


_Figures = gateway_pb2.GatewayHello | gateway_pb2.DemandReport | gateway_pb2.AllocationAck
"""The gateway messages that carry its figures."""


def _demands(message: _Figures) -> DemandColumns:
    return demand_columns_from_proto(message)


def _tokens(message: _Figures) -> list[TokenCount]:
    return [
        TokenCount(t.tenant, t.model, t.prompt_tokens_total, t.completion_tokens_total)
        for t in message.tokens
    ]


def _observed_at(message: _Figures) -> float | None:
    """When the gateway observed the message's figures; None when it does not say."""
    return from_timestamp(message.observed_at) if message.HasField("observed_at") else None
