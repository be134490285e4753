"""controlplane/core/pacing.py: how long paced work rests."""

from __future__ import annotations

import pytest

from controlplane.core.pacing import paced_rest_s


@pytest.mark.parametrize(
    ("began_s", "ended_s", "min_interval_s", "max_cores", "rest_s"),
    [
        # Quick work: the interval paces it, counted from when it began.
        (10.0, 10.001, 0.01, 0.1, 0.009),
        # Work of 2 ms within a tenth of a core: 18 ms more, past the interval's end.
        (10.0, 10.002, 0.01, 0.1, 0.018),
        # Under a virtual clock work takes no time: the interval alone.
        (10.0, 10.0, 0.02, 0.1, 0.02),
        # Work that took longer than the interval, a whole core allowed: at once.
        (10.0, 10.5, 0.01, 1.0, 0.0),
    ],
)
def test_rest_is_the_interval_or_what_keeps_the_work_within_its_share_of_a_core(
    began_s: float, ended_s: float, min_interval_s: float, max_cores: float, rest_s: float
) -> None:
    assert paced_rest_s(began_s, ended_s, min_interval_s, max_cores) == pytest.approx(rest_s)


def test_busy_at_most_max_cores_over_a_run_of_work() -> None:
    now, busy = 0.0, 0.0
    for spent in [0.002, 0.0001, 0.005, 0.0, 0.003] * 20:
        began, now = now, now + spent
        busy += spent
        now += max(0.0, paced_rest_s(began, now, 0.001, 0.25))
    assert busy / now <= 0.25 + 1e-9
