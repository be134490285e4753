"""A tenant's burst history: what counts as a burst, its peak, and the decaying percentile."""

from __future__ import annotations

import pytest

from controlplane.core.learned_reserves import (
    FORGET_AFTER_HALF_LIVES,
    MAX_BURSTS,
    Burst,
    BurstHistory,
    learned_reserve,
    observe,
)
from slotshift.config import SloPolicyConfig

SETTINGS = SloPolicyConfig(
    learned_reserves=True,
    reserve_percentile=95,
    reserve_burst_window_s=1.0,
    reserve_history_half_life_s=10.0,
)


def _run(demands: list[tuple[float, int]], settings: SloPolicyConfig = SETTINGS) -> BurstHistory:
    history: BurstHistory | None = None
    for now_s, demand in demands:
        history = observe(history, demand, now_s, settings)
    assert history is not None
    return history


def _reserve(history: BurstHistory, now_s: float, settings: SloPolicyConfig = SETTINGS) -> int:
    return learned_reserve(
        history, now_s, settings, floor_slots=1, nominal_slots=48, configured_slots=7
    )


def test_a_burst_is_its_peak_within_the_window_from_idle() -> None:
    history = _run([(0.0, 0), (0.2, 3), (0.9, 12), (1.3, 30), (1.5, 0)])
    assert history.bursts == (Burst(peak_slots=12, started_s=0.2),)
    assert history.open_started_s is None


def test_demand_seen_first_or_never_falling_to_idle_is_no_burst() -> None:
    assert _run([(0.0, 5), (2.0, 9), (4.0, 1), (6.0, 8)]).bursts == ()


def test_the_idle_threshold_sets_what_counts_as_idle() -> None:
    settings = SETTINGS.model_copy(update={"reserve_idle_demand_slots": 2})
    history = _run([(0.0, 2), (1.0, 9), (3.0, 2)], settings)
    assert history.bursts == (Burst(9, 1.0),)


def test_without_bursts_the_configured_reserve_applies() -> None:
    assert _reserve(BurstHistory(), 0.0) == 7
    assert (
        learned_reserve(None, 0.0, SETTINGS, floor_slots=9, nominal_slots=48, configured_slots=7)
        == 9
    )


def test_old_bursts_weigh_less_and_are_forgotten() -> None:
    history = BurstHistory(bursts=(Burst(30, 0.0), Burst(2, 100.0), Burst(4, 100.0)))
    # At t=100 the burst of 30 weighs 2**-10 against 1 each: the 95th percentile is 4.
    assert _reserve(history, 100.0) == 4
    # Of equal weight it is the 95th percentile.
    assert _reserve(BurstHistory(bursts=(Burst(30, 100.0), *history.bursts[1:])), 100.0) == 30
    later = observe(history, 0, FORGET_AFTER_HALF_LIVES * 10.0 + 0.5, SETTINGS)
    assert later.bursts == history.bursts[1:], "older than ten half-lives: dropped"


@pytest.mark.parametrize(("percentile", "reserve"), [(50, 4), (66, 4), (67, 30), (100, 30)])
def test_the_percentile_is_of_the_bursts_weights(percentile: float, reserve: int) -> None:
    settings = SETTINGS.model_copy(update={"reserve_percentile": percentile})
    history = BurstHistory(bursts=(Burst(30, 0.0), Burst(2, 0.0), Burst(4, 0.0)))
    assert _reserve(history, 0.0, settings) == reserve


def test_the_history_keeps_the_newest_bursts() -> None:
    demands = []
    for index in range(MAX_BURSTS + 6):
        start = index * 3.0
        demands += [(start, 0), (start + 0.5, index + 1), (start + 2.0, 0)]
    history = _run(demands, SETTINGS.model_copy(update={"reserve_history_half_life_s": 600.0}))
    assert len(history.bursts) == MAX_BURSTS
    assert history.bursts[-1].peak_slots == MAX_BURSTS + 6
    assert history.bursts[0].peak_slots == 7
