"""slotshift.trace_context: W3C context in string maps, gRPC metadata and HTTP headers."""

from __future__ import annotations

import pytest
from multidict import CIMultiDict
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider

from slotshift.trace_context import (
    carrier_from_grpc_metadata,
    carrier_of,
    grpc_metadata,
    inject_into,
    parent_from,
    span_context_from,
    traceparent_of,
)

TRACE_ID = 0x0AF7651916CD43DD8448EB211C80319C
SPAN_ID = 0xB7AD6B7169203331
TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


def _parent(span: trace.Span) -> trace.SpanContext | None:
    assert isinstance(span, ReadableSpan)
    return span.parent


@pytest.fixture
def tracer() -> trace.Tracer:
    return TracerProvider(shutdown_on_exit=False).get_tracer("test")


def test_a_carrier_names_the_span_and_makes_it_the_parent_elsewhere(tracer: trace.Tracer) -> None:
    span = tracer.start_span("sender")
    carrier = carrier_of(span)
    context = span.get_span_context()
    flags = int(context.trace_flags)
    assert carrier == {
        "traceparent": f"00-{context.trace_id:032x}-{context.span_id:016x}-{flags:02x}"
    }
    child = tracer.start_span("receiver", context=parent_from(carrier))
    parent = _parent(child)
    assert parent is not None
    assert parent.span_id == context.span_id
    assert parent.is_remote
    assert child.get_span_context().trace_id == context.trace_id


def test_an_empty_or_broken_carrier_starts_a_new_trace(tracer: trace.Tracer) -> None:
    for carrier in ({}, {"traceparent": "garbage"}, {"traceparent": "00-" + "0" * 32 + "-1-01"}):
        assert span_context_from(carrier) is None
        assert _parent(tracer.start_span("root", context=parent_from(carrier))) is None


def test_span_context_from_reads_headers_in_any_case() -> None:
    span_context = span_context_from({"TraceParent": TRACEPARENT, "tracestate": "vendor=1"})
    assert span_context is not None
    assert (span_context.trace_id, span_context.span_id) == (TRACE_ID, SPAN_ID)
    assert span_context.trace_state.get("vendor") == "1"
    assert traceparent_of(span_context) == TRACEPARENT


def test_an_invalid_span_has_no_carrier() -> None:
    assert carrier_of(trace.INVALID_SPAN) == {}


def test_inject_replaces_the_clients_trace_headers(tracer: trace.Tracer) -> None:
    headers: CIMultiDict[str] = CIMultiDict(
        [("Traceparent", TRACEPARENT), ("tracestate", "client=1"), ("Accept", "text/plain")]
    )
    span = tracer.start_span("upstream")
    inject_into(headers, span)
    assert headers.getall("traceparent") == [carrier_of(span)["traceparent"]]
    assert "tracestate" not in headers, "the client's tracestate belongs to another parent"
    assert headers["Accept"] == "text/plain"


def test_inject_leaves_the_headers_alone_without_a_valid_span() -> None:
    headers: CIMultiDict[str] = CIMultiDict([("traceparent", TRACEPARENT)])
    inject_into(headers, trace.INVALID_SPAN)
    assert headers.getall("traceparent") == [TRACEPARENT]


def test_grpc_metadata_round_trip_keeps_only_w3c_entries() -> None:
    metadata = grpc_metadata({"traceparent": TRACEPARENT, "tracestate": "a=b"})
    assert metadata == (("traceparent", TRACEPARENT), ("tracestate", "a=b"))
    received: list[tuple[str, str | bytes]] = [
        *metadata,
        ("user-agent", "grpc-python"),
        ("bin-bin", b"\x00"),
    ]
    assert carrier_from_grpc_metadata(received) == {"traceparent": TRACEPARENT, "tracestate": "a=b"}
    assert carrier_from_grpc_metadata(None) == {}
