"""A fleet in the twin: every engine within its pool's budget, replicas sharing their model's
requests by room, and the router the production one."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Any

import pytest

from admission_gateway import routing
from slotshift_tools.bench.fleet import FleetRunResult, fleet_run_summary
from slotshift_tools.bench.scenario import Scenario, parse_scenario
from slotshift_tools.bench.trace import RequestStatus
from slotshift_tools.twin.fleet import replica_capacities, simulate_fleet_run

_SMALL = "qwen2.5-3b"
_LARGE = "qwen2.5-7b"


def _fleet(
    slow_replica: bool = False, grouped: bool = False, b_ceiling_slots: int | None = None
) -> Scenario:
    """Two replicas of the small model (budget 16 each; the second on the 7B profile when
    `slow_replica`) and a server of the large one (budget 8): an interactive and a backlogged
    batch tenant on the replicas (floors of 1 and B's `b_ceiling_slots` on each replica), a
    backlogged tenant on the large server. `grouped`: the replicas one replica group, its
    tenants stated once with the group-wide figures of the same bounds (twice each)."""
    group: dict[str, Any] = {"replica_group": "small"} if grouped else {}
    a_bounds: dict[str, Any] = {"pools": ["small-a", "small-b"]}
    b_bounds: dict[str, Any] = {
        "pools": {name: {"ceiling_slots": b_ceiling_slots} for name in ("small-a", "small-b")}
    }
    if grouped:
        a_bounds = {"replica_group": "small", "floor_slots": 2}
        b_bounds = {"replica_group": "small", "floor_slots": 2}
        if b_ceiling_slots is not None:
            b_bounds["ceiling_slots"] = 2 * b_ceiling_slots
    return parse_scenario(
        {
            "name": "fleet-test",
            "seed": 7,
            "pools": [
                {"name": "small-a", "models": [_SMALL], "budget_slots": 16, **group},
                {
                    "name": "small-b",
                    "models": [_SMALL],
                    "budget_slots": 16,
                    "profile": "h200-qwen2.5-7b" if slow_replica else "h200-qwen2.5-3b",
                    **group,
                },
                {
                    "name": "large",
                    "models": [_LARGE],
                    "budget_slots": 8,
                    "profile": "h200-qwen2.5-7b",
                },
            ],
            "tenants": [
                {
                    "name": "A",
                    "api_keys": ["key-a"],
                    "model": _SMALL,
                    **a_bounds,
                    "arrival": {"kind": "poisson", "rate_per_s": 4.0},
                    "prompt_tokens": 32,
                    "output_tokens": 32,
                    "slo": {"ttft_ms": 1000},
                },
                {
                    "name": "B",
                    "api_keys": ["key-b"],
                    "model": _SMALL,
                    **b_bounds,
                    "arrival": {"kind": "closed_loop", "outstanding": 40},
                    "prompt_tokens": 64,
                    "output_tokens": {"min_tokens": 48, "max_tokens": 80},
                    "preemptible": True,
                    "slo": {"e2el_ms": 20000},
                },
                {
                    "name": "C",
                    "api_keys": ["key-c"],
                    "model": _LARGE,
                    "pools": {"large": {"floor_slots": 2}},
                    "arrival": {"kind": "closed_loop", "outstanding": 12},
                    "prompt_tokens": 64,
                    "output_tokens": 64,
                    "slo": {"e2el_ms": 20000},
                },
            ],
            "policies": ["slo", "pool"],
            "warmup_s": 2.0,
            "steady_s": 10.0,
        }
    )


def _run(scenario: Scenario, run: str = "slo") -> FleetRunResult:
    result, _ = simulate_fleet_run(scenario, scenario.run(run), warmup_s=2.0, steady_s=10.0)
    return result


def _completed(result: FleetRunResult, pool: str) -> int:
    return sum(1 for t in result.pools[pool].result.traces if t.status is RequestStatus.OK)


@pytest.mark.parametrize("run", ["slo", "pool"])
def test_every_engine_stays_within_its_budget_and_equal_replicas_split_evenly(run: str) -> None:
    scenario = _fleet()
    started = time.process_time()
    result = _run(scenario, run)
    assert time.process_time() - started < 15.0
    for name, pool in result.pools.items():
        # Backlogged everywhere: each engine is filled to its budget, never above it.
        assert pool.engine_in_flight_peak == pool.budget_slots, name
    assert {t.pool for t in result.fleet.traces if t.tenant == "C"} == {"large"}
    assert {t.pool for t in result.fleet.traces if t.tenant != "C"} == {"small-a", "small-b"}
    a, b = _completed(result, "small-a"), _completed(result, "small-b")
    assert 0.45 <= a / (a + b) <= 0.55
    summary = fleet_run_summary(scenario, result, replica_capacities(scenario, result))
    assert all(p["within_budget"] for p in summary["pools"].values())
    assert summary["total"]["completed"] == sum(
        p["total"]["completed"] for p in summary["pools"].values()
    )


def test_the_faster_replica_completes_more_in_proportion_to_its_capacity() -> None:
    scenario = _fleet(slow_replica=True)
    result = _run(scenario)
    summary = fleet_run_summary(scenario, result, replica_capacities(scenario, result))
    replicas = summary["replicas"][_SMALL]
    fast, slow = replicas["small-a"], replicas["small-b"]
    assert fast["capacity_per_s"] > 1.3 * slow["capacity_per_s"]
    assert fast["share"] > 0.55
    assert fast["share_over_capacity_share"] == pytest.approx(1.0, abs=0.10)
    assert slow["share_over_capacity_share"] == pytest.approx(1.0, abs=0.10)


def test_a_replica_group_runs_as_the_per_pool_bounds_it_divides_into() -> None:
    """The replicas' tenants stated once as a group: the control plane's config divides them
    into the bounds the per-pool form states, and the run is the same request for request."""
    grouped, per_pool = _fleet(grouped=True, b_ceiling_slots=12), _fleet(b_ceiling_slots=12)
    group_run, pool_run = _run(grouped), _run(per_pool)
    for name in ("small-a", "small-b"):
        bounds = [
            (t.name, t.floor_slots, t.ceiling_slots)
            for t in group_run.pools[name].result.config.pools[0].tenants
        ]
        assert bounds == [("A", 1, None), ("B", 1, 12)]
        assert group_run.pools[name].result.config.pools[0].replica_group == "small"
        assert group_run.pools[name].engine_in_flight_peak <= 16
    assert [(t.tenant, t.pool, t.status, t.end_s) for t in group_run.fleet.traces] == [
        (t.tenant, t.pool, t.status, t.end_s) for t in pool_run.fleet.traces
    ]
    assert _completed(group_run, "small-a") > 0
    assert _completed(group_run, "small-b") > 0


def test_requests_go_where_the_production_router_sends_them(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """With admission_gateway.routing.route replaced by one that always takes the first
    replica, every request of the small model runs on small-a: the twin routes with it."""
    scenario = _fleet()
    production = routing.route
    calls: list[str] = []

    def first_replica(
        fronts: Sequence[Any], tenant: str, model: str | None, turn: int = 0
    ) -> routing.Routed:
        calls.append(tenant)
        routed = production(fronts, tenant, model, turn)
        if routed.pool == "small-b":
            return routing.Routed("small-a", routed.model)
        return routed

    monkeypatch.setattr(routing, "route", first_replica)
    result = _run(scenario)
    assert len(calls) == len(result.fleet.traces)
    assert _completed(result, "small-b") == 0
    assert _completed(result, "small-a") > 0
    # Still within budget: the gateways' admission, not the router, holds each engine there.
    assert result.pools["small-a"].engine_in_flight_peak <= 16
