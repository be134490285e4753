"""Fleet scenarios: validated on load, and the stack's config each run gets."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest

from slotshift.config import parse_config, reveal
from slotshift_tools.bench.scenario import ScenarioError, load_scenario, parse_scenario
from slotshift_tools.bench.stack_config import StackPorts, fleet_config_data

SCENARIOS = Path(__file__).resolve().parents[4] / "bench" / "scenarios"

_FLEET: dict[str, Any] = {
    "name": "f",
    "seed": 1,
    "pools": [
        {"name": "a", "models": ["small"], "budget_slots": 8},
        {"name": "b", "models": ["small"], "budget_slots": 8, "profile": "h200-qwen2.5-7b"},
        {
            "name": "c",
            "models": ["large"],
            "budget_slots": 4,
            "engine_overrides": {"step_base_ms": 9},
        },
    ],
    "tenants": [
        {
            "name": "A",
            "api_keys": ["ka"],
            "model": "small",
            "pools": {"a": {"weight": 2}, "b": {}},
            "arrival": {"kind": "poisson", "rate_per_s": 1},
            "prompt_tokens": 8,
            "output_tokens": 8,
            "slo": {"ttft_ms": 100},
        },
        {
            "name": "C",
            "api_keys": ["kc"],
            "model": "large",
            "pools": ["c"],
            "arrival": {"kind": "closed_loop", "outstanding": 2},
            "prompt_tokens": 8,
            "output_tokens": 8,
            "slo": {"ttft_ms": 100},
        },
    ],
    "policies": ["slo", "pool"],
    "warmup_s": 1,
    "steady_s": 1,
}


def _with(path: str, value: Any) -> dict[str, Any]:
    data = copy.deepcopy(_FLEET)
    *parents, last = path.split(".")
    node: Any = data
    for part in parents:
        node = node[int(part)] if part.isdigit() else node[part]
    node[int(last) if last.isdigit() else last] = value
    return data


def test_a_fleet_scenario_validates_with_its_pools_and_shares() -> None:
    scenario = parse_scenario(_FLEET)
    assert scenario.fleet
    assert scenario.total_budget_slots == 20
    assert list(scenario.tenant("C").pools or {}) == ["c"]
    assert scenario.tenant("A").pool_tenant("a").weight == 2
    assert scenario.tenant("A").pool_tenant("b").weight == 1
    engine = scenario.fleet_pool("c").engine_config(parse_config(_config_of(scenario)).engine_sim)
    assert (engine.model_name, engine.step_base_ms) == ("large", 9)


@pytest.mark.parametrize(
    ("path", "value", "message"),
    [
        pytest.param("tenants.0.pools", ["a", "z"], "no pools named", id="unknown pool"),
        pytest.param("tenants.0.model", "large", "serves its model", id="model not served"),
        pytest.param("tenants.0.pools", None, "names its pools", id="no pools"),
        pytest.param("budget_slots", 8, "not both", id="budget and pools"),
        pytest.param(
            "pools.2.engine_overrides", {"step_base_ms": -1}, "engine_overrides", id="bad engine"
        ),
        pytest.param(
            "tenants.1.arrival",
            {"kind": "on_off", "on_s": 1, "off_s": 1, "concurrency": 1},
            "on_off",
            id="on_off load",
        ),
        pytest.param(
            "tenants.1.pools", {"c": {"floor_slots": 5}}, "floor", id="floors over budget"
        ),
    ],
)
def test_a_bad_fleet_is_refused(path: str, value: Any, message: str) -> None:
    with pytest.raises(ScenarioError, match=message):
        parse_scenario(_with(path, value))


def test_a_one_server_scenario_refuses_fleet_fields() -> None:
    seed = load_scenario(SCENARIOS / "seed.yaml").model_dump(mode="json")
    for tenant in seed["tenants"]:
        tenant["api_keys"] = [f"key-{tenant['name']}"]
    seed["tenants"][0]["model"] = "small"
    with pytest.raises(ScenarioError, match="only a fleet scenario"):
        parse_scenario(seed)


def _config_of(scenario: Any, run: str = "slo") -> dict[str, Any]:
    return fleet_config_data(scenario, scenario.run(run), StackPorts(100, 2, 3, 4, (10, 11)))


def test_the_fleet_config_fronts_every_pool_and_the_baseline_is_unpartitioned() -> None:
    scenario = parse_scenario(_FLEET)
    config = parse_config(_config_of(scenario))
    assert config.gateway.pools == ["a", "b", "c"]
    assert [p.engine_url for p in config.pools] == [f"http://127.0.0.1:{100 + i}" for i in range(3)]
    assert [t.name for t in config.pool("a").tenants] == ["A"]
    assert config.pool("a").tenants[0].weight == 2
    assert config.local_stack.emulator_profiles["b"] == "h200-qwen2.5-7b"
    baseline = parse_config(_config_of(scenario, "pool"))
    for pool in baseline.pools:
        (tenant,) = pool.tenants
        assert (tenant.name, tenant.floor_slots, pool.policy) == ("pool", 0, "static")
        assert sorted(reveal(k) for k in tenant.api_keys) == ["ka", "kc"]


@pytest.mark.parametrize("name", ["fleet.yaml", "fleet-slow-replica.yaml"])
def test_the_shipped_fleets_load(name: str) -> None:
    scenario = load_scenario(SCENARIOS / name)
    assert scenario.fleet
    parse_config(_config_of(scenario))
