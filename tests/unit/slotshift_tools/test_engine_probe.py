"""Requests inside the engine, read from a vLLM-shaped scrape."""

from __future__ import annotations

from slotshift_tools.engine_probe import requests_inside

SCRAPE = """\
# HELP vllm:num_requests_running Number of requests in model execution batches.
# TYPE vllm:num_requests_running gauge
vllm:num_requests_running{engine="0",model_name="m"} 7.0
vllm:num_requests_running{engine="1",model_name="m"} 2.0
# HELP vllm:num_requests_waiting Number of requests waiting to be processed.
# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 3.0
# HELP vllm:kv_cache_usage_perc KV-cache usage.
# TYPE vllm:kv_cache_usage_perc gauge
vllm:kv_cache_usage_perc{engine="0",model_name="m"} 40.0
"""


def test_running_and_waiting_are_summed_over_every_engine() -> None:
    assert requests_inside(SCRAPE) == 12


def test_a_scrape_without_the_gauges_has_nothing_inside() -> None:
    assert requests_inside("") == 0
