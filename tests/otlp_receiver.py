"""A real OTLP/gRPC trace receiver for tests: what Jaeger or the OpenTelemetry Collector take on
port 4317, keeping every span it is sent, in a plain form tests can query.

`OtlpReceiver` runs on the test's own event loop; `ReceiverThread` runs one on a loop of its own,
for tests that drive real processes with blocking calls.
"""

from __future__ import annotations

import asyncio
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import Future
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

import grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc
from opentelemetry.proto.common.v1 import common_pb2
from opentelemetry.proto.trace.v1 import trace_pb2

from tests.support import wait_until_sync

_KINDS = {
    trace_pb2.Span.SPAN_KIND_INTERNAL: "internal",
    trace_pb2.Span.SPAN_KIND_SERVER: "server",
    trace_pb2.Span.SPAN_KIND_CLIENT: "client",
    trace_pb2.Span.SPAN_KIND_PRODUCER: "producer",
    trace_pb2.Span.SPAN_KIND_CONSUMER: "consumer",
}


@dataclass(frozen=True)
class ReceivedLink:
    trace_id: str
    span_id: str
    attributes: dict[str, Any]


@dataclass(frozen=True)
class ReceivedSpan:
    """One span as exported; ids are lower-case hex, as in W3C traceparent."""

    service: str
    name: str
    kind: str
    trace_id: str
    span_id: str
    parent_span_id: str
    """Empty for a root span."""
    attributes: dict[str, Any]
    links: list[ReceivedLink] = field(default_factory=list)
    status_error: bool = False


def _value(value: common_pb2.AnyValue) -> Any:
    kind = value.WhichOneof("value")
    if kind == "array_value":
        return [_value(v) for v in value.array_value.values]
    if kind is None:
        return None
    return getattr(value, kind)


def _attributes(pairs: Any) -> dict[str, Any]:
    return {pair.key: _value(pair.value) for pair in pairs}


class OtlpReceiver(trace_service_pb2_grpc.TraceServiceServicer):
    """TraceService/Export on 127.0.0.1, port 0; `spans()` is everything received so far."""

    def __init__(self) -> None:
        self._spans: list[ReceivedSpan] = []
        self._lock = threading.Lock()
        self._server: grpc.aio.Server | None = None
        self.port = 0

    @property
    def endpoint(self) -> str:
        """What OTEL_EXPORTER_OTLP_ENDPOINT should say to export here."""
        return f"http://127.0.0.1:{self.port}"

    async def start(self) -> None:
        server = grpc.aio.server()
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(  # type: ignore[no-untyped-call]
            self, server
        )
        self.port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        self._server = server

    async def stop(self) -> None:
        if self._server is not None:
            await self._server.stop(None)
            self._server = None

    async def Export(
        self,
        request: trace_service_pb2.ExportTraceServiceRequest,
        context: grpc.aio.ServicerContext[object, object],
    ) -> trace_service_pb2.ExportTraceServiceResponse:
        received = []
        for resource_spans in request.resource_spans:
            service = str(_attributes(resource_spans.resource.attributes).get("service.name", ""))
            for scope_spans in resource_spans.scope_spans:
                for span in scope_spans.spans:
                    received.append(
                        ReceivedSpan(
                            service=service,
                            name=span.name,
                            kind=_KINDS.get(span.kind, "unspecified"),
                            trace_id=span.trace_id.hex(),
                            span_id=span.span_id.hex(),
                            parent_span_id=span.parent_span_id.hex(),
                            attributes=_attributes(span.attributes),
                            links=[
                                ReceivedLink(
                                    link.trace_id.hex(),
                                    link.span_id.hex(),
                                    _attributes(link.attributes),
                                )
                                for link in span.links
                            ],
                            status_error=span.status.code == trace_pb2.Status.STATUS_CODE_ERROR,
                        )
                    )
        with self._lock:
            self._spans.extend(received)
        return trace_service_pb2.ExportTraceServiceResponse()

    def spans(
        self, predicate: Callable[[ReceivedSpan], bool] = lambda _: True
    ) -> list[ReceivedSpan]:
        """The spans received so far that satisfy `predicate`, in arrival order."""
        with self._lock:
            received = list(self._spans)
        return [span for span in received if predicate(span)]


class ReceiverThread:
    """An OtlpReceiver on an event loop in a thread of its own (for blocking, process-driving
    tests); `receiver.spans()` is safe to call from the test's thread."""

    def __init__(self) -> None:
        self.receiver = OtlpReceiver()
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="otlp-receiver", daemon=True
        )

    def _call(self, coroutine: Any) -> None:
        done: Future[None] = asyncio.run_coroutine_threadsafe(coroutine, self._loop)
        done.result(timeout=10)

    def start(self) -> None:
        self._thread.start()
        self._call(self.receiver.start())

    def stop(self) -> None:
        self._call(self.receiver.stop())
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join(timeout=10)
        self._loop.close()


@contextmanager
def receiver_thread() -> Iterator[OtlpReceiver]:
    """A receiver running in its own thread for the duration of the block."""
    thread = ReceiverThread()
    thread.start()
    try:
        yield thread.receiver
    finally:
        thread.stop()


def wait_for_spans(
    receiver: OtlpReceiver,
    predicate: Callable[[ReceivedSpan], bool],
    *,
    timeout_s: float = 10.0,
    message: str = "spans",
) -> list[ReceivedSpan]:
    """Poll until the receiver holds a span satisfying `predicate`; returns all that do."""
    wait_until_sync(lambda: bool(receiver.spans(predicate)), timeout_s=timeout_s, message=message)
    return receiver.spans(predicate)
