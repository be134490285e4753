"""Scenario files: the seed loads as the study describes it; mistakes are refused by name."""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any

import pytest

from slotshift.bench.scenario import (
    ClosedLoopArrival,
    OnOffArrival,
    ScenarioError,
    TokenRange,
    load_scenario,
    parse_scenario,
)

SEED = Path(__file__).resolve().parents[3] / "bench" / "scenarios" / "seed.yaml"


def test_the_seed_scenario_is_the_studys_setup() -> None:
    scenario = load_scenario(SEED)
    assert scenario.budget_slots == 96
    assert scenario.decision_period_s == 2.0
    assert scenario.steady_s == 90.0
    assert [r.name for r in scenario.policies] == [
        "static",
        "demand",
        "slo",
        "slo-reserve16",
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
