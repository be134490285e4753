"""A gateway in front of a fake engine, in a pool that weighs requests (pools[].request_cost):
long prompts hold several slots, short ones one, and the reported figures count slots."""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import pytest
import pytest_asyncio
from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from admission_gateway.gateway import AdmissionGateway
from slotshift.config import SlotshiftConfig
from tests.support import wait_until
from tests.unit.admission_gateway.conftest import auth, make_config
from tests.unit.admission_gateway.fake_engine import FakeEngine

LONG = {"model": "fake", "user": "A", "prompt": "x" * 800, "max_tokens": 100}
"""800 characters (200 tokens by length) plus 100: 3 slots of 100 tokens."""
SHORT = {"model": "fake", "user": "B", "prompt": "Hi", "max_tokens": 10}
"""1 slot."""


def weighted(engine_url: str, **request_cost: Any) -> SlotshiftConfig:
    """conftest's pool `p` (8 slots, A and B 4 each), weighing requests at 100 tokens a slot."""
    document = make_config(engine_url).model_dump(mode="json")
    document["pools"][0]["request_cost"] = {
        "tokens_per_slot": 100,
        "max_model_len_tokens": 1000,
        **request_cost,
    }
    for tenant, key in zip(document["pools"][0]["tenants"], ("key-a", "key-b"), strict=True):
        tenant["api_keys"] = [key]
    return SlotshiftConfig.model_validate(document)


@pytest_asyncio.fixture
async def gated(engine: FakeEngine) -> AsyncIterator[FakeEngine]:
    engine.gate = asyncio.Event()
    yield engine
    engine.gate.set()


async def start(
    config: SlotshiftConfig, tracer_provider: TracerProvider | None = None
) -> AdmissionGateway:
    gateway = AdmissionGateway(config, gateway_id="gw-test", tracer_provider=tracer_provider)
    await gateway.start()
    return gateway


async def send(
    http: aiohttp.ClientSession, gateway: AdmissionGateway, body: dict[str, Any], tenant: str
) -> int:
    async with http.post(
        gateway.url + "/v1/completions", json=body, headers=auth(tenant)
    ) as response:
        await response.read()
        return response.status


async def test_long_prompts_hold_their_size_and_cannot_crowd_out_short_ones(
    gated: FakeEngine, http: aiohttp.ClientSession
) -> None:
    gateway = await start(weighted(gated.url))
    try:
        a = gateway.state.tenants["A"].admission
        b = gateway.state.tenants["B"].admission
        requests = [send(http, gateway, LONG, "A") for _ in range(4)]
        requests += [send(http, gateway, SHORT, "B") for _ in range(4)]
        tasks = [asyncio.create_task(r) for r in requests]
        await wait_until(
            lambda: gated.in_flight["A"] == 1 and gated.in_flight["B"] == 4 and a.queued == 9,
            message="one long request of A and four short ones of B in the engine",
        )
        assert (a.in_flight, a.in_flight_requests, a.queued_requests) == (3, 1, 3)
        assert (b.in_flight, b.in_flight_requests) == (4, 4)
        # The gateway reports slots, what the budget (8) counts: 7 held by 5 requests.
        demand = {d.tenant: d for d in gateway.state.demand()}
        assert (demand["A"].in_flight, demand["A"].queued, demand["B"].in_flight) == (3, 9, 4)
        assert a.in_flight_requests + b.in_flight_requests == 5
        assert gateway.state.room("A") == (4 - 3 - 9, 3)
        assert gated.gate is not None
        gated.gate.set()
        assert await asyncio.gather(*tasks) == [200] * 8
        assert gated.peak_in_flight["A"] == 1, "3 + 3 slots never fit A's 4"
        await wait_until(lambda: a.in_flight == 0 and b.in_flight == 0, message="all released")
    finally:
        await gateway.stop()


