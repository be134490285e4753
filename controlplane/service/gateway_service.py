"""GatewayService: the long-lived stream on which gateways report and allocations are pushed."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Mapping

import grpc
from opentelemetry import trace

from controlplane.pool_state import Delivery, GatewaySession, PoolState
from controlplane.service import convert
from slotshift.demand import TenantDemand
from slotshift.trace_context import (
    DECISION_TRACEPARENT,
    carrier_from_grpc_metadata,
    carrier_of,
    parent_from,
)
from slotshift.v1 import gateway_pb2, gateway_pb2_grpc
from slotshift.wire import demand_from_proto, from_timestamp

AckObserver = Callable[[str, float], None]
"""Called with (pool, seconds from publishing a version to the gateway's acknowledgement)."""


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
    ) -> None:
        self._pools = pools
        self._on_ack = on_ack
        self._tracer = tracer if tracer is not None else trace.NoOpTracer()

    # Written with context.write rather than as a generator, so that reading and writing run
    # side by side; the generated base class only knows the generator form.
    async def Connect(  # type: ignore[override]
        self,
        request_iterator: AsyncIterator[gateway_pb2.GatewayMessage],
        context: grpc.aio.ServicerContext[object, object],
    ) -> None:
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
        state = self._pools.get(hello.pool)
        if state is None:
            await context.abort(
                grpc.StatusCode.NOT_FOUND,
                f"hello.pool: no pool {hello.pool!r} (known: {sorted(self._pools)})",
            )
        assert state is not None  # abort raises; this tells the type checker
        with self._tracer.start_as_current_span(
            "gateway.connect",
            context=parent_from(carrier_from_grpc_metadata(context.invocation_metadata())),
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
        reader = asyncio.create_task(
            self._read(state, session, request_iterator),
            name=f"gateway-reader/{hello.gateway_id}",
        )
        writer = asyncio.create_task(
            self._write(state, session, context), name=f"gateway-writer/{hello.gateway_id}"
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
                )
            elif kind == "ack":
                ack = message.ack
                latency = state.record_ack(
                    session, ack.version, _demands(ack), observed_at_wall_s=_observed_at(ack)
                )
                if latency is not None and self._on_ack is not None:
                    self._on_ack(state.pool.name, latency)
            # A second hello on the same stream, or a kind this version does not know, is ignored:
            # newer gateways may send more.

    async def _write(
        self,
        state: PoolState,
        session: GatewaySession,
        context: grpc.aio.ServicerContext[object, object],
    ) -> None:
        while (delivery := await session.mailbox.take()) is not None:
            directory, session.directory = session.directory, None
            if directory is not None:
                # Before the allocation, so that the gateway knows every tenant it names.
                await context.write(
                    gateway_pb2.ControlMessage(tenants=convert.directory_to_proto(directory))
                )
            await self._push(delivery, session.gateway_id, context)

    async def _push(
        self,
        delivery: Delivery,
        gateway_id: str,
        context: grpc.aio.ServicerContext[object, object],
    ) -> None:
        allocation = delivery.allocation
        update = gateway_pb2.AllocationUpdate(
            pool=allocation.pool,
            gateway_id=gateway_id,
            version=allocation.version,
            decision_id=allocation.decision_id,
            budget_slots=allocation.budget_slots,
            tenants=convert.gateway_limits_to_proto(allocation, gateway_id),
        )
        attributes: dict[str, str | int] = {
            "slotshift.pool": allocation.pool,
            "slotshift.gateway.id": gateway_id,
            "slotshift.allocation.version": allocation.version,
            "slotshift.decision.id": allocation.decision_id,
        }
        for limit in update.tenants:
            attributes[f"slotshift.allocation.{limit.tenant}.limit_slots"] = limit.limit_slots
            attributes[f"slotshift.allocation.{limit.tenant}.target_slots"] = limit.target_slots
        with self._tracer.start_as_current_span(
            "allocation.push",
            context=parent_from(delivery.cause),
            kind=trace.SpanKind.PRODUCER,
            attributes=attributes,
        ) as span:
            update.trace_context.update(carrier_of(span))
            decision = delivery.decision.get("traceparent")
            if decision:
                update.trace_context[DECISION_TRACEPARENT] = decision
            await context.write(gateway_pb2.ControlMessage(allocation=update))


_Figures = gateway_pb2.GatewayHello | gateway_pb2.DemandReport | gateway_pb2.AllocationAck
"""The gateway messages that carry its figures."""


def _demands(message: _Figures) -> list[TenantDemand]:
    return [demand_from_proto(t) for t in message.tenants]


def _observed_at(message: _Figures) -> float | None:
    """When the gateway observed the message's figures; None when it does not say (the pool's
    state then never drops them as old)."""
    return from_timestamp(message.observed_at) if message.HasField("observed_at") else None
