"""The frontier's oracle, bound and search on a tiny scenario (deterministic, a few seconds)."""

from __future__ import annotations

from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from slotshift_tools.bench.scenario import Scenario, Slo, load_scenario, parse_scenario
from slotshift_tools.bench.stats import Window
from slotshift_tools.bench.trace import RequestStatus, RequestTrace
from slotshift_tools.twin.command import simulate_scenario
from slotshift_tools.twin.frontier import (
    NOMINAL_STATIC,
    OracleRun,
    Schedule,
    attainment,
    candidate_schedules,
    feasible_at,
    frontier_points,
    frontier_problem,
    goodput,
    is_lender_safe,
    lender_safe_runs,
    lp_dual_bound,
    nominal_static_run,
    output_throughput,
    simulate_schedule,
    throughput_bound,
)

_OPEN_LOOP_LENDER = {
    "arrival": {"kind": "on_off", "on_s": 1.0, "off_s": 1.0, "rate_per_s": 20.0},
    "slo": {"ttft_ms": 150, "e2el_ms": 600},
}
"""A bursty open-loop tenant with a TTFT objective tight enough that the split matters."""

_CLOSED_LOOP_LENDER = {
    "arrival": {"kind": "on_off", "on_s": 1.0, "off_s": 1.0, "concurrency": 6},
    "slo": {"ttft_ms": 1000, "e2el_ms": 3000},
}
"""A closed loop that switches on and off (6 clients, half the budget), with objectives loose
enough that every split meets them."""


def _tiny(gateways: int = 1, lender: dict[str, Any] = _OPEN_LOOP_LENDER) -> Scenario:
    """The lender A beside a backlogged preemptible batch tenant B on 12 slots."""
    return parse_scenario(
        {
            "name": "tiny",
            "seed": 7,
            "budget_slots": 12,
            "gateways": gateways,
            "tenants": [
                {
                    "name": "A",
                    "api_keys": ["key-a"],
                    "floor_slots": 1,
                    "prompt_tokens": 64,
                    "output_tokens": 32,
                    **lender,
                },
                {
                    "name": "B",
                    "api_keys": ["key-b"],
                    "floor_slots": 1,
                    "preemptible": True,
                    "arrival": {"kind": "closed_loop", "outstanding": 16},
                    "prompt_tokens": 128,
                    "output_tokens": {"min_tokens": 96, "max_tokens": 160},
                    "slo": {"e2el_ms": 4000},
                },
            ],
            "policies": ["static"],
            "warmup_s": 1.0,
            "steady_s": 5.0,
        }
    )


@cache
def _candidates(scenario: str = "tiny") -> tuple[OracleRun, ...]:
    lender = _OPEN_LOOP_LENDER if scenario == "tiny" else _CLOSED_LOOP_LENDER
    problem = frontier_problem(_tiny(lender=lender))
    return tuple(simulate_schedule(problem, s) for s in candidate_schedules(problem, quick=True))


def test_the_oracle_is_deterministic() -> None:
    problem = frontier_problem(_tiny())
    schedule = Schedule("forecast-pause", True, None, headroom_slots=0, lookahead_s=0.0)
    first = simulate_schedule(problem, schedule)
    second = simulate_schedule(problem, schedule)
    assert [t.to_json() for t in first.traces] == [t.to_json() for t in second.traces]
    assert first.pauses > 0  # pausing was exercised


def test_every_candidate_respects_the_budget() -> None:
    runs = _candidates()
    assert {r.schedule.pausing for r in runs} == {False, True}
    for run in runs:
        assert run.max_limits_sum <= 12, run.schedule.name
        assert run.max_in_engine <= 12, run.schedule.name


def test_the_split_matters_on_the_tiny_scenario() -> None:
    # Otherwise the frontier tests below would compare equal numbers.
    runs = _candidates()
    assert len({round(r.output_throughput) for r in runs}) > 3
    assert len({round(r.min_attainment, 3) for r in runs}) > 2


def test_the_bound_is_never_below_a_candidate() -> None:
    problem = frontier_problem(_tiny())
    without = throughput_bound(problem, pausing=False).total_tok_s
    with_pausing = throughput_bound(problem, pausing=True).total_tok_s
    for run in _candidates():
        bound = with_pausing if run.schedule.pausing else without
        assert run.output_throughput <= bound, run.schedule.name


