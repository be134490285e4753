"""Scenario files: the seed loads as the study describes it; mistakes are refused by name."""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import pytest

from slotshift.apportion import nominal_shares
from slotshift.config import apply_overrides, parse_config
from slotshift_tools.bench.arrivals import on_windows
from slotshift_tools.bench.scenario import (
    ClosedLoopArrival,
    OnOffArrival,
    Scenario,
    ScenarioError,
    TokenRange,
    load_scenario,
    parse_scenario,
)
from slotshift_tools.bench.stack_config import StackPorts, merged_overrides, stack_config_data

SEED = Path(__file__).resolve().parents[4] / "bench" / "scenarios" / "seed.yaml"
PORTS = StackPorts(8000, 50051, 9100, 9101, (8080, 8081))


def test_the_seed_scenario_is_the_studys_setup() -> None:
    scenario = load_scenario(SEED)
    assert scenario.budget_slots == 96
    assert scenario.decision_period_s == 2.0
    assert scenario.steady_s == 90.0
    assert [r.name for r in scenario.policies] == [
        "static",
        "demand",
        "slo",
        "slo-no-preempt",
        "pool",
    ]
    a, b = scenario.tenant("A"), scenario.tenant("B")
    assert isinstance(a.arrival, OnOffArrival)
    assert a.arrival.rate_per_s is not None  # interactive: open loop while on
    assert a.output_tokens == 64
    assert isinstance(b.arrival, ClosedLoopArrival)
    assert b.arrival.outstanding > scenario.budget_slots  # B is backlogged under any split
    assert b.output_tokens == TokenRange(min_tokens=448, max_tokens=576)  # 512 on average
    assert a.weight == b.weight  # static gives {A: 48, B: 48}
    assert b.preemptible and not a.preemptible  # the batch tenant's borrowed work yields
    (no_preempt,) = [r for r in scenario.policies if r.name == "slo-no-preempt"]
    assert no_preempt.config_overrides == {"pools.0.preemption.enabled": False}


@pytest.mark.parametrize("path", sorted(SEED.parent.glob("*.yaml")), ids=lambda path: path.stem)
def test_every_shipped_scenario_loads(path: Path) -> None:
    scenario = load_scenario(path)
    assert scenario.name == path.stem
    assert scenario.policies[0].name == "static"  # the baseline every ratio is read against


def _minimal() -> dict[str, Any]:
    return {
        "name": "mini",
        "seed": 1,
        "budget_slots": 8,
        "warmup_s": 1.0,
        "steady_s": 2.0,
        "policies": ["static", {"name": "fast", "policy": "demand"}, "pool"],
        "tenants": [
            {
                "name": "A",
                "api_keys": ["ka"],
                "arrival": {"kind": "poisson", "rate_per_s": 5},
                "prompt_tokens": {"min_tokens": 4, "max_tokens": 8},
                "output_tokens": 3,
                "slo": {"ttft_ms": 100},
            },
            {
                "name": "B",
                "api_keys": ["kb"],
                "arrival": {"kind": "gamma", "rate_per_s": 5, "burstiness": 0.5},
                "prompt_tokens": 4,
                "output_tokens": 3,
                "slo": {"e2el_ms": 1000},
            },
        ],
    }


def test_a_minimal_scenario() -> None:
    scenario = parse_scenario(_minimal())
    assert [(r.name, r.policy) for r in scenario.policies] == [
        ("static", "static"),
        ("fast", "demand"),
        ("pool", "pool"),
    ]
    assert scenario.tenant("A").prompt_tokens == TokenRange(min_tokens=4, max_tokens=8)
    assert scenario.gateways == 2


def test_a_tenant_is_not_preemptible_unless_it_says_so() -> None:
    data = _minimal()
    data["tenants"][1]["preemptible"] = True
    data["goals"] = [{"run": "fast", "field": "waste_percent", "at_most": 3}]
    scenario = parse_scenario(data)
    assert (scenario.tenant("A").preemptible, scenario.tenant("B").preemptible) == (False, True)
    assert scenario.goals[0].runs == ("fast",)


