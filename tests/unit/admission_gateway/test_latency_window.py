"""Recent-latency percentiles in bounded memory, observed in seconds, summarised in ms."""

from __future__ import annotations

import pytest

from admission_gateway.latency_window import LatencyWindow
from slotshift.clock import ManualClock


def test_an_empty_window_reports_count_zero() -> None:
    summary = LatencyWindow(ManualClock()).percentiles()
    assert (summary.count, summary.p50_ms, summary.p99_ms) == (0, 0.0, 0.0)


def test_percentiles_by_nearest_rank() -> None:
    window = LatencyWindow(ManualClock())
    for value in range(1, 101):
        window.observe(value / 100)
    summary = window.percentiles()
    assert (summary.count, summary.p50_ms, summary.p90_ms, summary.p99_ms) == pytest.approx(
        (100, 500.0, 900.0, 990.0)
    )


def test_old_observations_leave_the_window() -> None:
    clock = ManualClock()
    window = LatencyWindow(clock, max_age_s=10)
    window.observe(5.0)
    clock.advance(6)
    window.observe(1.0)
    clock.advance(5)
    summary = window.percentiles()
    assert (summary.count, summary.p99_ms) == (1, 1000.0)


def test_memory_is_bounded_by_count() -> None:
    window = LatencyWindow(ManualClock(), max_samples=3)
    for value in (9.0, 1.0, 2.0, 3.0):
        window.observe(value)
    assert len(window) == 3
    assert window.percentiles().p99_ms == 3000.0


def test_negative_latencies_count_as_zero() -> None:
    window = LatencyWindow(ManualClock())
    window.observe(-1.0)
    assert window.percentiles().p50_ms == 0.0


@pytest.mark.parametrize(("samples", "age"), [(0, 1.0), (1, 0.0)])
def test_bad_bounds_are_refused(samples: int, age: float) -> None:
    with pytest.raises(ValueError, match="must be"):
        LatencyWindow(ManualClock(), max_samples=samples, max_age_s=age)


def test_the_summary_follows_every_change_of_the_window() -> None:
    """Percentiles are kept between changes: a new observation, one ageing out and one pushed
    out by the count each give a new summary."""
    clock = ManualClock()
    window = LatencyWindow(clock, max_samples=3, max_age_s=10)
    window.observe(1.0)
    assert window.percentiles().p99_ms == 1000.0
    window.observe(4.0)
    assert (window.percentiles().count, window.percentiles().p99_ms) == (2, 4000.0)
    clock.advance(6)
    window.observe(2.0)
    window.observe(3.0)  # pushes the 1.0 out
    assert (window.percentiles().count, window.percentiles().p50_ms) == (3, 3000.0)
    clock.advance(5)  # 4.0 ages out
    assert (window.percentiles().count, window.percentiles().p99_ms) == (2, 3000.0)