def test_the_bound_holds_on_the_seed_scenario_too() -> None:
    from pathlib import Path

    from slotshift_tools.bench.scenario import load_scenario

    seed = Path(__file__).resolve().parents[4] / "bench" / "scenarios" / "seed.yaml"
    problem = frontier_problem(load_scenario(seed), warmup_s=2.0, steady_s=10.0)
    bound = throughput_bound(problem, pausing=True)
    for schedule in (
        Schedule("static-4", False, (4, 92)),
        Schedule("forecast-pause", True, None, 0, 0.0),
    ):
        run = simulate_schedule(problem, schedule)
        assert run.output_throughput <= bound.total_tok_s
    # The bound's own term is below the pool's capacity with every slot busy at the cheapest
    # tokens: a sanity check that the LP is not trivially loose.
    assert bound.inside_tok_s < 20_000


def test_f_is_non_increasing_in_a() -> None:
    runs = list(_candidates())
    levels = [0.0, 0.3, 0.5, 0.7, 0.8, 0.9, 0.95, 0.99, 1.0]
    points = frontier_points(runs, 1e9, levels)
    values = [p.feasible_tok_s if p.feasible_tok_s is not None else -1.0 for p in points]
    assert values == sorted(values, reverse=True)
    assert values[0] == max(r.output_throughput for r in runs)


def test_a_static_schedule_in_the_oracle_matches_the_twins_static_run() -> None:
    """One gateway, so that the twin's admission is one FIFO per tenant as the oracle's.
    What may still differ: the twin's request reaches the engine after the control plane
    has pushed the limits (the first 1-2 ms), and its clients see tokens through the gateway's
    callbacks in the same virtual instant; 1% covers that."""
    scenario = _tiny(gateways=1)
    problem = frontier_problem(scenario)
    twin = simulate_scenario(scenario, steady_s=problem.steady_s, warmup_s=problem.warmup_s)
    result = twin["static"].result
    nominal = candidate_schedules(problem, quick=True)[0]
    assert nominal.static_limits == (6, 6)
    oracle = simulate_schedule(problem, nominal)
    twin_tok_s = output_throughput(result.traces, result.window)
    assert oracle.output_throughput == pytest.approx(twin_tok_s, rel=0.01)
    twin_attainment = attainment(result.traces, result.window, problem.slos)
    for name, value in oracle.attainment.items():
        assert value == pytest.approx(twin_attainment[name], abs=0.02)


def test_attainment_counts_requests_that_missed_their_objective_unanswered() -> None:
    window = Window(0.0, 10.0)
    slo = Slo(ttft_ms=1000, e2el_ms=3000)
    good = RequestTrace("A", 0, 8, 8, 1.0, first_token_s=1.5, end_s=2.0, output_tokens=8)
    good.status = RequestStatus.OK
    slow = RequestTrace("A", 0, 8, 8, 1.0, first_token_s=3.0, end_s=5.0, output_tokens=8)
    slow.status = RequestStatus.OK
    starved = RequestTrace("A", 0, 8, 8, 2.0, end_s=10.0, status=RequestStatus.CANCELLED)
    recent = RequestTrace("A", 0, 8, 8, 9.5, end_s=10.0, status=RequestStatus.CANCELLED)
    result = attainment([good, slow, starved, recent], window, {"A": slo, "B": slo})
    assert result == {"A": pytest.approx(1 / 3), "B": None}


def test_the_lp_bound_is_the_optimum_of_a_known_lp() -> None:
    # max x + y subject to x + 2y <= 4, 3x + y <= 6: optimum at (1.6, 1.2), value 2.8.
    a = np.array([[1.0, 2.0], [3.0, 1.0]])
    assert lp_dual_bound(a, np.array([4.0, 6.0]), np.array([1.0, 1.0])) == pytest.approx(2.8)
    # An unbounded LP is refused, not bounded.
    with pytest.raises(ValueError, match="unbounded"):
        lp_dual_bound(np.array([[1.0, -1.0]]), np.array([1.0]), np.array([1.0, 1.0]))


