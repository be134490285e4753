"""Scrapes the engine's /metrics and turns each scrape into an EngineSample.

Time to first token is reported over the interval since the previous successful scrape (bucket
increases, see histogram.py). The first scrape only sets the baseline, so its count is 0: what a
histogram held before the agent looked is not "recent". A failed scrape keeps the old baseline,
so the next good one covers the whole gap and loses no observation.
"""

from __future__ import annotations

import asyncio
import math
import ssl
from dataclasses import dataclass

import aiohttp

from slotshift.clock import Clock
from slotshift.config import ClientTlsConfig
from slotshift.tls import client_ssl_context
from slotshift.v1 import common_pb2, telemetry_pb2
from telemetry_agent.histogram import (
    CumulativeHistogram,
    histogram_increase,
    histogram_quantile,
    merge_histograms,
)
from telemetry_agent.vllm_metrics import (
    EmulatedGpu,
    MalformedExpositionError,
    NotVllmMetricsError,
    SeriesKey,
    VllmSnapshot,
    parse_vllm_metrics,
)

SCRAPE_ERROR_REASONS = ("timeout", "connection", "http_status", "parse", "not_vllm")
"""Values of the `reason` label of slotshift_agent_scrape_errors_total."""


@dataclass(frozen=True)
class EngineScrape:
    """The outcome of one scrape."""

    sample: telemetry_pb2.EngineSample
    """What goes into the report; scrape_ok false and scrape_error set when it failed."""
    emulated_gpus: tuple[EmulatedGpu, ...]
    """GPUs the engine emulator models; empty for a real engine or a failed scrape."""
    error_reason: str | None
    """One of SCRAPE_ERROR_REASONS when the scrape failed, else None."""
    duration_s: float


class EngineScraper:
    """Scrapes one engine's Prometheus endpoint; keeps the previous scrape for interval figures.

    open() before the first scrape, close() at the end (they own the HTTP session).
    """

    def __init__(
        self, url: str, *, timeout_s: float, clock: Clock, tls: ClientTlsConfig | None = None
    ) -> None:
        """tls: how an https `url` is checked (a client certificate when it has one); None: the
        system's roots."""
        self._url = url
        self._tls = tls
        self._timeout = aiohttp.ClientTimeout(total=timeout_s)
        self._clock = clock
        self._session: aiohttp.ClientSession | None = None
        self._baseline: dict[SeriesKey, CumulativeHistogram] | None = None

    async def open(self) -> None:
        """Create the HTTP session."""
        if self._session is None:
            tls = self._tls
            checked: ssl.SSLContext | bool = (
                True if tls is None else await asyncio.to_thread(client_ssl_context, tls)
            )
            self._session = aiohttp.ClientSession(
                timeout=self._timeout, connector=aiohttp.TCPConnector(ssl=checked)
            )

    async def close(self) -> None:
        """Close the HTTP session."""
        if self._session is not None:
            await self._session.close()
            self._session = None

    async def scrape(self) -> EngineScrape:
        """Fetch and read the engine's metrics once; a failure is described, never raised."""
        if self._session is None:
            raise RuntimeError("EngineScraper.open() was not called")
        started = self._clock.monotonic()
        try:
            text = await self._fetch(self._session)
            snapshot = parse_vllm_metrics(text)
        except _ScrapeFailed as failure:
            return self._failed(failure.reason, failure.message, started)
        except MalformedExpositionError as exc:
            return self._failed("parse", f"{self._url}: {exc}", started)
        except NotVllmMetricsError as exc:
            return self._failed("not_vllm", f"{self._url}: {exc}", started)
        return EngineScrape(
            sample=self._sample(snapshot),
            emulated_gpus=snapshot.emulated_gpus,
            error_reason=None,
            duration_s=self._clock.monotonic() - started,
        )

    async def _fetch(self, session: aiohttp.ClientSession) -> str:
        try:
            async with session.get(self._url) as response:
                if response.status != 200:
                    raise _ScrapeFailed(
                        "http_status", f"GET {self._url}: HTTP {response.status} {response.reason}"
                    )
                return await response.text()
        except TimeoutError as exc:
            raise _ScrapeFailed(
                "timeout", f"GET {self._url}: no answer within {self._timeout.total} s"
            ) from exc
        except UnicodeDecodeError as exc:
            raise _ScrapeFailed("parse", f"GET {self._url}: body is not text: {exc}") from exc
        except aiohttp.ClientError as exc:
            raise _ScrapeFailed("connection", f"GET {self._url}: {exc}") from exc

    def _failed(self, reason: str, message: str, started: float) -> EngineScrape:
        return EngineScrape(
            sample=telemetry_pb2.EngineSample(scrape_ok=False, scrape_error=message),
            emulated_gpus=(),
            error_reason=reason,
            duration_s=self._clock.monotonic() - started,
        )

    def _sample(self, snapshot: VllmSnapshot) -> telemetry_pb2.EngineSample:
        return telemetry_pb2.EngineSample(
            scrape_ok=True,
            model_name=snapshot.model_name,
            num_requests_running=snapshot.num_requests_running,
            num_requests_waiting=snapshot.num_requests_waiting,
            kv_cache_usage_perc=snapshot.kv_cache_usage_perc,
            ttft=self._ttft_since_last_scrape(snapshot),
            prompt_tokens_total=snapshot.prompt_tokens_total,
            generation_tokens_total=snapshot.generation_tokens_total,
            num_preemptions_total=snapshot.num_preemptions_total,
        )

    def _ttft_since_last_scrape(self, snapshot: VllmSnapshot) -> common_pb2.LatencySummary:
        baseline, self._baseline = self._baseline, dict(snapshot.ttft_series)
        if baseline is None:
            return common_pb2.LatencySummary(count=0)
        # Per series, then merged: one engine may restart while the others go on.
        interval = merge_histograms(
            histogram_increase(baseline.get(key), series)
            for key, series in snapshot.ttft_series.items()
        )
        return latency_summary(interval)


def latency_summary(histogram: CumulativeHistogram | None) -> common_pb2.LatencySummary:
    """p50/p90/p99 in ms of the observations in `histogram`; count 0 (and no figures) if none."""
    if histogram is None or histogram.count <= 0:
        return common_pb2.LatencySummary(count=0)
    p50, p90, p99 = (histogram_quantile(q, histogram) for q in (0.5, 0.9, 0.99))
    if any(math.isnan(p) for p in (p50, p90, p99)):
        return common_pb2.LatencySummary(count=0)
    return common_pb2.LatencySummary(
        count=round(histogram.count), p50_ms=p50 * 1e3, p90_ms=p90 * 1e3, p99_ms=p99 * 1e3
    )


class _ScrapeFailed(Exception):
    def __init__(self, reason: str, message: str) -> None:
        super().__init__(message)
        self.reason = reason
        self.message = message
