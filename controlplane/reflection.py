"""gRPC server reflection in both versions grpcurl speaks: v1alpha (grpcurl < 1.9) and v1.

grpcio-reflection serves only v1alpha; v1's messages are the same on the wire, field for field,
so the same servicer also answers under v1's service name.
"""

from __future__ import annotations

from collections.abc import Sequence

import grpc
from grpc_reflection.v1alpha import reflection, reflection_pb2, reflection_pb2_grpc

V1_SERVICE = "grpc.reflection.v1.ServerReflection"
V1ALPHA_SERVICE = reflection.SERVICE_NAME


def add_reflection(server: grpc.aio.Server, service_names: Sequence[str]) -> None:
    """Serve reflection for `service_names` (plus both reflection services) on `server`."""
    names = (*service_names, V1ALPHA_SERVICE, V1_SERVICE)
    # `aio` is set only when grpc.aio imports, so the stubs do not declare it.
    servicer = reflection.aio.ReflectionServicer(names)  # type: ignore[attr-defined]
    reflection_pb2_grpc.add_ServerReflectionServicer_to_server(servicer, server)
    v1 = grpc.method_handlers_generic_handler(
        V1_SERVICE,
        {
            "ServerReflectionInfo": grpc.stream_stream_rpc_method_handler(
                servicer.ServerReflectionInfo,
                request_deserializer=reflection_pb2.ServerReflectionRequest.FromString,
                response_serializer=reflection_pb2.ServerReflectionResponse.SerializeToString,
            )
        },
    )
    server.add_generic_rpc_handlers((v1,))
