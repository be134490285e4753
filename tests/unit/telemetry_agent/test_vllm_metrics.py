"""Reading vLLM V1 /metrics text: the captured-style fixture, exactly, and what is refused."""

from __future__ import annotations

import math

import pytest

from telemetry_agent.vllm_metrics import (
    EmulatedGpu,
    MalformedExpositionError,
    NotVllmMetricsError,
    parse_vllm_metrics,
)
from tests.unit.telemetry_agent.fixtures import EMULATOR_GPU_GAUGES, VLLM_SCRAPE_0

INF = math.inf
TTFT_BOUNDS = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75,
    1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0, INF,
)  # fmt: skip


def test_fixture_gauges_add_up_over_engines_and_kv_usage_is_the_fullest_engine() -> None:
    snapshot = parse_vllm_metrics(VLLM_SCRAPE_0)
    assert snapshot.model_name == "Qwen/Qwen2.5-3B-Instruct"
    assert snapshot.num_requests_running == 12.0  # 7 + 5
    assert snapshot.num_requests_waiting == 3.0  # 3 + 0
    assert snapshot.kv_cache_usage_perc == 0.4172  # max(0.4172, 0.3519)
    assert snapshot.prompt_tokens_total == 2_391_853.0  # 1,204,551 + 1,187,302
    assert snapshot.generation_tokens_total == 616_897.0  # 311,877 + 305,020
    assert snapshot.num_preemptions_total == 2.0
    assert snapshot.emulated_gpus == ()


def test_fixture_ttft_histograms_are_kept_per_engine() -> None:
    series = parse_vllm_metrics(VLLM_SCRAPE_0).ttft_series
    key_0 = (("engine", "0"), ("model_name", "Qwen/Qwen2.5-3B-Instruct"))
    key_1 = (("engine", "1"), ("model_name", "Qwen/Qwen2.5-3B-Instruct"))
    assert set(series) == {key_0, key_1}
    engine_0 = series[key_0]
    assert engine_0.upper_bounds == TTFT_BOUNDS
    assert engine_0.cumulative_counts[:13] == (
        0, 0, 0, 12, 230, 655, 1010, 1290, 1802, 1911, 1930, 1937, 1940,
    )  # fmt: skip
    assert engine_0.count == 1940
    assert series[key_1].count == 1906
    # The `_created` gauge travels with the series, to tell a restart from growth.
    assert engine_0.created_s is not None
    assert engine_0.created_s > 1.7e9


def test_the_legacy_kv_cache_gauge_is_read_when_the_new_one_is_absent() -> None:
    text = """\
vllm:num_requests_running{engine="0",model_name="m"} 1
vllm:num_requests_waiting{engine="0",model_name="m"} 0
vllm:gpu_cache_usage_perc{engine="0",model_name="m"} 0.25
"""
    snapshot = parse_vllm_metrics(text)
    assert snapshot.kv_cache_usage_perc == 0.25
    # Counters never incremented are absent and count as 0.
    assert snapshot.prompt_tokens_total == 0.0
    assert snapshot.ttft_series == {}


def test_nan_gauges_are_no_value_rather_than_nan_figures() -> None:
    text = """\
vllm:num_requests_running{engine="0",model_name="m"} 4
vllm:num_requests_running{engine="1",model_name="m"} NaN
vllm:num_requests_waiting{engine="0",model_name="m"} 0
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.5
"""
    assert parse_vllm_metrics(text).num_requests_running == 4.0


def test_emulator_gpu_gauges_are_read_as_one_modelled_gpu() -> None:
    snapshot = parse_vllm_metrics(VLLM_SCRAPE_0 + EMULATOR_GPU_GAUGES)
    assert snapshot.emulated_gpus == (
        EmulatedGpu(
            engine="0",
            model_name="Qwen/Qwen2.5-3B-Instruct",
            utilization_pct=67.5,
            memory_used_bytes=120_000_000_000,
            memory_total_bytes=150_000_000_000,
        ),
    )


def test_a_partly_published_emulated_gpu_is_left_out() -> None:
    only_utilisation = EMULATOR_GPU_GAUGES.split("# HELP slotshift_sim_gpu_memory_used")[0]
    assert parse_vllm_metrics(VLLM_SCRAPE_0 + only_utilisation).emulated_gpus == ()


def test_an_exposition_without_vllm_gauges_is_not_vllm() -> None:
    with pytest.raises(NotVllmMetricsError, match="vllm:num_requests_running"):
        parse_vllm_metrics("# TYPE up gauge\nup 1\n")


def test_text_that_is_not_an_exposition_is_malformed() -> None:
    with pytest.raises(MalformedExpositionError):
        parse_vllm_metrics("<html><body>Bad gateway</body></html>\n")


def test_a_histogram_without_inf_bucket_is_malformed() -> None:
    text = """\
vllm:num_requests_running{engine="0",model_name="m"} 1
vllm:num_requests_waiting{engine="0",model_name="m"} 0
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 0.1
vllm:time_to_first_token_seconds_bucket{engine="0",le="0.1",model_name="m"} 1
"""
    with pytest.raises(MalformedExpositionError, match="Inf"):
        parse_vllm_metrics(text)
