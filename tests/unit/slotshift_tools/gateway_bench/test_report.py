"""The bench's report: one run's figures, medians over runs, the table."""

from __future__ import annotations

from typing import Any

import pytest

from slotshift_tools.gateway_bench.report import FIGURES, markdown_table, summary


def _run(scale: float, *, with_preemptible: bool = True) -> dict[str, Any]:
    latency = {"added_p50_ms": 1.0 * scale, "added_p99_ms": 2.0 * scale}
    cpu: dict[str, Any] = {"plain": {"cpu_ms_per_1000_events": 40.0 * scale}}
    if with_preemptible:
        cpu["preemptible"] = {"cpu_ms_per_1000_events": 80.0 * scale}
    return {
        "latency": {
            kind: {"gateway": latency}
            for kind in ("non_streamed", "ttft", "non_streamed_after_idle")
        },
        "cpu": {"gateway": cpu},
        "interference": {"gateway": {"added_p50_ms": 0.5 * scale, "added_p99_ms": 3.0 * scale}},
        "accounting": {
            "gateway-mix-counted": {"cpu_ms_per_1000_events": 21.0 * scale, "count_tokens": True},
            "gateway-mix-uncounted": {
                "cpu_ms_per_1000_events": 20.0 * scale,
                "count_tokens": False,
            },
        },
    }


def test_each_figure_is_the_median_over_the_runs() -> None:
    figures = summary([_run(1.0), _run(3.0), _run(2.0)], ["gateway"])["gateway"]
    assert set(figures) == set(FIGURES)
    assert figures["non_streamed_added_p50_ms"] == pytest.approx(2.0)
    assert figures["cpu_ms_per_1000_events_preemptible"] == pytest.approx(160.0)
    assert figures["interactive_added_ttft_p99_ms_under_batch"] == pytest.approx(6.0)
    assert figures["cpu_ms_per_1000_events_mix_uncounted"] == pytest.approx(40.0)
    # Each run's ratio of its two side-by-side windows, then the median.
    assert figures["token_accounting_cpu_percent"] == pytest.approx(5.0)


def test_the_accounting_price_is_the_gateways_alone() -> None:
    run = _run(1.0)
    for kind in run["latency"].values():
        kind["haproxy"] = kind["gateway"]
    run["cpu"]["haproxy"] = run["cpu"]["gateway"]
    figures = summary([run], ["gateway", "haproxy"])
    assert figures["gateway"]["token_accounting_cpu_percent"] == pytest.approx(5.0)
    assert figures["haproxy"]["token_accounting_cpu_percent"] is None
    assert figures["haproxy"]["cpu_ms_per_1000_events_mix_counted"] is None


def test_a_figure_no_run_measured_is_shown_as_missing() -> None:
    figures = summary([_run(1.0, with_preemptible=False)], ["gateway"])
    assert figures["gateway"]["cpu_ms_per_1000_events_preemptible"] is None
    table = markdown_table(figures)
    assert "| CPU per 1,000 relayed events, preemptible (ms) | - |" in table
    assert len(table.splitlines()) == 2 + len(FIGURES)
