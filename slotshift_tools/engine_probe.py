"""Two questions a tool asks an OpenAI-compatible server from outside: which model it serves
(through a gateway, with a tenant's key) and how many requests are inside the engine (running
plus waiting, from vLLM's /metrics). The demo, the soak, the benchmark and the tests ask them
the same way."""

from __future__ import annotations

import aiohttp

from slotshift_tools.metrics_scrape import parse_samples, summed

ENGINE_REQUEST_GAUGES = ("vllm:num_requests_running", "vllm:num_requests_waiting")
"""vLLM's gauges whose sum is the number of requests inside the engine."""


async def served_model(
    session: aiohttp.ClientSession,
    base_url: str,
    api_key: str,
    *,
    timeout_s: float | None = None,
) -> str:
    """The first model `base_url/v1/models` lists (a vLLM engine serves one)."""
    async with session.get(
        f"{base_url}/v1/models",
        headers={"Authorization": f"Bearer {api_key}"},
        timeout=aiohttp.ClientTimeout(total=timeout_s),
    ) as response:
        response.raise_for_status()
        body = await response.json()
    return str(body["data"][0]["id"])


def requests_inside(metrics_text: str) -> int:
    """Requests inside the engine, running plus waiting, summed over the scrape's samples."""
    samples = parse_samples(metrics_text)
    return round(sum(summed(samples, name) or 0.0 for name in ENGINE_REQUEST_GAUGES))