ISSUE_12 = ("burst-full-share", "idle-then-storm", "unequal-weights")
"""The scenarios of issue 12's failing kinds."""


@pytest.mark.parametrize("name", ISSUE_12)
def test_issue_12s_scenarios_share_its_setup(name: str) -> None:
    scenario = load_scenario(SEED.parent / f"{name}.yaml")
    assert scenario.budget_slots == 96
    assert [r.name for r in scenario.policies] == ["static", "demand", "slo", "pool"]
    b = scenario.tenant("B")
    assert isinstance(b.arrival, ClosedLoopArrival)
    assert b.arrival.outstanding > scenario.budget_slots
    assert b.output_tokens == TokenRange(min_tokens=448, max_tokens=576)
    assert b.preemptible
    lenders = [t for t in scenario.tenants if isinstance(t.arrival, OnOffArrival)]
    assert lenders
    for lender in lenders:
        assert lender.slo.ttft_ms == 1000
        assert lender.lendable_percent == 100  # no reserve configured
        assert not lender.preemptible
        goals = {(g.label, g.field) for g in scenario.goals if g.tenant == lender.name}
        assert goals >= {
            ("slo", "reclaim_median_s"),
            ("slo", "reclaim_p90_s"),
            ("slo/static", "request_goodput"),
        }
    totals = {(g.label, g.field) for g in scenario.goals if g.tenant is None}
    assert totals == {("slo/static", "output_throughput"), ("slo", "waste_percent")}


def _shares(scenario: Scenario) -> dict[str, int]:
    return nominal_shares(
        parse_config(stack_config_data(scenario, scenario.policies[0], PORTS)).pools[0]
    )


def test_burst_full_share_bursts_at_the_lenders_whole_share() -> None:
    scenario = load_scenario(SEED.parent / "burst-full-share.yaml")
    a = scenario.tenant("A")
    assert isinstance(a.arrival, OnOffArrival)
    assert a.arrival.concurrency == _shares(scenario)["A"]
    assert a.arrival.off_s > a.arrival.on_s
    assert max(t.weight for t in scenario.tenants) > a.weight  # a third, heavier tenant
    assert len(scenario.tenants) == 3


def test_idle_then_storm_storms_at_several_times_the_share_after_a_long_idle() -> None:
    scenario = load_scenario(SEED.parent / "idle-then-storm.yaml")
    a = scenario.tenant("A")
    assert isinstance(a.arrival, OnOffArrival)
    assert a.arrival.concurrency is not None
    assert a.arrival.concurrency >= 3 * _shares(scenario)["A"]
    assert a.arrival.off_s >= 45.0
    starts = on_windows(a.arrival, scenario.warmup_s + scenario.steady_s)
    assert sum(1 for start, _ in starts if start >= scenario.warmup_s) >= 2


def test_unequal_weights_has_three_different_weights() -> None:
    scenario = load_scenario(SEED.parent / "unequal-weights.yaml")
    assert len({t.weight for t in scenario.tenants}) == 3
    shares = _shares(scenario)
    assert shares["B"] == min(shares.values())  # the borrower has the smallest share


def test_unequal_weights_slo_learns_the_ramping_lenders_reserve() -> None:
    scenario = load_scenario(SEED.parent / "unequal-weights.yaml")

    def learns(name: str) -> bool:
        run = next(r for r in scenario.policies if r.name == name)
        config = parse_config(stack_config_data(scenario, run, PORTS))
        config = apply_overrides(config, merged_overrides(scenario, run, {}))
        return config.pools[0].slo_policy.learned_reserves

    assert learns("slo")
    assert not learns("static")


def _broken(path: str, value: Any) -> dict[str, Any]:
    data = copy.deepcopy(_minimal())
    node: Any = data
    *parents, leaf = path.split(".")
    for part in parents:
        node = node[int(part)] if isinstance(node, list) else node[part]
    node[int(leaf) if isinstance(node, list) else leaf] = value
    return data


