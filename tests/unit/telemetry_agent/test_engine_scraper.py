"""Scraping a real HTTP endpoint: interval TTFT figures, failures described and never invented."""

from __future__ import annotations

from collections.abc import AsyncIterator

import pytest
import pytest_asyncio

from slotshift.clock import ManualClock
from telemetry_agent.engine_scraper import EngineScraper
from tests.support import free_port
from tests.unit.telemetry_agent.fake_engine import FakeEngineMetrics
from tests.unit.telemetry_agent.fixtures import VLLM_SCRAPE_0, VLLM_SCRAPE_1


@pytest_asyncio.fixture
async def engine() -> AsyncIterator[FakeEngineMetrics]:
    server = FakeEngineMetrics(VLLM_SCRAPE_0)
    await server.start()
    yield server
    await server.stop()


async def open_scraper(url: str, timeout_s: float = 2.0) -> EngineScraper:
    scraper = EngineScraper(url, timeout_s=timeout_s, clock=ManualClock())
    await scraper.open()
    return scraper


async def test_first_scrape_sets_the_baseline_and_the_next_reports_the_interval(
    engine: FakeEngineMetrics,
) -> None:
    scraper = await open_scraper(engine.url)
    try:
        first = await scraper.scrape()
        engine.text = VLLM_SCRAPE_1
        second = await scraper.scrape()
    finally:
        await scraper.close()

    assert first.error_reason is None
    assert first.sample.scrape_ok
    assert first.sample.num_requests_running == 12.0
    assert first.sample.ttft.count == 0  # no interval yet: what came before the agent is not recent

    sample = second.sample
    assert sample.scrape_ok
    assert sample.model_name == "Qwen/Qwen2.5-3B-Instruct"
    assert sample.num_requests_running == 14.0
    assert sample.num_requests_waiting == 3.0
    assert sample.kv_cache_usage_perc == 0.439
    assert sample.prompt_tokens_total == 2_485_853.0
    assert sample.generation_tokens_total == 642_497.0
    assert sample.num_preemptions_total == 3.0
    # 80 first tokens in the interval (40 per engine); merged increases per bucket:
    # <=0.04: 6, <=0.06: 26, <=0.08: 42, <=0.1: 58, <=0.25: 74, <=0.5: 79, <=0.75: 80.
    assert sample.ttft.count == 80
    assert sample.ttft.p50_ms == pytest.approx(77.5)  # rank 40: 14 of 16 in (60, 80] ms
    assert sample.ttft.p90_ms == pytest.approx(231.25)  # rank 72: 14 of 16 in (100, 250] ms
    assert sample.ttft.p99_ms == pytest.approx(550.0)  # rank 79.2: 0.2 of 1 in (500, 750] ms


async def test_an_engine_restart_counts_what_the_new_engine_observed(
    engine: FakeEngineMetrics,
) -> None:
    scraper = await open_scraper(engine.url)
    try:
        engine.text = VLLM_SCRAPE_1
        await scraper.scrape()
        # The engine came back: its histograms start again, far below the old counts.
        engine.text = _restarted_engine_text()
        after_restart = await scraper.scrape()
    finally:
        await scraper.close()
    assert after_restart.sample.scrape_ok
    assert after_restart.sample.ttft.count == 4
    assert after_restart.sample.ttft.p50_ms == pytest.approx(50.0)  # 2 of 4 in (40, 60] ms


def _restarted_engine_text() -> str:
    """Both engines just restarted: same labels as before, counts far below the old ones."""
    model = 'model_name="Qwen/Qwen2.5-3B-Instruct"'
    bounds = ["0.001", "0.005", "0.01", "0.02", "0.04", "0.06", "0.08", "0.1", "+Inf"]
    counts_by_engine = {"0": [0, 0, 0, 0, 1, 3, 4, 4, 4], "1": [0] * len(bounds)}
    lines = []
    for engine, counts in counts_by_engine.items():
        lines += [
            f'vllm:num_requests_running{{engine="{engine}",{model}}} 1.0',
            f'vllm:num_requests_waiting{{engine="{engine}",{model}}} 0.0',
            f'vllm:kv_cache_usage_perc{{engine="{engine}",{model}}} 0.01',
        ]
        lines += [
            f'vllm:time_to_first_token_seconds_bucket{{engine="{engine}",le="{b}",{model}}} {c}'
            for b, c in zip(bounds, counts, strict=True)
        ]
    return "\n".join(lines) + "\n"


async def test_a_failed_scrape_keeps_the_baseline_so_no_observation_is_lost(
    engine: FakeEngineMetrics,
) -> None:
    scraper = await open_scraper(engine.url)
    try:
        await scraper.scrape()
        engine.status = 500
        failed = await scraper.scrape()
        engine.status = 200
        engine.text = VLLM_SCRAPE_1
        recovered = await scraper.scrape()
    finally:
        await scraper.close()
    assert not failed.sample.scrape_ok
    assert recovered.sample.ttft.count == 80


async def test_http_500_is_a_failed_scrape_without_figures(engine: FakeEngineMetrics) -> None:
    engine.status = 500
    scraper = await open_scraper(engine.url)
    try:
        result = await scraper.scrape()
    finally:
        await scraper.close()
    assert result.error_reason == "http_status"
    assert not result.sample.scrape_ok
    assert "HTTP 500" in result.sample.scrape_error
    assert engine.url in result.sample.scrape_error
    assert result.sample.num_requests_running == 0.0
    assert not result.sample.HasField("ttft")
    assert result.emulated_gpus == ()


async def test_a_closed_port_is_a_connection_failure() -> None:
    url = f"http://127.0.0.1:{free_port()}/metrics"
    scraper = await open_scraper(url)
    try:
        result = await scraper.scrape()
    finally:
        await scraper.close()
    assert result.error_reason == "connection"
    assert not result.sample.scrape_ok
    assert url in result.sample.scrape_error


async def test_an_engine_that_does_not_answer_in_time_is_a_timeout(
    engine: FakeEngineMetrics,
) -> None:
    engine.stall = True
    scraper = await open_scraper(engine.url, timeout_s=0.05)
    try:
        result = await scraper.scrape()
    finally:
        await scraper.close()
    assert result.error_reason == "timeout"
    assert "0.05" in result.sample.scrape_error


@pytest.mark.parametrize(
    ("body", "reason"),
    [
        pytest.param("# TYPE up gauge\nup 1\n", "not_vllm", id="not-vllm"),
        pytest.param("<html>502 Bad Gateway</html>\n", "parse", id="not-an-exposition"),
    ],
)
async def test_bodies_that_are_not_vllm_metrics_are_failed_scrapes(
    engine: FakeEngineMetrics, body: str, reason: str
) -> None:
    engine.text = body
    scraper = await open_scraper(engine.url)
    try:
        result = await scraper.scrape()
    finally:
        await scraper.close()
    assert result.error_reason == reason
    assert not result.sample.scrape_ok
    assert result.sample.scrape_error
