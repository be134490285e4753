"""The gateway's request spans in front of a fake engine: what they say, how the trace reaches the
engine, and the link to the decision whose allocation admitted a request."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import pytest
import pytest_asyncio
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from admission_gateway import gateway as gateway_module
from admission_gateway.gateway import AdmissionGateway
from admission_gateway.gateway_state import TenantLimit
from slotshift.trace_context import parent_from, span_context_from
from tests.unit.admission_gateway.conftest import KEYS, auth, make_config
from tests.unit.admission_gateway.fake_engine import FakeEngine

COMPLETION = {"model": "fake", "user": "A", "prompt": "Hi"}
CLIENT_TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"
DECISION_TRACEPARENT = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"

StartGateway = Callable[..., Awaitable[AdmissionGateway]]


@pytest.fixture
def exporter() -> InMemorySpanExporter:
    return InMemorySpanExporter()


@pytest_asyncio.fixture
async def start_traced(
    engine: FakeEngine, exporter: InMemorySpanExporter
) -> AsyncIterator[StartGateway]:
    started: list[AdmissionGateway] = []

    async def start(*, traced: bool = True, **settings: Any) -> AdmissionGateway:
        provider = TracerProvider(shutdown_on_exit=False)
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        gateway = AdmissionGateway(
            make_config(engine.url, **settings),
            gateway_id="gw-test",
            tracer_provider=provider if traced else None,
        )
        await gateway.start()
        started.append(gateway)
        return gateway

    yield start
    for gateway in started:
        await gateway.stop()


async def _post(
    http: aiohttp.ClientSession, gateway: AdmissionGateway, headers: dict[str, str]
) -> int:
    async with http.post(
        gateway.url + "/v1/completions", json=COMPLETION, headers={**auth("A"), **headers}
    ) as response:
        await response.read()
        return response.status


def _spans(exporter: InMemorySpanExporter, name: str) -> list[ReadableSpan]:
    return [s for s in exporter.get_finished_spans() if s.name == name]


def _attributes(span: ReadableSpan) -> dict[str, Any]:
    return dict(span.attributes or {})


def _span_id(span: ReadableSpan) -> int:
    assert span.context is not None
    span_id: int = span.context.span_id
    return span_id


async def test_an_admitted_request_is_traced_to_the_engine_and_linked_to_its_decision(
    start_traced: StartGateway,
    engine: FakeEngine,
    http: aiohttp.ClientSession,
    exporter: InMemorySpanExporter,
) -> None:
    gateway = await start_traced()
    decision = span_context_from({"traceparent": DECISION_TRACEPARENT})
    assert gateway.state.apply_allocation(
        7, [TenantLimit("A", 4, 4), TenantLimit("B", 4, 4)], decision=decision
    )
    status = await _post(
        http, gateway, {"traceparent": CLIENT_TRACEPARENT, "tracestate": "client=1"}
    )
    assert status == 200

    (request,) = _spans(exporter, "POST /v1/completions")
    assert request.kind is trace.SpanKind.SERVER
    assert request.context is not None and request.parent is not None
    assert request.context.trace_id == 0x0AF7651916CD43DD8448EB211C80319C
    assert request.parent.span_id == 0xB7AD6B7169203331, "it continues the client's trace"
    attributes = _attributes(request)
    assert attributes["slotshift.tenant"] == "A"
    assert attributes["slotshift.pool"] == "p"
    assert attributes["slotshift.gateway.id"] == "gw-test"
    assert attributes["slotshift.allocation.version"] == 7
    assert attributes["slotshift.admission.outcome"] == "admitted"
    assert attributes["http.response.status_code"] == 200
    assert request.status.status_code is trace.StatusCode.UNSET
    assert [link.context for link in request.links] == [decision]
    for value in attributes.values():
        assert KEYS["A"] not in str(value)

    (waiting,) = _spans(exporter, "queue wait")
    (upstream,) = _spans(exporter, "upstream POST /v1/completions")
    assert waiting.parent is not None and upstream.parent is not None
    assert waiting.parent.span_id == upstream.parent.span_id == _span_id(request)
    assert upstream.kind is trace.SpanKind.CLIENT
    assert _attributes(upstream)["http.response.status_code"] == 200

    seen = {k.lower(): v for k, v in engine.headers_seen[-1].items()}
    sent = span_context_from({"traceparent": seen["traceparent"]})
    assert sent is not None and sent.span_id == _span_id(upstream)
    # W3C: the vendors' tracestate travels on along the trace.
    assert seen["tracestate"] == "client=1"


async def test_a_rejected_request_says_why_and_is_not_an_error_of_the_gateway(
    start_traced: StartGateway, http: aiohttp.ClientSession, exporter: InMemorySpanExporter
) -> None:
    gateway = await start_traced(queue_max_depth=0)
    assert gateway.state.apply_allocation(3, [TenantLimit("B", 8, 8)])
    assert await _post(http, gateway, {}) == 429
    (request,) = _spans(exporter, "POST /v1/completions")
    attributes = _attributes(request)
    assert attributes["slotshift.admission.outcome"] == "rejected"
    assert attributes["slotshift.admission.rejection_reason"] == "queue_full"
    assert attributes["slotshift.allocation.version"] == 3
    assert attributes["http.response.status_code"] == 429
    assert request.status.status_code is trace.StatusCode.UNSET
    assert not request.links
    (waiting,) = _spans(exporter, "queue wait")
    assert waiting.status.status_code is trace.StatusCode.ERROR
    assert not _spans(exporter, "upstream POST /v1/completions")


async def test_an_engine_failure_marks_both_spans_failed(
    start_traced: StartGateway,
    engine: FakeEngine,
    http: aiohttp.ClientSession,
    exporter: InMemorySpanExporter,
) -> None:
    gateway = await start_traced()
    engine.behaviour = "reset"
    assert await _post(http, gateway, {}) == 502
    (request,) = _spans(exporter, "POST /v1/completions")
    (upstream,) = _spans(exporter, "upstream POST /v1/completions")
    for span in (request, upstream):
        assert span.status.status_code is trace.StatusCode.ERROR
        assert _attributes(span)["error.type"] == "upstream_unavailable"


async def test_an_unknown_key_is_traced_without_tenant_or_key(
    start_traced: StartGateway, http: aiohttp.ClientSession, exporter: InMemorySpanExporter
) -> None:
    gateway = await start_traced()
    async with http.post(
        gateway.url + "/v1/completions",
        json=COMPLETION,
        headers={"Authorization": "Bearer not-a-key"},
    ) as response:
        assert response.status == 401
    (request,) = _spans(exporter, "POST /v1/completions")
    attributes = _attributes(request)
    assert attributes["http.response.status_code"] == 401
    assert "slotshift.tenant" not in attributes
    assert all("not-a-key" not in str(v) for v in attributes.values())


async def test_without_tracing_the_clients_trace_context_passes_through(
    start_traced: StartGateway,
    engine: FakeEngine,
    http: aiohttp.ClientSession,
    exporter: InMemorySpanExporter,
) -> None:
    gateway = await start_traced(traced=False)
    headers = {"traceparent": CLIENT_TRACEPARENT, "tracestate": "client=1"}
    assert await _post(http, gateway, headers) == 200
    seen = {k.lower(): v for k, v in engine.headers_seen[-1].items()}
    assert (seen["traceparent"], seen["tracestate"]) == (CLIENT_TRACEPARENT, "client=1")
    assert not exporter.get_finished_spans()


def test_without_tracing_the_current_spans_are_the_no_op_tracers() -> None:
    # The gateway's own no-op tracer sets current spans more cheaply; they must be the same.
    def current_spans(tracer: trace.Tracer, headers: dict[str, str]) -> list[trace.SpanContext]:
        seen = [trace.get_current_span().get_span_context()]
        with tracer.start_as_current_span("server", context=parent_from(headers)) as server:
            seen.append(server.get_span_context())
            with tracer.start_as_current_span("upstream") as upstream:
                seen += [upstream.get_span_context(), trace.get_current_span().get_span_context()]
            seen.append(trace.get_current_span().get_span_context())
        seen.append(trace.get_current_span().get_span_context())
        with pytest.raises(RuntimeError), tracer.start_as_current_span("failing"):
            raise RuntimeError
        seen.append(trace.get_current_span().get_span_context())
        return seen

    client = span_context_from({"traceparent": CLIENT_TRACEPARENT})
    for headers, inside in (({"traceparent": CLIENT_TRACEPARENT}, client), ({}, None)):
        expected = current_spans(trace.NoOpTracer(), headers)
        assert current_spans(gateway_module._UntracedTracer(), headers) == expected
        outside = trace.INVALID_SPAN_CONTEXT
        assert expected == [outside, *[inside or outside] * 4, outside, outside]