@pytest.mark.parametrize(
    ("data", "message"),
    [
        pytest.param(
            _broken(
                "tenants.0.arrival",
                {"kind": "on_off", "on_s": 1, "off_s": 1, "concurrency": 2, "rate_per_s": 3},
            ),
            "exactly one of concurrency and rate_per_s",
            id="on/off with both loads",
        ),
        pytest.param(
            _broken("tenants.0.arrival", {"kind": "on_off", "on_s": 1, "off_s": 1}),
            "exactly one of concurrency and rate_per_s",
            id="on/off with no load",
        ),
        pytest.param(
            _broken("tenants.0.arrival", {"kind": "uniform", "rate_per_s": 1}),
            "tenants.0.arrival",
            id="unknown arrival kind",
        ),
        pytest.param(
            _broken("tenants.0.prompt_tokens", {"min_tokens": 9, "max_tokens": 8}),
            "min_tokens (9) is above max_tokens (8)",
            id="empty range",
        ),
        pytest.param(
            _broken("tenants.0.output_tokens", 0), "tenants.0.output_tokens", id="0 tokens"
        ),
        pytest.param(_broken("tenants.0.slo", {}), "at least one of", id="empty SLO"),
        pytest.param(_broken("tenants.1.name", "A"), "tenant names repeat", id="same name"),
        pytest.param(_broken("tenants.1.api_keys", ["ka"]), "API key", id="shared key"),
        pytest.param(_broken("tenants.1.name", "pool"), "reserved", id="tenant called pool"),
        pytest.param(_broken("policies", ["static", "static"]), "run names repeat", id="same run"),
        pytest.param(_broken("policies", ["fastest"]), "policies.0", id="unknown policy"),
        pytest.param(_broken("tenants.0.floor_slots", 9), "floor_slots", id="floors over budget"),
        pytest.param(_broken("steady_s", 0), "steady_s", id="no steady window"),
        pytest.param(_broken("tenants.0.colour", "red"), "colour", id="unknown field"),
        pytest.param(
            _broken("goals", [{"ratio": "demand/static", "field": "completed", "at_least": 1}]),
            "no run named 'demand'",
            id="goal on a missing run",
        ),
        pytest.param(
            _broken("goals", [{"ratio": "fast/static", "field": "completed"}]),
            "exactly one of at_least and at_most",
            id="goal without a bound",
        ),
        pytest.param(
            _broken(
                "goals",
                [{"ratio": "fast/static", "field": "completed", "tenant": "Z", "at_most": 1}],
            ),
            "no tenant named 'Z'",
            id="goal on a missing tenant",
        ),
        pytest.param(
            _broken("goals", [{"field": "completed", "at_least": 1}]),
            "exactly one of ratio and run",
            id="goal on no run",
        ),
        pytest.param(
            _broken("goals", [{"run": "fast", "field": "completed", "at_least": 1}]),
            "compared between runs: use ratio",
            id="ratio figure bounded in one run",
        ),
        pytest.param(
            _broken("goals", [{"ratio": "fast/static", "field": "reclaim_median_s", "at_most": 1}]),
            "bounded within one run: use run",
            id="one run's figure as a ratio",
        ),
        pytest.param(
            _broken("goals", [{"run": "slow", "field": "reclaim_median_s", "at_most": 1}]),
            "no run named 'slow'",
            id="value goal on a missing run",
        ),
        pytest.param(
            _broken("tenants.0.lendable_percent", 120), "lendable_percent", id="lend over 100%"
        ),
        pytest.param(
            _broken("goals", [{"ratio": "fast/static", "field": "waste_percent", "at_most": 3}]),
            "bounded within one run: use run",
            id="waste as a ratio",
        ),
        pytest.param(
            _broken("tenants.0.preemptible", "sometimes"),
            "preemptible",
            id="preemptible not a bool",
        ),
    ],
)
def test_mistakes_are_refused_by_name(data: dict[str, Any], message: str) -> None:
    with pytest.raises(ScenarioError, match=re.escape(message)):
        parse_scenario(data, source="test.yaml")


def test_a_file_that_is_not_a_mapping_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "list.yaml"
    path.write_text("- 1\n- 2\n")
    with pytest.raises(ScenarioError, match="mapping"):
        load_scenario(path)


def test_a_missing_file_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ScenarioError, match=re.escape("missing.yaml")):
        load_scenario(tmp_path / "missing.yaml")