def test_goodput_counts_the_completed_requests_that_meet_their_objectives() -> None:
    window = Window(0.0, 10.0)
    slo = Slo(ttft_ms=1000, e2el_ms=3000)
    good = RequestTrace("A", 0, 8, 8, 1.0, first_token_s=1.5, end_s=2.0, output_tokens=8)
    good.status = RequestStatus.OK
    slow = RequestTrace("A", 0, 8, 8, 1.0, first_token_s=3.0, end_s=5.0, output_tokens=8)
    slow.status = RequestStatus.OK
    failed = RequestTrace("A", 0, 8, 8, 2.0, end_s=2.5, status=RequestStatus.FAILED)
    outside = RequestTrace("A", 0, 8, 8, 10.5, first_token_s=10.6, end_s=11.0, output_tokens=8)
    outside.status = RequestStatus.OK
    result = goodput([good, slow, failed, outside], window, {"A": slo, "B": slo})
    assert result == {"A": pytest.approx(0.1), "B": 0.0}


def test_lender_safety_is_every_tenants_goodput_against_the_static_split() -> None:
    static = {"A": 20.0, "B": 8.0, "C": 0.0}
    assert is_lender_safe(static, static)
    assert is_lender_safe({"A": 19.8, "B": 12.0, "C": 0.0}, static)
    assert not is_lender_safe({"A": 19.7, "B": 12.0, "C": 1.0}, static)
    assert not is_lender_safe({"B": 12.0}, static), "a tenant left out served nothing"


def test_f_rewards_slowing_a_closed_loop_lender_and_f_safe_does_not() -> None:
    """Attainment cannot see a closed-loop lender made slower: one slot for it keeps every
    request within its objectives, and its other slots serve the batch tenant. F(1) takes that
    schedule; F_safe(1) takes one that serves the lender as the static split does."""
    runs = list(_candidates("closed-lender"))
    static = nominal_static_run(runs)
    assert static is not None and static.schedule.name == NOMINAL_STATIC
    best = feasible_at(runs, 1.0)
    assert best is not None and best.min_attainment == 1.0
    assert best.goodput["A"] < 0.5 * static.goodput["A"]
    safe = lender_safe_runs(runs)
    assert static in safe and best not in safe
    best_safe = feasible_at(safe, 1.0)
    assert best_safe is not None
    assert best_safe.goodput["A"] >= 0.99 * static.goodput["A"]
    assert static.output_throughput < best_safe.output_throughput < best.output_throughput


def test_f_safe_is_never_above_f() -> None:
    levels = [0.0, 0.5, 0.9, 1.0]
    for scenario in ("tiny", "closed-lender"):
        runs = list(_candidates(scenario))
        everything = frontier_points(runs, 1e9, levels)
        safe = frontier_points(lender_safe_runs(runs), 1e9, levels)
        for all_point, safe_point in zip(everything, safe, strict=True):
            if safe_point.feasible_tok_s is not None:
                assert all_point.feasible_tok_s is not None
                assert safe_point.feasible_tok_s <= all_point.feasible_tok_s


def test_schedules_that_guard_the_shares_never_cut_a_backlogged_tenant_below_its_share() -> None:
    for scenario in ("tiny", "closed-lender"):
        runs = list(_candidates(scenario))
        guarded = [r for r in runs if r.schedule.guards_shares]
        assert len(guarded) > 1
        assert all(r.share_shortfall_slots == 0 for r in guarded)
        assert any(r.share_shortfall_slots > 0 for r in runs if not r.schedule.guards_shares)
        assert all(r.schedule.guards_shares for r in lender_safe_runs(runs))


def test_the_bound_is_found_on_every_shipped_single_pool_scenario() -> None:
    """The LP's dual point is made feasible despite rounding (unequal-weights' once missed by
    1.8e-15 on its step columns)."""
    scenarios = Path(__file__).resolve().parents[4] / "bench" / "scenarios"
    checked = 0
    for path in sorted(scenarios.glob("*.yaml")):
        scenario = load_scenario(path)
        if scenario.pools:
            continue  # a fleet: the frontier is per pool
        problem = frontier_problem(scenario)
        for pausing in (False, True):
            assert throughput_bound(problem, pausing=pausing).total_tok_s > 0
        checked += 1
    assert checked >= 7
