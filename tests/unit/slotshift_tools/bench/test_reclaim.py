"""Reclaim times from hand-made trajectories: how long a bursty tenant is short of its slots;
bursts' start waits from hand-made requests."""

from __future__ import annotations

import pytest

from slotshift_tools.bench.reclaim import burst_start_ttft_s, is_short, reclaim
from slotshift_tools.bench.sampler import Sample
from slotshift_tools.bench.stats import Window
from tests.unit.slotshift_tools.bench.traces import done, failed

NOMINAL = 48
WINDOW = Window(10.0, 40.0)


def _at(t_s: float, in_flight: int, queued: int) -> Sample:
    return Sample(
        t_s=t_s, wall_s=t_s, in_flight={"A": in_flight, "B": 90}, queued={"A": queued, "B": 30}
    )


@pytest.mark.parametrize(
    ("in_flight", "queued", "short"),
    [
        pytest.param(0, 0, False, id="idle"),
        pytest.param(4, 0, False, id="runs all it asks for"),
        pytest.param(4, 6, True, id="queues below its nominal share"),
        pytest.param(48, 20, False, id="queues but runs its nominal share"),
    ],
)
def test_short_means_queueing_below_the_nominal_share(
    in_flight: int, queued: int, short: bool
) -> None:
    assert is_short(_at(0.0, in_flight, queued), "A", NOMINAL) is short


def test_an_unread_tenant_has_no_reading() -> None:
    assert is_short(Sample(t_s=0.0, wall_s=0.0), "A", NOMINAL) is None


def test_each_burst_is_timed_by_its_first_shortfall() -> None:
    samples = [
        # burst at 10 s: short from 10.5 to 11.75, short again later (not counted)
        _at(10.0, 0, 0),
        _at(10.25, 4, 0),
        _at(10.5, 4, 8),
        _at(11.5, 9, 2),
        _at(11.75, 12, 0),
        _at(13.0, 12, 2),
        # burst at 20 s: never short
        _at(20.25, 3, 0),
        _at(20.5, 6, 0),
        # burst at 30 s: short until it ends at 35 s
        _at(30.25, 4, 10),
        _at(34.75, 4, 2),
        _at(35.25, 4, 0),  # after the burst: does not count
    ]
    measured = reclaim(samples, "A", NOMINAL, [(10.0, 15.0), (20.0, 25.0), (30.0, 35.0)], WINDOW)
    assert measured.times_s == pytest.approx((1.25, 0.0))
    assert (measured.bursts, measured.short_bursts, measured.unresolved) == (3, 2, 1)
    assert measured.median_s == pytest.approx(0.625)
    assert measured.p90_s == pytest.approx(1.125)


def test_bursts_outside_the_window_or_without_readings_do_not_count() -> None:
    samples = [_at(5.25, 4, 9), _at(6.0, 9, 0), _at(45.0, 1, 9)]
    bursts = [(5.0, 8.0), (20.0, 21.0), (42.0, 44.0)]
    measured = reclaim(samples, "A", NOMINAL, bursts, WINDOW)
    assert measured.times_s == ()
    assert measured.bursts == 0
    assert measured.median_s is None
    assert measured.p90_s is None


def test_samples_need_not_come_in_order() -> None:
    samples = [_at(11.0, 9, 0), _at(10.5, 2, 5)]
    assert reclaim(samples, "A", NOMINAL, [(10.0, 15.0)], WINDOW).times_s == (0.5,)


def test_a_bursts_start_wait_is_the_slowest_first_token_of_its_first_second() -> None:
    traces = [
        done("A", 12.0, 0.05, [0.01]),
        done("A", 12.0, 0.30, [0.01]),  # the slowest of the burst's first second
        done("A", 12.9, 0.10, [0.01]),
        done("A", 13.5, 2.00, [0.01]),  # sent after the first second: not the start's
        done("B", 12.0, 5.00, [0.01]),  # another tenant
        failed("A", 12.1, 20.0),  # no first token
        done("A", 24.0, 0.02, [0.01]),
        done("A", 5.0, 9.0, [0.01]),  # a burst before the window
    ]
    bursts = [(5.0, 9.0), (12.0, 16.0), (24.0, 28.0), (36.0, 40.0)]
    waits = burst_start_ttft_s(traces, "A", bursts, WINDOW)
    # The burst at 36 s sent nothing: left out.
    assert waits == pytest.approx((0.30, 0.02))


def test_a_burst_shorter_than_a_second_counts_only_its_own_requests() -> None:
    traces = [done("A", 12.0, 0.05, [0.01]), done("A", 12.6, 3.0, [0.01])]
    assert burst_start_ttft_s(traces, "A", [(12.0, 12.5)], WINDOW) == pytest.approx((0.05,))
