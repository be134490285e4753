"""The statistics of one point: decisions, their timing, their acknowledgement, message rates."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from slotshift_tools.scale.figures import (
    DecisionTimes,
    Window,
    decision_figures,
    enforced_latencies,
    missed_periods,
    per_gateway_bytes_rate,
    per_gateway_rate,
    summary_ms,
)

WINDOW = Window(100.0, 120.0)


def decision(
    id: int, at: float, *, outcome: str = "published", trigger: str = "period", version: int = 0
) -> DecisionTimes:
    return DecisionTimes(
        id=id,
        decided_at_wall_s=at,
        duration_ms=float(id),
        outcome=outcome,
        trigger=trigger,
        version=version or id,
    )


def test_summary_uses_numpys_linear_percentiles() -> None:
    values = [float(v) for v in range(1, 101)]
    summary = summary_ms(values)
    assert summary == {
        "count": 100,
        "p50_ms": pytest.approx(float(np.percentile(values, 50))),
        "p99_ms": pytest.approx(float(np.percentile(values, 99))),
        "max_ms": 100.0,
    }


def test_no_values_have_no_statistics() -> None:
    assert summary_ms([]) == {"count": 0, "p50_ms": None, "p99_ms": None, "max_ms": None}


@pytest.mark.parametrize(
    ("times", "missed"),
    [
        pytest.param([101.0 + 2 * i for i in range(10)], 0, id="on-time"),
        pytest.param(
            [101.0, 103.0, 107.1, 109.0, 111.0, 113.0, 115.0, 117.0, 119.0],
            1,
            id="one-gap-of-two-periods",
        ),
        pytest.param([101.0, 119.5], 8, id="nearly-all-missed"),
        pytest.param([], 9, id="none"),
        pytest.param([95.0, 99.0, 121.0], 9, id="outside-the-window-do-not-count"),
    ],
)
def test_missed_periods_come_from_the_gaps(times: list[float], missed: int) -> None:
    assert missed_periods(times, WINDOW, 2.0) == missed


def test_decision_figures_count_the_window_only() -> None:
    decisions = [
        decision(1, 99.0),
        decision(2, 101.0),
        decision(3, 101.5, trigger="fast path: t1's queue grew"),
        decision(4, 103.0, outcome="held"),
        decision(5, 105.0, outcome="rejected"),
        decision(6, 121.0),
    ]
    figures = decision_figures(decisions, WINDOW, 2.0)
    assert figures["made"] == 4
    assert figures["period_triggered"] == 3
    assert figures["fast_path"] == 1
    assert figures["published"] == 2
    assert figures["rejected"] == 1
    assert figures["periods_elapsed"] == 10.0
    assert figures["max_gap_s"] == 2.0
    assert figures["duration"]["count"] == 4  # type: ignore[index]
    assert figures["duration"]["max_ms"] == 5.0  # type: ignore[index]


def test_a_decision_is_acknowledged_when_the_control_plane_saw_it_enforced() -> None:
    decisions = [
        enforced(decision(1, 101.0, version=5), 101.050),
        enforced(decision(2, 103.0, version=8), 103.100),
        enforced(decision(3, 99.0, version=4), 99.5),
    ]
    latencies, unacknowledged = enforced_latencies(decisions, WINDOW)
    assert latencies == pytest.approx([0.050, 0.100]), "only the window's decisions"
    assert unacknowledged == 0


def test_a_decision_not_enforced_is_counted_apart() -> None:
    decisions = [decision(1, 101.0, version=5), decision(2, 102.0, outcome="held", version=6)]
    latencies, unacknowledged = enforced_latencies(decisions, WINDOW)
    assert latencies == []
    assert unacknowledged == 1, "held decisions publish nothing and are not counted"


def test_an_enforcement_stamped_a_hair_before_the_decision_counts_as_zero() -> None:
    latencies, _ = enforced_latencies([enforced(decision(1, 101.0, version=5), 100.9999)], WINDOW)
    assert latencies == [0.0]


def enforced(d: DecisionTimes, at: float) -> DecisionTimes:
    return dataclasses.replace(d, enforced_at_wall_s=at)


def test_rates_are_per_gateway_per_second_of_the_window() -> None:
    times = [99.0, 100.0, 110.0, 120.0, 121.0]
    assert per_gateway_rate(times, WINDOW, 3) == pytest.approx(3 / 3 / 20)
    assert per_gateway_bytes_rate(times, [1, 10, 20, 30, 1000], WINDOW, 2) == pytest.approx(
        60 / 2 / 20
    )
