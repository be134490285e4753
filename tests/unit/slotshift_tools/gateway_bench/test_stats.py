"""The bench's statistics: paired differences, tail differences, CPU per event, run medians."""

from __future__ import annotations

import pytest

from slotshift_tools.gateway_bench.stats import (
    added_p50_ms,
    added_p99_ms,
    cpu_ms_per_1000_events,
    median_of_runs,
    percentile_ms,
)


def test_added_p50_is_the_median_of_the_pairs_differences_not_of_the_medians() -> None:
    # The machine drifts: the last pairs are slow on both sides. Each pair differs by 1 ms but
    # one; the difference of the two medians would say 8 ms.
    direct = [0.001, 0.001, 0.001, 0.009, 0.009]
    through = [0.002, 0.002, 0.009, 0.010, 0.010]
    assert added_p50_ms(through, direct) == pytest.approx(1.0)
    assert percentile_ms(through, 50) - percentile_ms(direct, 50) == pytest.approx(8.0)
    assert added_p50_ms([0.001, 0.001, 0.001], [0.010, 0.010, 0.010]) == pytest.approx(-9.0)


def test_added_p99_is_the_difference_of_each_sides_p99() -> None:
    direct = [0.001] * 99 + [0.002]
    through = [0.0015] * 98 + [0.010, 0.020]
    expected = percentile_ms(through, 99) - percentile_ms(direct, 99)
    assert added_p99_ms(through, direct) == pytest.approx(expected)
    assert expected > 5.0


@pytest.mark.parametrize(
    ("through", "direct"),
    [pytest.param([0.1], [0.1, 0.2], id="unpaired"), pytest.param([], [], id="empty")],
)
def test_unpaired_or_empty_samples_are_refused(through: list[float], direct: list[float]) -> None:
    with pytest.raises(ValueError, match="samples"):
        added_p50_ms(through, direct)


def test_cpu_per_1000_events() -> None:
    assert cpu_ms_per_1000_events(0.5, 10_000) == pytest.approx(50.0)
    with pytest.raises(ValueError, match="no events"):
        cpu_ms_per_1000_events(0.5, 0)


def test_median_of_runs_skips_runs_without_the_figure() -> None:
    assert median_of_runs([3.0, None, 1.0, 2.0]) == pytest.approx(2.0)
    assert median_of_runs([None, None]) is None
