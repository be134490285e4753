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
    WindowFigures,
    attainment,
    candidate_schedules,
    feasible_at,
    frontier_points,
    frontier_problem,
    goodput,
    is_lender_safe,
    lender_safe_runs,
    lp_dual_bound,
    mean_figures,
    nominal_static_run,
    output_throughput,
    simulate_schedule,
    throughput_bound,
    window_bound,
    window_figures,
    window_offsets,
)
from slotshift_tools.twin.frontier_command import place

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


_OFFSETS_S = (0.0, 0.7, 1.5)
"""Three windows on the tiny scenario, apart by less than a request of B lasts (about 1-2 s),
so that one window catches ends that another misses."""


@cache
def _candidates(
    scenario: str = "tiny", offsets_s: tuple[float, ...] = (0.0,)
) -> tuple[OracleRun, ...]:
    lender = _OPEN_LOOP_LENDER if scenario == "tiny" else _CLOSED_LOOP_LENDER
    problem = frontier_problem(_tiny(lender=lender), window_offsets_s=offsets_s)
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


@pytest.mark.parametrize("offsets_s", [(0.0,), _OFFSETS_S])
def test_the_bound_is_never_below_a_candidate(offsets_s: tuple[float, ...]) -> None:
    problem = frontier_problem(_tiny(), window_offsets_s=offsets_s)
    without = throughput_bound(problem, pausing=False).total_tok_s
    with_pausing = throughput_bound(problem, pausing=True).total_tok_s
    for run in _candidates("tiny", offsets_s):
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


# --- window averaging ------------------------------------------------------------------------


def test_window_offsets_are_evenly_spaced_from_the_warmups_end() -> None:
    assert window_offsets(1) == (0.0,)
    assert window_offsets(4, 2.5) == (0.0, 2.5, 5.0, 7.5)
    with pytest.raises(ValueError, match="at least 1"):
        window_offsets(0)
    with pytest.raises(ValueError, match="positive"):
        window_offsets(3, 0.0)
    with pytest.raises(ValueError, match="increase"):
        frontier_problem(_tiny(), window_offsets_s=(0.0, 2.0, 1.0))
    problem = frontier_problem(_tiny(), window_offsets_s=(0.0, 2.0))
    assert problem.windows == (Window(1.0, 6.0), Window(3.0, 8.0))
    assert problem.horizon_s == 8.0


def test_a_candidates_figures_are_the_means_over_its_windows() -> None:
    problem = frontier_problem(_tiny(), window_offsets_s=_OFFSETS_S)
    run = simulate_schedule(problem, Schedule("forecast-pause", True, None, 0, 0.0))
    assert run.traces[-1].start_s > problem.windows[-1].start_s  # simulated to the last end
    per_window = [window_figures(run.traces, w, problem.slos) for w in problem.windows]
    assert list(run.per_window) == per_window
    outputs = [f.output_throughput for f in per_window]
    assert len(set(outputs)) == len(outputs), "the windows must differ for the test to mean much"
    assert run.output_throughput == pytest.approx(sum(outputs) / 3)
    for tenant in ("A", "B"):
        values = [f.attainment[tenant] for f in per_window]
        assert all(v is not None for v in values)
        assert run.attainment[tenant] == pytest.approx(sum(v or 0.0 for v in values) / 3)
        assert run.goodput[tenant] == pytest.approx(sum(f.goodput[tenant] for f in per_window) / 3)
    assert run.min_attainment == min(v for v in run.attainment.values() if v is not None)


def test_mean_figures_average_attainment_over_the_windows_where_a_tenant_had_requests() -> None:
    first = WindowFigures(100.0, {"A": 1.0, "B": None, "C": None}, {"A": 2.0, "B": 0.0, "C": 0.0})
    second = WindowFigures(300.0, {"A": 0.5, "B": 0.8, "C": None}, {"A": 1.0, "B": 3.0, "C": 0.0})
    mean = mean_figures([first, second])
    assert mean == WindowFigures(
        200.0, {"A": 0.75, "B": 0.8, "C": None}, {"A": 1.5, "B": 1.5, "C": 0.0}
    )
    assert mean.min_attainment == 0.75
    assert mean_figures([first]) is first
    with pytest.raises(ValueError, match="no window"):
        mean_figures([])


