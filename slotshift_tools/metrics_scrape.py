"""Reading a service's Prometheus /metrics from outside, as the soak, the benchmark's sampler and
the fidelity benchmark do: every sample by name, with its labels."""

from __future__ import annotations

from collections.abc import Mapping

import aiohttp
from prometheus_client.parser import text_string_to_metric_families

Samples = dict[str, list[tuple[dict[str, str], float]]]
"""Sample name (a counter's under its `_total` name) -> [(labels, value)] in exposition order."""


def parse_samples(text: str) -> Samples:
    """Every sample of a Prometheus text exposition."""
    samples: Samples = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            samples.setdefault(sample.name, []).append((dict(sample.labels), float(sample.value)))
    return samples


async def scrape_samples(
    session: aiohttp.ClientSession, url: str, *, timeout_s: float | None = None
) -> Samples:
    """GET `url` and parse it. Raises aiohttp.ClientError (a status other than 2xx included) or
    TimeoutError when the endpoint does not answer."""
    async with session.get(url, timeout=aiohttp.ClientTimeout(total=timeout_s)) as response:
        response.raise_for_status()
        text = await response.text()
    return parse_samples(text)


def summed(samples: Mapping[str, list[tuple[dict[str, str], float]]], name: str) -> float | None:
    """The sum of a sample's values over its label sets; None when the scrape has none."""
    values = samples.get(name)
    return None if not values else sum(value for _, value in values)
