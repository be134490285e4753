"""A test GatewayService: records what each gateway connection sends, pushes updates."""

from __future__ import annotations

from collections.abc import AsyncIterator
from dataclasses import dataclass, field

import grpc

from slotshift.v1 import allocation_pb2, common_pb2, gateway_pb2, gateway_pb2_grpc
from tests.support import tenant_figures


@dataclass
class Session:
    """One Connect call as the control plane saw it."""

    context: grpc.aio.ServicerContext[gateway_pb2.GatewayMessage, gateway_pb2.ControlMessage]
    received: list[gateway_pb2.GatewayMessage] = field(default_factory=list)

    def of_kind(self, kind: str) -> list[gateway_pb2.GatewayMessage]:
        return [m for m in self.received if m.WhichOneof("kind") == kind]

    def held(self) -> dict[str, common_pb2.TenantDemand]:
        """Each tenant's figures as the control plane holds them after every message so far:
        a hello or a whole report replaces them all, a delta only the tenants it names."""
        figures: dict[str, common_pb2.TenantDemand] = {}
        for message in self.received:
            if message.HasField("hello"):
                figures = {t.tenant: t for t in tenant_figures(message.hello)}
                continue
            carrier = message.demand if message.HasField("demand") else message.ack
            if not carrier.delta:
                figures = {}
            figures.update({t.tenant: t for t in tenant_figures(carrier)})
        return figures

    async def push(self, version: int, gateway_id: str = "gw-1", **limits: tuple[int, int]) -> None:
        """Send an AllocationUpdate; limits: tenant=(target_slots, limit_slots)."""
        await self.context.write(update(version, gateway_id, **limits))


def update(
    version: int, gateway_id: str = "gw-1", **limits: tuple[int, int]
) -> gateway_pb2.ControlMessage:
    """An AllocationUpdate for pool p; limits: tenant=(target_slots, limit_slots)."""
    allocation = gateway_pb2.AllocationUpdate(
        pool="p",
        gateway_id=gateway_id,
        version=version,
        budget_slots=8,
        tenants=[
            allocation_pb2.GatewayTenantLimit(tenant=t, target_slots=target, limit_slots=limit)
            for t, (target, limit) in limits.items()
        ],
    )
    return gateway_pb2.ControlMessage(allocation=allocation)


class FakeControlPlane(gateway_pb2_grpc.GatewayServiceServicer):
    """Records what each connection sends; tests push updates through `Session.push`."""

    def __init__(self, *, hang_up_with: gateway_pb2.ControlMessage | None = None) -> None:
        self.sessions: list[Session] = []
        self.hang_up_with = hang_up_with
        """If set, each connection gets this message after the hello and is then ended."""

    async def Connect(  # type: ignore[override]
        self,
        request_iterator: AsyncIterator[gateway_pb2.GatewayMessage],
        context: grpc.aio.ServicerContext[gateway_pb2.GatewayMessage, gateway_pb2.ControlMessage],
    ) -> None:
        session = Session(context)
        self.sessions.append(session)
        async for message in request_iterator:
            session.received.append(message)
            if self.hang_up_with is not None:
                await context.write(self.hang_up_with)
                return


async def serve(fake: FakeControlPlane, port: int = 0) -> tuple[grpc.aio.Server, int]:
    server = grpc.aio.server()
    gateway_pb2_grpc.add_GatewayServiceServicer_to_server(fake, server)
    bound = server.add_insecure_port(f"127.0.0.1:{port}")
    await server.start()
    return server, bound