def test_one_window_is_the_bench_window_figure_for_figure() -> None:
    """--window-offsets 1: the run ends at the window's end, and every figure is the bench's
    one-window function of it (what the frontier computed before the averaging)."""
    problem = frontier_problem(_tiny(), window_offsets_s=window_offsets(1))
    window = Window(1.0, 6.0)
    assert problem.windows == (window,) and problem.horizon_s == 6.0
    runs = _candidates()
    for run in runs:
        assert run.windows == (window,)
        assert run.output_throughput == output_throughput(run.traces, window)
        assert run.attainment == attainment(run.traces, window, problem.slos)
        assert run.goodput == goodput(run.traces, window, problem.slos)
    for pausing in (False, True):
        assert throughput_bound(problem, pausing=pausing) == window_bound(
            problem, window, pausing=pausing
        )
    for point in frontier_points(list(runs), 1e9, [0.5, 0.9, 1.0]):
        eligible = [
            output_throughput(r.traces, window)
            for r in runs
            if min(v for v in attainment(r.traces, window, problem.slos).values() if v is not None)
            >= point.level
        ]
        assert point.feasible_tok_s == max(eligible)
        assert point.by_window_tok_s == (point.feasible_tok_s,)


def test_the_mean_bound_is_the_mean_of_the_windows_bounds() -> None:
    problem = frontier_problem(_tiny(), window_offsets_s=_OFFSETS_S)
    bounds = [window_bound(problem, w, pausing=True) for w in problem.windows]
    mean = throughput_bound(problem, pausing=True)
    assert mean.carry_in_tok_s == pytest.approx(sum(b.carry_in_tok_s for b in bounds) / 3)
    assert mean.inside_tok_s == pytest.approx(sum(b.inside_tok_s for b in bounds) / 3)


def _scored(name: str, output: float, goodput_a: list[float], guards: bool = True) -> OracleRun:
    per_window = tuple(
        WindowFigures(output, {"A": 1.0, "B": 1.0}, {"A": value, "B": 5.0}) for value in goodput_a
    )
    return OracleRun(
        schedule=Schedule(
            name,
            False,
            static_limits=(6, 6) if name == NOMINAL_STATIC else None,
            guards_shares=guards,
        ),
        traces=[],
        windows=tuple(Window(float(k), k + 5.0) for k in range(len(goodput_a))),
        per_window=per_window,
        mean=mean_figures(per_window),
        max_in_engine=12,
        max_limits_sum=12,
        share_shortfall_slots=0,
        pauses=0,
        cpu_s=0.0,
    )


def test_f_safe_judges_lender_safety_on_the_mean_goodput() -> None:
    """Each tenant's goodput over the windows' mean against the static split's mean: a window
    where a candidate happens to serve the lender less does not rule it out, nor does one where
    it happens to serve it more rule it in."""
    static = _scored(NOMINAL_STATIC, 1000.0, [10.0, 10.0])
    even = _scored("even", 1100.0, [9.0, 11.0])  # mean 10.0: safe; its first window 0.90x
    lucky = _scored("lucky", 1200.0, [10.5, 9.0])  # mean 9.75 (0.975x): unsafe; first 1.05x
    unguarded = _scored("unguarded", 1300.0, [10.0, 10.0], guards=False)
    runs = [static, even, lucky, unguarded]
    assert lender_safe_runs(runs) == [static, even]
    best_safe = feasible_at(lender_safe_runs(runs), 1.0)
    assert best_safe is even
    best = feasible_at(runs, 1.0)
    assert best is unguarded


def test_a_policy_is_placed_by_its_means_and_each_windows_ratio() -> None:
    """The nominal static split's own records placed as a policy: its means are the
    candidate's, it is lender-safe, and in each window its ratio is its throughput there over
    the best candidate's there."""
    problem = frontier_problem(_tiny(), window_offsets_s=_OFFSETS_S)
    runs = list(_candidates("tiny", _OFFSETS_S))
    static = nominal_static_run(runs)
    assert static is not None
    safe = lender_safe_runs(runs)
    point = place("static", static.traces, problem, runs, safe)
    assert point.output_tok_s == static.output_throughput
    assert point.per_window == static.per_window
    assert point.attainment == static.attainment
    assert point.lender_safe
    assert all(v == 1.0 for v in point.goodput_vs_static.values() if v is not None)
    best = feasible_at(runs, static.min_attainment)
    assert best is not None and point.frontier_tok_s == best.output_throughput
    for index, ratio in enumerate(point.window_ratios):
        there = feasible_at(runs, static.per_window[index].min_attainment, window_index=index)
        assert there is not None
        expected = (
            static.per_window[index].output_throughput / there.per_window[index].output_throughput
        )
        assert ratio == pytest.approx(expected)
    assert len(point.window_ratios) == 3
