"""The stack config generated for each run: the scenario's pool, or the unpartitioned pool."""

from __future__ import annotations

from pathlib import Path

from slotshift.apportion import nominal_shares
from slotshift.config import PoolConfig, apply_overrides, parse_config, parse_overrides
from slotshift_tools.bench.scenario import load_scenario
from slotshift_tools.bench.stack_config import (
    StackPorts,
    merged_overrides,
    override_args,
    stack_config_data,
    stack_tenants,
)

SEED_PATH = Path(__file__).resolve().parents[4] / "bench" / "scenarios" / "seed.yaml"
SEED = load_scenario(SEED_PATH)
PORTS = StackPorts(8000, 50051, 9100, 9101, (8080, 8081))


def test_a_policy_run_gets_the_scenarios_tenants() -> None:
    config = parse_config(stack_config_data(SEED, SEED.run("static"), PORTS))
    pool = config.pools[0]
    assert pool.policy == "static"
    assert pool.budget_slots == 96
    assert pool.decision_period_s == 2.0
    assert nominal_shares(pool) == {"A": 48, "B": 48}
    assert [k.get_secret_value() for k in pool.tenants[0].api_keys] == ["bench-key-a"]
    assert config.gateway.pool == config.agent.pool == pool.name
    assert config.local_stack.gateway_ports == [8080, 8081]
    assert config.gateway.fallback_replicas == 2
    assert config.agent.engine_metrics_url == "http://127.0.0.1:8000/metrics"
    assert pool.engine_url == "http://127.0.0.1:8000"
    assert config.gateway.controlplane_target == config.agent.controlplane_target
    assert stack_tenants(SEED, SEED.run("static")) == ["A", "B"]


def test_the_tenants_slos_and_reserve_reach_the_pool() -> None:
    pool = parse_config(stack_config_data(SEED, SEED.run("slo"), PORTS)).pools[0]
    a, b = pool.tenants
    assert pool.policy == "slo"
    assert (a.ttft_slo_ms, a.e2e_slo_ms) == (1000, 3000)
    assert (b.ttft_slo_ms, b.e2e_slo_ms) == (None, 15000)
    assert (a.lendable_percent, b.lendable_percent) == (75, 100)
    assert a.borrowing_limit_percent is None
    assert (a.preemptible, b.preemptible) == (False, True)


def test_the_seed_run_without_pausing_switches_preemption_off() -> None:
    def pool_of(run: str) -> PoolConfig:
        config = parse_config(stack_config_data(SEED, SEED.run(run), PORTS))
        return apply_overrides(config, merged_overrides(SEED, SEED.run(run), {})).pools[0]

    assert pool_of("slo").preemption.enabled
    without = pool_of("slo-no-preempt")
    assert without.policy == "slo" and not without.preemption.enabled


def test_a_preemptible_tenant_is_preemptible_in_the_pool() -> None:
    scenario = load_scenario(SEED_PATH.parent / "burst-full-share.yaml")
    pool = parse_config(stack_config_data(scenario, scenario.run("slo"), PORTS)).pools[0]
    assert {t.name: t.preemptible for t in pool.tenants} == {"A": False, "B": True, "C": False}
    baseline = parse_config(stack_config_data(scenario, scenario.run("pool"), PORTS)).pools[0]
    assert [t.preemptible for t in baseline.tenants] == [False]


def test_the_pool_baseline_is_one_tenant_with_every_key_and_the_whole_budget() -> None:
    config = parse_config(stack_config_data(SEED, SEED.run("pool"), PORTS))
    pool = config.pools[0]
    assert pool.policy == "static"
    (tenant,) = pool.tenants
    assert tenant.name == "pool"
    assert tenant.floor_slots == 0
    assert pool.ceiling_of(tenant) == 96
    assert sorted(k.get_secret_value() for k in tenant.api_keys) == ["bench-key-a", "bench-key-b"]
    assert nominal_shares(pool) == {"pool": 96}
    assert stack_tenants(SEED, SEED.run("pool")) == ["pool"]


def test_overrides_reach_the_services_as_the_cli_reads_them() -> None:
    scenario = SEED.model_copy(
        update={"config_overrides": {"engine_sim.profile": "h200-qwen2.5-7b"}}
    )
    overrides = merged_overrides(
        scenario, scenario.run("demand"), {"pools.0.decision_period_s": 1.0}
    )
    parsed = parse_overrides(override_args(overrides))
    assert parsed == {"engine_sim.profile": "h200-qwen2.5-7b", "pools.0.decision_period_s": 1.0}
    config = apply_overrides(
        parse_config(stack_config_data(scenario, scenario.run("demand"), PORTS)), parsed
    )
    assert config.engine_sim.profile == "h200-qwen2.5-7b"
    assert config.pools[0].decision_period_s == 1.0


def test_command_line_overrides_win() -> None:
    overrides = merged_overrides(SEED, SEED.run("demand"), {"engine_sim.profile": "x"})
    assert overrides["engine_sim.profile"] == "x"
