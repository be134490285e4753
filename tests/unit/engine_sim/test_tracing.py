"""The emulator continues the caller's trace with vLLM's "llm_request" span."""

from __future__ import annotations

from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
import pytest_asyncio
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from engine_sim.server import EngineSim
from tests.unit.engine_sim.conftest import MODEL, fast_config

TRACEPARENT = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01"


@pytest.fixture
def exporter() -> InMemorySpanExporter:
    return InMemorySpanExporter()


@pytest_asyncio.fixture
async def traced_sim(exporter: InMemorySpanExporter) -> AsyncIterator[EngineSim]:
    provider = TracerProvider(shutdown_on_exit=False)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    emulator = EngineSim(fast_config(), tracer_provider=provider)
    await emulator.start()
    try:
        yield emulator
    finally:
        await emulator.stop()


def _llm_requests(exporter: InMemorySpanExporter) -> list[ReadableSpan]:
    return [s for s in exporter.get_finished_spans() if s.name == "llm_request"]


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "streamed"])
async def test_a_request_continues_the_callers_trace(
    traced_sim: EngineSim, exporter: InMemorySpanExporter, stream: bool
) -> None:
    body = {"model": MODEL, "prompt": "a b c", "max_tokens": 5, "ignore_eos": True}
    async with (
        aiohttp.ClientSession() as http,
        http.post(
            traced_sim.url + "/v1/completions",
            json={**body, "stream": stream},
            headers={"traceparent": TRACEPARENT},
        ) as response,
    ):
        assert response.status == 200
        await response.read()
    (span,) = _llm_requests(exporter)
    assert span.kind is trace.SpanKind.SERVER
    assert span.context is not None and span.parent is not None
    assert span.context.trace_id == 0x0AF7651916CD43DD8448EB211C80319C
    assert span.parent.span_id == 0xB7AD6B7169203331
    attributes: dict[str, Any] = dict(span.attributes or {})
    assert attributes["gen_ai.response.model"] == MODEL
    assert attributes["gen_ai.request.max_tokens"] == 5
    assert attributes["gen_ai.usage.prompt_tokens"] > 0
    assert attributes["gen_ai.usage.completion_tokens"] == 5
    assert attributes["gen_ai.response.finish_reasons"] == ("length",)
    assert 0 <= attributes["gen_ai.latency.time_in_queue"] <= attributes["gen_ai.latency.e2e"]


async def test_a_rejected_body_never_reaches_the_engine_nor_a_span(
    traced_sim: EngineSim, exporter: InMemorySpanExporter
) -> None:
    async with (
        aiohttp.ClientSession() as http,
        http.post(traced_sim.url + "/v1/completions", data=b"{nope") as response,
    ):
        assert response.status == 400
    assert not _llm_requests(exporter)
