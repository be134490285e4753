"""GatewayService: the long-lived stream on which gateways report and allocations are pushed."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Callable, Mapping

import grpc

from controlplane.pool_state import GatewaySession, PoolState
from controlplane.service import convert
from slotshift.v1 import gateway_pb2, gateway_pb2_grpc

AckObserver = Callable[[str, float], None]
"""Called with (pool, seconds from publishing a version to the gateway's acknowledgement)."""


class GatewayStreamService(gateway_pb2_grpc.GatewayServiceServicer):
    """One Connect call per gateway connection: a reader takes reports and acknowledgements into
    the pool's state; a writer sends every allocation that lands in the session's mailbox. When
    either side ends, the other is stopped and the gateway is marked disconnected."""

    def __init__(self, pools: Mapping[str, PoolState], on_ack: AckObserver | None = None) -> None:
        self._pools = pools
        self._on_ack = on_ack

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
        known = {t.name for t in state.pool.tenants}
        session = state.connect_gateway(
            hello.gateway_id, hello.applied_version, convert.usage_from_proto(hello.tenants, known)
        )
        reader = asyncio.create_task(
            self._read(state, session, request_iterator, known),
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
        known: set[str],
    ) -> None:
        async for message in messages:
            kind = message.WhichOneof("kind")
            if kind == "demand":
                demand = message.demand
                state.record_demand(
                    session, demand.applied_version, convert.usage_from_proto(demand.tenants, known)
                )
            elif kind == "ack":
                ack = message.ack
                latency = state.record_ack(
                    session, ack.version, convert.usage_from_proto(ack.tenants, known)
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
        while (allocation := await session.mailbox.get()) is not None:
            update = gateway_pb2.AllocationUpdate(
                pool=allocation.pool,
                gateway_id=session.gateway_id,
                version=allocation.version,
                decision_id=allocation.decision_id,
                budget_slots=allocation.budget_slots,
                tenants=convert.gateway_limits_to_proto(allocation, session.gateway_id),
            )
            await context.write(gateway_pb2.ControlMessage(allocation=update))