async def test_an_unweighted_pool_lets_the_long_prompts_take_every_slot(
    gated: FakeEngine, http: aiohttp.ClientSession
) -> None:
    """The same load without request_cost: the contrast the weighted pool is for."""
    gateway = await start(make_config(gated.url))
    try:
        tasks = [asyncio.create_task(send(http, gateway, LONG, "A")) for _ in range(4)]
        await wait_until(lambda: gated.in_flight["A"] == 4, message="four long requests run")
        assert gateway.state.tenants["A"].admission.in_flight == 4
        assert gated.gate is not None
        gated.gate.set()
        assert await asyncio.gather(*tasks) == [200] * 4
    finally:
        await gateway.stop()


async def test_the_engines_count_weighs_the_prompt_and_an_oversize_request_runs_alone(
    gated: FakeEngine, http: aiohttp.ClientSession
) -> None:
    # The fake engine counts a token per character: 800 + 100 tokens, 9 slots, over A's 4.
    gateway = await start(weighted(gated.url, prompt_estimate="tokenize"))
    try:
        a = gateway.state.tenants["A"].admission
        tasks = [asyncio.create_task(send(http, gateway, LONG, "A")) for _ in range(2)]
        await wait_until(
            lambda: gated.in_flight["A"] == 1 and a.queued_requests == 1,
            message="one oversize request running, the other waiting",
        )
        assert (a.in_flight, a.queued) == (4, 9), "charged A's whole limit; the other asks 9"
        assert gated.gate is not None
        gated.gate.set()
        assert await asyncio.gather(*tasks) == [200, 200]
        assert gated.peak_in_flight["A"] == 1
        assert gateway.state.prompt_estimate_fallbacks_total == 0
    finally:
        await gateway.stop()


@pytest.mark.parametrize("status", [404, 500])
async def test_without_the_engines_count_the_length_estimate_is_taken_and_counted(
    gated: FakeEngine, http: aiohttp.ClientSession, status: int
) -> None:
    gated.tokenize_status = status
    gateway = await start(weighted(gated.url, prompt_estimate="tokenize"))
    try:
        a = gateway.state.tenants["A"].admission
        task = asyncio.create_task(send(http, gateway, LONG, "A"))
        await wait_until(lambda: gated.in_flight["A"] == 1, message="the request runs")
        assert a.in_flight == 3, "weighed by length: 200 + 100 tokens"
        assert gateway.state.prompt_estimate_fallbacks_total == 1
        async with http.get(gateway.url + "/metrics") as response:
            scrape = await response.text()
        assert 'slotshift_gateway_prompt_estimate_fallbacks_total{pool="p"} 1.0' in scrape
        assert 'slotshift_gateway_in_flight_slots{pool="p",tenant="A"} 3.0' in scrape
        assert 'slotshift_gateway_requests_in_flight{pool="p",tenant="A"} 1.0' in scrape
        assert gated.gate is not None
        gated.gate.set()
        assert await task == 200
    finally:
        await gateway.stop()


@pytest.mark.parametrize(
    ("estimate", "prompt_tokens", "slots", "estimated_by"),
    [
        pytest.param("length", 200, 3, "length", id="length"),
        # The fake engine counts a token per character: 800 + 100 tokens.
        pytest.param("tokenize", 800, 9, "tokenize", id="tokenize"),
    ],
)
async def test_the_request_span_says_what_it_cost_and_how_it_was_estimated(
    engine: FakeEngine,
    http: aiohttp.ClientSession,
    estimate: str,
    prompt_tokens: int,
    slots: int,
    estimated_by: str,
) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider(shutdown_on_exit=False)
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    gateway = await start(weighted(engine.url, prompt_estimate=estimate), provider)
    try:
        assert await send(http, gateway, LONG, "A") == 200
    finally:
        await gateway.stop()
    (span,) = [s for s in exporter.get_finished_spans() if s.name == "POST /v1/completions"]
    attributes = dict(span.attributes or {})
    assert attributes["slotshift.request.cost_slots"] == slots
    assert attributes["slotshift.request.prompt_tokens_estimate"] == prompt_tokens
    assert attributes["slotshift.request.max_tokens_charged"] == 100
    assert attributes["slotshift.request.cost_estimated_by"] == estimated_by
