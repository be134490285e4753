"""Reading /metrics from outside: parsed samples, sums, and a real HTTP endpoint on port 0."""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp
import pytest
import pytest_asyncio
from aiohttp import web

from slotshift_tools.metrics_scrape import parse_samples, scrape_samples, summed

EXPOSITION = """\
# HELP slotshift_gateway_requests_admitted_total Requests admitted.
# TYPE slotshift_gateway_requests_admitted_total counter
slotshift_gateway_requests_admitted_total{tenant="A"} 5.0
slotshift_gateway_requests_admitted_total{tenant="B"} 7.0
# HELP vllm:kv_cache_usage_perc KV-cache usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{model_name="m"} 0.25
"""


def test_samples_are_listed_by_name_with_their_labels() -> None:
    samples = parse_samples(EXPOSITION)
    assert samples["slotshift_gateway_requests_admitted_total"] == [
        ({"tenant": "A"}, 5.0),
        ({"tenant": "B"}, 7.0),
    ]
    assert summed(samples, "slotshift_gateway_requests_admitted_total") == 12.0
    assert summed(samples, "vllm:kv_cache_usage_perc") == 0.25
    assert summed(samples, "vllm:num_requests_running") is None


@pytest_asyncio.fixture
async def endpoint() -> AsyncIterator[str]:
    async def metrics(_: web.Request) -> web.Response:
        return web.Response(text=EXPOSITION, content_type="text/plain")

    async def broken(_: web.Request) -> web.Response:
        return web.Response(status=503, text="not ready")

    app = web.Application()
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/broken", broken)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


async def test_a_scrape_reads_the_endpoint_and_an_error_status_raises(endpoint: str) -> None:
    async with aiohttp.ClientSession() as session:
        samples = await scrape_samples(session, f"{endpoint}/metrics", timeout_s=5.0)
        assert summed(samples, "slotshift_gateway_requests_admitted_total") == 12.0
        with pytest.raises(aiohttp.ClientResponseError):
            await scrape_samples(session, f"{endpoint}/broken", timeout_s=5.0)
