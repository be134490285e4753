"""Demand dynamics: the timeline is the same in every process; requests drain at their own pace."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from slotshift_tools.scale.dynamics import DYNAMICS, DemandSettings, DemandTimeline, GatewayCells

SETTINGS = DemandSettings()
NOMINAL = [10, 10, 5, 25]


def timeline(dynamics: str, seed: int = 3, step_s: float = 0.25) -> DemandTimeline:
    return DemandTimeline(NOMINAL, dynamics, step_s=step_s, seed=seed, settings=SETTINGS)  # type: ignore[arg-type]


@pytest.mark.parametrize("dynamics", DYNAMICS)
def test_two_timelines_agree_at_every_step_whatever_steps_each_was_asked(dynamics: str) -> None:
    # One process asks every step, another only now and then: they must agree.
    every, sparse = timeline(dynamics), timeline(dynamics)
    for step in range(1, 200):
        every.advance_to(step)
        if step % 37 == 0:
            sparse.advance_to(step)
            np.testing.assert_array_equal(every.levels, sparse.levels)
            np.testing.assert_array_equal(every.bursting, sparse.bursting)


def test_an_earlier_step_leaves_the_levels_as_they_are() -> None:
    line = timeline("fluctuating")
    line.advance_to(10)
    before = line.levels.copy()
    line.advance_to(4)
    np.testing.assert_array_equal(line.levels, before)
    assert line.step == 10


def test_steady_levels_never_move() -> None:
    line = timeline("steady")
    first = line.levels.copy()
    line.advance_to(500)
    np.testing.assert_array_equal(line.levels, first)


def test_the_multipliers_spread_tenants_around_their_nominal_shares() -> None:
    line = DemandTimeline([10] * 2000, "steady", step_s=1.0, seed=1, settings=SETTINGS)
    factors = line.levels / 10
    assert factors.min() >= SETTINGS.multiplier_low
    assert factors.max() <= SETTINGS.multiplier_high
    assert factors.mean() == pytest.approx(1.0, abs=0.05)


def test_fluctuating_levels_move_and_keep_their_mean() -> None:
    line = DemandTimeline([10] * 50, "fluctuating", step_s=0.25, seed=5, settings=SETTINGS)
    base = DemandTimeline([10] * 50, "steady", step_s=0.25, seed=5, settings=SETTINGS).levels
    ratios = []
    for step in range(1, 2001):
        line.advance_to(step)
        ratios.append(line.levels / base)
    history = np.array(ratios)
    assert history.std(axis=0).min() > 0.1, "every tenant's level moves"
    assert history.mean() == pytest.approx(1.0, abs=0.1)


def test_bursty_tenants_burst_now_and_then_and_stop() -> None:
    line = DemandTimeline([10] * 20, "bursty", step_s=0.5, seed=2, settings=SETTINGS)
    base = DemandTimeline([10] * 20, "steady", step_s=0.5, seed=2, settings=SETTINGS).levels
    bursting_steps = 0
    for step in range(1, 1201):  # 600 s: each tenant bursts about 20 times
        line.advance_to(step)
        expected = np.where(line.bursting, SETTINGS.burst_factor, SETTINGS.idle_factor) * base
        np.testing.assert_allclose(line.levels, expected)
        bursting_steps += int(line.bursting.sum())
    # About burst_s / burst_every_s of the time bursting.
    share = bursting_steps / (1200 * 20)
    assert 0.08 < share < 0.25


def test_unknown_dynamics_are_refused() -> None:
    with pytest.raises(ValueError, match="unknown dynamics"):
        timeline("chaotic")


def cells(limits: list[int], wanted: list[int]) -> GatewayCells:
    result = GatewayCells(limits, max_queued=SETTINGS.max_queued)
    result.wanted = np.array(wanted, dtype=np.int64)
    return result


def test_requests_run_up_to_the_limit_and_the_rest_waits_a_few_at_most() -> None:
    gateway = cells([4, 10, 2], [3, 30, 2])
    gateway.admit()
    assert gateway.in_flight.tolist() == [3, 10, 2]
    assert gateway.queued.tolist() == [0, SETTINGS.max_queued, 0]
    assert gateway.admitted_total.tolist() == [3, 10, 2]


def test_a_shrink_never_ends_a_running_request_at_once() -> None:
    gateway = cells([10], [10])
    gateway.admit()
    gateway.apply_limits(np.array([2]))
    gateway.admit()
    assert gateway.in_flight.tolist() == [10]
    assert gateway.held().tolist() == [10], "it holds what runs until it drains"


def test_after_a_shrink_requests_drain_at_their_own_pace_and_none_is_admitted() -> None:
    rng = np.random.default_rng(0)
    gateway = cells([200], [200])
    gateway.admit()
    gateway.apply_limits(np.array([20]))
    history = []
    for _ in range(40):  # 10 s in steps of 0.25 s; mean service 2 s
        gateway.serve(0.25, mean_service_s=SETTINGS.mean_service_s, rng=rng)
        history.append(int(gateway.in_flight[0]))
    assert all(b <= a for a, b in itertools.pairwise(history)), "never rises"
    assert history[0] > 150, "a quarter second ends about an eighth, not all"
    assert history[-1] == 20, "drained down to the new limit, then held there"
    assert int(gateway.admitted_total[0]) == 200 + int(gateway.completed_total[0]) - 180


def test_a_raised_limit_lets_waiting_requests_in() -> None:
    gateway = cells([2], [6])
    gateway.admit()
    gateway.apply_limits(np.array([5]))
    gateway.admit()
    assert gateway.in_flight.tolist() == [5]
    assert gateway.queued.tolist() == [1]


def test_steady_cells_are_drawn_once_and_fluctuating_ones_move() -> None:
    rng = np.random.default_rng(1)
    share = np.full(200, 3.0)
    none = np.zeros(200, dtype=np.bool_)
    steady = GatewayCells([0] * 200, max_queued=8)
    moving = GatewayCells([0] * 200, max_queued=8)
    for gateway, dynamics in ((steady, "steady"), (moving, "fluctuating")):
        gateway.redraw(
            share,
            bursting=none,
            dynamics=dynamics,  # type: ignore[arg-type]
            dt_s=0.25,
            settings=SETTINGS,
            rng=rng,
        )
    first_steady, first_moving = steady.wanted.copy(), moving.wanted.copy()
    assert first_steady.mean() == pytest.approx(3.0, abs=0.5)
    for _ in range(8):  # 2 s: about 63 % of the cells redrawn
        steady.redraw(
            share, bursting=none, dynamics="steady", dt_s=0.25, settings=SETTINGS, rng=rng
        )
        moving.redraw(
            share, bursting=none, dynamics="fluctuating", dt_s=0.25, settings=SETTINGS, rng=rng
        )
    np.testing.assert_array_equal(steady.wanted, first_steady)
    assert np.count_nonzero(moving.wanted != first_moving) > 50


def test_a_bursty_cell_is_redrawn_when_its_tenant_starts_or_stops_bursting() -> None:
    rng = np.random.default_rng(4)
    gateway = GatewayCells([0, 0], max_queued=8)
    quiet = np.array([False, False])
    gateway.redraw(
        np.array([0.0, 0.0]),
        bursting=quiet,
        dynamics="bursty",
        dt_s=1e-9,
        settings=SETTINGS,
        rng=rng,
    )
    assert gateway.wanted.tolist() == [0, 0]
    burst = np.array([True, False])
    # A tiny dt: no random redraw, only the flip redraws tenant 0.
    gateway.redraw(
        np.array([50.0, 50.0]),
        bursting=burst,
        dynamics="bursty",
        dt_s=1e-9,
        settings=SETTINGS,
        rng=rng,
    )
    assert gateway.wanted[0] > 20
    assert gateway.wanted[1] == 0
