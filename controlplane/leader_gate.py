"""Calls only the leader answers: on a follower they are refused with UNAVAILABLE, so that a
gateway, an agent or an admin client moves on to the leader (or retries).

The leader-only calls are every method of GatewayService and TelemetryService (the streams that
report demand and receive budget) and AdminService's changes (only the leader applies them to
the pools it runs; GetPoolConfig is a read). AllocationService's queries and gRPC health are
answered by every replica. gRPC health says the same per service (controlplane/server.py): a
follower reports NOT_SERVING for GatewayService, TelemetryService and AdminService.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable
from typing import Any

import grpc

from slotshift.v1 import admin_pb2, gateway_pb2, telemetry_pb2

LEADER_SERVICES = (
    gateway_pb2.DESCRIPTOR.services_by_name["GatewayService"].full_name,
    telemetry_pb2.DESCRIPTOR.services_by_name["TelemetryService"].full_name,
    admin_pb2.DESCRIPTOR.services_by_name["AdminService"].full_name,
)
"""The services a follower reports NOT_SERVING for."""

_ANSWERED_BY_ANY = frozenset(
    {f"/{admin_pb2.DESCRIPTOR.services_by_name['AdminService'].full_name}/GetPoolConfig"}
)

REFUSAL = "this control-plane replica is a follower: the leader serves this call"
"""The UNAVAILABLE status's message."""


class LeaderGate(grpc.aio.ServerInterceptor):  # type: ignore[type-arg]  # not generic at run time
    """Refuses the leader-only calls (module docstring) while `leading()` is False."""

    def __init__(self, leading: Callable[[], bool]) -> None:
        self._leading = leading

    async def intercept_service(
        self,
        continuation: Callable[
            [grpc.HandlerCallDetails], Awaitable[grpc.RpcMethodHandler[Any, Any]]
        ],
        handler_call_details: grpc.HandlerCallDetails,
    ) -> grpc.RpcMethodHandler[Any, Any]:
        handler = await continuation(handler_call_details)
        method: str = handler_call_details.method
        if handler is None or self._leading() or not _leader_only(method):
            return handler
        return refusing(handler, grpc.StatusCode.UNAVAILABLE, REFUSAL)


def _leader_only(method: str) -> bool:
    if method in _ANSWERED_BY_ANY:
        return False
    service = method.lstrip("/").split("/", 1)[0]
    return service in LEADER_SERVICES


def refusing(
    handler: grpc.RpcMethodHandler[Any, Any], code: grpc.StatusCode, details: str
) -> grpc.RpcMethodHandler[Any, Any]:
    """A handler of the same shape as `handler` (unary or streaming, the same serializers) that
    refuses every call with `code` and `details`, before the servicer sees it (what a server
    interceptor returns in place of the call's handler)."""

    async def refuse(_request: Any, context: grpc.aio.ServicerContext[Any, Any]) -> None:
        await context.abort(code, details)

    serializers = {
        "request_deserializer": handler.request_deserializer,
        "response_serializer": handler.response_serializer,
    }
    if handler.request_streaming and handler.response_streaming:
        return grpc.stream_stream_rpc_method_handler(refuse, **serializers)
    if handler.request_streaming:
        return grpc.stream_unary_rpc_method_handler(refuse, **serializers)
    if handler.response_streaming:
        return grpc.unary_stream_rpc_method_handler(refuse, **serializers)
    return grpc.unary_unary_rpc_method_handler(refuse, **serializers)
