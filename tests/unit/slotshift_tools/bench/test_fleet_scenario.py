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


def _grouped(**changes: Any) -> dict[str, Any]:
    """_FLEET with pools a (budget 8) and b (budget 4) one replica group `small`, its tenants A
    (a floor of 3 and a ceiling of 9 over the group, weight 2) and B (the default bounds);
    `changes`: dotted paths set after (None: the field removed)."""
    data = _with("pools.1.budget_slots", 4)
    data["pools"][0]["replica_group"] = "small"
    data["pools"][1]["replica_group"] = "small"
    tenant = data["tenants"][0]
    del tenant["pools"]
    tenant.update(replica_group="small", floor_slots=3, ceiling_slots=9, weight=2)
    data["tenants"].append(
        {**tenant, "name": "B", "api_keys": ["kb"], "floor_slots": 1, "ceiling_slots": None}
    )
    del data["tenants"][2]["weight"]
    for path, value in changes.items():
        *parents, last = path.split(".")
        node: Any = data
        for part in parents:
            node = node[int(part)] if part.isdigit() else node[part]
        if value is None:
            del node[int(last) if last.isdigit() else last]
        else:
            node[int(last) if last.isdigit() else last] = value
    return data


def test_a_replica_groups_tenants_are_its_members_with_the_slots_divided_by_budget() -> None:
    scenario = parse_scenario(_grouped())
    assert scenario.replica_group_names == ["small"]
    assert [p.name for p in scenario.group_members("small")] == ["a", "b"]
    tenant = scenario.tenant("A")
    assert [t.name for t in scenario.pool_tenants("a")] == ["A", "B"]
    assert [t.name for t in scenario.pool_tenants("c")] == ["C"]
    assert scenario.tenant_pools(tenant) == ["a", "b"]
    # 3 floor slots over budgets 8 and 4: 2 and 1; a ceiling of 9: 6 and 3; the weight as is.
    a, b = scenario.tenant_config(tenant, "a"), scenario.tenant_config(tenant, "b")
    assert (a.floor_slots, a.ceiling_slots, a.weight) == (2, 6, 2)
    assert (b.floor_slots, b.ceiling_slots, b.weight) == (1, 3, 2)
    with pytest.raises(KeyError):
        scenario.tenant_config(tenant, "c")


def test_a_replica_groups_config_states_it_once_and_the_loader_divides_it() -> None:
    scenario = parse_scenario(_grouped())
    data = _config_of(scenario)
    (group,) = data["replica_groups"]
    assert group["name"] == "small"
    assert [(t["name"], t["floor_slots"], t["ceiling_slots"]) for t in group["tenants"]] == [
        ("A", 3, 9),
        ("B", 1, None),
    ]
    assert [p.get("replica_group") for p in data["pools"]] == ["small", "small", None]
    assert "tenants" not in data["pools"][0]
    config = parse_config(data)
    for name in ("a", "b"):
        held = config.pool(name).tenants
        expected = [scenario.tenant_config(t, name) for t in scenario.pool_tenants(name)]
        assert [(t.name, t.floor_slots, t.ceiling_slots, t.weight) for t in held] == [
            (t.name, t.floor_slots, t.ceiling_slots, t.weight) for t in expected
        ]
        assert [[reveal(k) for k in t.api_keys] for t in held] == [["ka"], ["kb"]]
    # B's floor of 1 over the group keeps a slot on each member: 1 and 1.
    assert [config.pool(name).tenants[1].floor_slots for name in ("a", "b")] == [1, 1]
    assert [t.name for t in config.pool("c").tenants] == ["C"]
    baseline = parse_config(_config_of(scenario, "pool"))
    assert [t.name for t in baseline.replica_group("small").tenants] == ["pool"]
    for pool in baseline.pools:
        (tenant,) = pool.tenants
        assert (tenant.name, tenant.floor_slots, pool.policy) == ("pool", 0, "static")


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        pytest.param({"tenants.0.pools": ["a"]}, "not both", id="pools and group"),
        pytest.param(
            {"tenants.1.pools": None, "tenants.1.replica_group": "big"},
            "no pool names",
            id="unknown group",
        ),
        pytest.param(
            {"tenants.1.pools": ["a", "c"]}, "members of a replica group", id="member in pools"
        ),
        pytest.param(
            {"pools.1.models": ["small", "other"]}, "the same models", id="members differ"
        ),
        pytest.param(
            {"pools.2.replica_group": "spare"}, "no tenant names it", id="group without tenants"
        ),
        # 30 floor slots over budgets 8 and 4: 20 and 10, above both budgets.
        pytest.param({"tenants.0.floor_slots": 30}, "floor", id="floors over a member's budget"),
    ],
)
def test_a_bad_replica_group_is_refused(changes: dict[str, Any], message: str) -> None:
    with pytest.raises(ScenarioError, match=message):
        parse_scenario(_grouped(**changes))


def test_a_one_server_scenario_refuses_a_replica_group() -> None:
    seed = load_scenario(SCENARIOS / "seed.yaml").model_dump(mode="json")
    for tenant in seed["tenants"]:
        tenant["api_keys"] = [f"key-{tenant['name']}"]
    seed["tenants"][0]["replica_group"] = "small"
    with pytest.raises(ScenarioError, match="only a fleet scenario"):
        parse_scenario(seed)


@pytest.mark.parametrize("name", ["fleet.yaml", "fleet-slow-replica.yaml"])
def test_the_shipped_fleets_state_the_small_replicas_as_one_group(name: str) -> None:
    """The replicas' tenants stated once divide into the bounds the per-pool form gave each
    replica (A 2 and B 4 floor slots on each), so the figures of docs/results/fleet.md compare."""
    config = parse_config(_config_of(load_scenario(SCENARIOS / name)))
    assert [p.name for p in config.members_of("small")] == ["small-a", "small-b"]
    for pool in config.members_of("small"):
        assert [(t.name, t.floor_slots, t.ceiling_slots) for t in pool.tenants] == [
            ("A", 2, None),
            ("B", 4, None),
        ]
    assert config.pool("large").replica_group is None
