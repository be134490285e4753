"""Reclaim times from hand-made trajectories: when a bursty tenant holds what it is owed."""

from __future__ import annotations

import pytest

from slotshift.bench.reclaim import holds_what_it_is_owed, reclaim
from slotshift.bench.sampler import Sample
from slotshift.bench.stats import Window

NOMINAL = 48
WINDOW = Window(10.0, 40.0)


def _at(t_s: float, in_flight: int, queued: int) -> Sample:
    return Sample(
        t_s=t_s, wall_s=t_s, in_flight={"A": in_flight, "B": 90}, queued={"A": queued, "B": 30}
    )


@pytest.mark.parametrize(
    ("in_flight", "queued", "held"),
    [
        pytest.param(0, 0, None, id="no demand: nothing to hold"),
        pytest.param(4, 0, True, id="runs all it asks for"),
        pytest.param(4, 6, False, id="queues below its nominal share"),
        pytest.param(48, 20, True, id="queues but runs its nominal share"),
    ],
)
def test_holding_what_is_owed(in_flight: int, queued: int, held: bool | None) -> None:
    assert holds_what_it_is_owed(_at(0.0, in_flight, queued), "A", NOMINAL) is held


def test_an_unread_tenant_has_no_reading() -> None:
    assert holds_what_it_is_owed(Sample(t_s=0.0, wall_s=0.0), "A", NOMINAL) is None


def test_each_burst_runs_from_its_start_to_the_first_sample_that_holds() -> None:
    samples = [
        # burst at 10 s: seen at 10.25, short until 11.5
        _at(10.0, 0, 0),
        _at(10.25, 4, 3),
        _at(10.5, 4, 8),
        _at(11.5, 12, 0),
        _at(12.0, 12, 2),  # short again later: the burst's reclaim is already over
        # burst at 20 s: held at the first sample that sees it
        _at(20.25, 0, 0),
        _at(20.5, 6, 0),
        # burst at 30 s: short at every sample until it ends at 35 s
        _at(30.25, 4, 10),
        _at(34.75, 4, 2),
        _at(35.25, 4, 0),  # after the burst: does not count
    ]
    measured = reclaim(samples, "A", NOMINAL, [(10.0, 15.0), (20.0, 25.0), (30.0, 35.0)], WINDOW)
    assert measured.times_s == pytest.approx((1.5, 0.5))
    assert measured.unresolved == 1
    assert measured.median_s == pytest.approx(1.0)
    assert measured.p90_s == pytest.approx(1.4)


def test_bursts_outside_the_window_or_never_seen_do_not_count() -> None:
    samples = [_at(5.25, 4, 9), _at(6.0, 9, 0), _at(20.5, 0, 0), _at(45.0, 1, 9)]
    bursts = [(5.0, 8.0), (20.0, 21.0), (42.0, 44.0)]
    measured = reclaim(samples, "A", NOMINAL, bursts, WINDOW)
    assert measured.times_s == ()
    assert measured.unresolved == 0
    assert measured.median_s is None
    assert measured.p90_s is None


def test_samples_need_not_come_in_order() -> None:
    samples = [_at(11.0, 9, 0), _at(10.5, 2, 5)]
    assert reclaim(samples, "A", NOMINAL, [(10.0, 15.0)], WINDOW).times_s == (1.0,)
