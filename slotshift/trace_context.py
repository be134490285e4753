"""W3C trace context in the places slotshift carries it: string maps in protobuf messages
(`AllocationUpdate.trace_context`, `TelemetryReport.trace_context`), gRPC metadata, HTTP headers.

A carrier is a plain `{"traceparent": ..., "tracestate": ...}` map: services store and send it
without knowing OpenTelemetry, and turn it back into a parent context or a span link here.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, MutableMapping

from opentelemetry import trace
from opentelemetry.context import Context
from opentelemetry.trace.propagation.tracecontext import TraceContextTextMapPropagator

DECISION_TRACEPARENT = "slotshift-decision-traceparent"
"""Key of `AllocationUpdate.trace_context` that holds the traceparent of the decision whose tenant
limits the update carries (`traceparent` itself is the push's, the parent of the gateway's
"allocation.apply" span). A gateway links the requests it admits under the update to it."""

_W3C = TraceContextTextMapPropagator()
# Stateless: it only knows how to read and write the two W3C headers.

_W3C_KEYS = frozenset(_W3C.fields)


def carrier_of(span: trace.Span) -> dict[str, str]:
    """The W3C headers that make `span` the parent of work elsewhere; empty if it has no valid
    context (tracing off and no incoming context)."""
    carrier: dict[str, str] = {}
    _W3C.inject(carrier, context=trace.set_span_in_context(span))
    return carrier


def inject_into(headers: MutableMapping[str, str], span: trace.Span) -> None:
    """Write `span`'s traceparent and tracestate into `headers`, replacing any already there;
    leaves them alone when the span has no valid context."""
    if not span.get_span_context().is_valid:
        # Tracing off and no context from the client (the most requests): nothing to write.
        return
    carrier = carrier_of(span)
    if carrier:
        for key in _W3C_KEYS:
            # `del` drops every value of the key, from a multidict too.
            if key in headers:
                del headers[key]
        headers.update(carrier)


def parent_from(carrier: Mapping[str, str]) -> Context:
    """The context to start a child span in: the remote parent the carrier names, or an empty
    context (a new root) when it names none."""
    return _W3C.extract({k.lower(): v for k, v in carrier.items() if k.lower() in _W3C_KEYS})


def span_context_from(carrier: Mapping[str, str]) -> trace.SpanContext | None:
    """The span the carrier names, to link to; None when it names no valid one."""
    span_context = trace.get_current_span(parent_from(carrier)).get_span_context()
    return span_context if span_context.is_valid else None


def traceparent_of(span_context: trace.SpanContext) -> str:
    """The W3C traceparent header value of a span context."""
    carrier: dict[str, str] = {}
    _W3C.inject(carrier, context=trace.set_span_in_context(trace.NonRecordingSpan(span_context)))
    return carrier.get("traceparent", "")


def grpc_metadata(carrier: Mapping[str, str]) -> tuple[tuple[str, str], ...]:
    """The carrier as gRPC call metadata (keys are lower case, as gRPC requires)."""
    return tuple((key.lower(), value) for key, value in carrier.items())


def carrier_from_grpc_metadata(
    metadata: Iterable[tuple[str, str | bytes]] | None,
) -> dict[str, str]:
    """The W3C entries of a call's invocation metadata."""
    carrier: dict[str, str] = {}
    for key, value in metadata or ():
        if key.lower() in _W3C_KEYS and isinstance(value, str):
            carrier[key.lower()] = value
    return carrier
