"""The local stack's config for one run: the scenario's pool under the run's policy, free ports
(slotshift_tools.local_stack.StackPorts, re-exported here).

For a policy the pool has the scenario's tenants (keys, floors, ceilings, weights). For the
`pool` baseline it has ONE tenant, `pool`, holding every tenant's keys with floor 0 and the whole
budget under the static policy: one unpartitioned pool, one FIFO queue per gateway, no
per-tenant limit. Nothing in the product changes; the harness attributes each request to the
scenario's tenant that sent it.

Config overrides (the scenario's, the run's, then the command line's) are passed to every
service as `--set PATH=VALUE`, so the YAML file written for the run stays the generated base
and the overrides are visible on each command line.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

from slotshift.config import TenantConfig, reveal
from slotshift_tools.bench.scenario import POOL_BASELINE, BenchTenant, PolicyRun, Scenario
from slotshift_tools.local_stack import HOST, StackPorts

__all__ = [
    "StackPorts",
    "fleet_config_data",
    "merged_overrides",
    "override_args",
    "stack_config_data",
    "stack_tenants",
]


def stack_tenants(scenario: Scenario, run: PolicyRun, pool: str | None = None) -> list[str]:
    """The tenants the control plane knows in this run (in fleet pool `pool`, if named)."""
    if run.policy == POOL_BASELINE:
        return [POOL_BASELINE]
    if pool is not None:
        return [t.name for t in scenario.pool_tenants(pool)]
    return [t.name for t in scenario.tenants]


def stack_config_data(scenario: Scenario, run: PolicyRun, ports: StackPorts) -> dict[str, Any]:
    """The run's config file, as a YAML-ready document (API keys in clear: it is a test file)."""
    if run.policy == POOL_BASELINE:
        policy = "static"
        tenants: list[dict[str, Any]] = [
            {
                "name": POOL_BASELINE,
                "api_keys": [reveal(k) for t in scenario.tenants for k in t.api_keys],
                "floor_slots": 0,
            }
        ]
    else:
        policy = run.policy
        tenants = [
            {
                "name": t.name,
                "api_keys": [reveal(k) for k in t.api_keys],
                "floor_slots": t.floor_slots,
                "ceiling_slots": t.ceiling_slots,
                "weight": t.weight,
                "lendable_percent": t.lendable_percent,
                "borrowing_limit_percent": t.borrowing_limit_percent,
                "preemptible": t.preemptible,
                "ttft_slo_ms": t.slo.ttft_ms,
                "e2e_slo_ms": t.slo.e2el_ms,
            }
            for t in scenario.tenants
        ]
    controlplane = f"{HOST}:{ports.controlplane}"
    engine = ports.engine_url
    return {
        "pools": [
            {
                "name": scenario.name,
                "budget_slots": scenario.budget_slots,
                "policy": policy,
                "decision_period_s": scenario.decision_period_s,
                "engine_url": engine,
                "tenants": tenants,
            }
        ],
        "controlplane": {
            "grpc_host": HOST,
            "grpc_port": ports.controlplane,
            "metrics_port": ports.controlplane_metrics,
        },
        "gateway": {
            "host": HOST,
            "pool": scenario.name,
            "controlplane_target": controlplane,
            "fallback_replicas": len(ports.gateways),
        },
        "agent": {
            "pool": scenario.name,
            "controlplane_target": controlplane,
            "engine_metrics_url": f"{engine}/metrics",
            "metrics_port": ports.agent_metrics,
            "host": HOST,
        },
        # Usage says which prompt tokens were prefix-cache hits, so that the gateways count
        # only the truly recomputed part of a resumed prompt as waste.
        "engine_sim": {"host": HOST, "port": ports.engine, "enable_prompt_tokens_details": True},
        "local_stack": {"gateway_ports": list(ports.gateways), "start_engine_sim": True},
    }


def fleet_config_data(scenario: Scenario, run: PolicyRun, ports: StackPorts) -> dict[str, Any]:
    """A fleet scenario's config for one run, as a YAML-ready document: every pool with its
    models and budget, one gateway fleet fronting them all (`gateway.pools`), an engine per
    pool at `ports.engine + its index` with the pool's profile (`local_stack.emulator_profiles`;
    the twin also applies each pool's engine_overrides, which have no place in this file).

    For a policy each pool has its tenants with their bounds there; a replica group's member
    names its group (`replica_group`) and lists none, the group (`replica_groups`) states its
    tenants once with group-wide floor and ceiling slots, and the config's loader divides them
    among the members by budget, as for any config file. For the `pool` baseline each pool has
    ONE tenant, `pool`, holding every key of the fleet, floor 0, under the static policy (a
    group's members take it from their group): every server one unpartitioned pool (a key
    names one tenant fleet-wide, so the baseline's tenant is the same in every pool). The
    gateways route the baseline's requests as any others: by model, to the replica where `pool`
    has the most room at that gateway.
    """
    baseline = run.policy == POOL_BASELINE
    every_key = [reveal(k) for t in scenario.tenants for k in t.api_keys]
    unpartitioned = {"name": POOL_BASELINE, "api_keys": every_key, "floor_slots": 0}
    pools: list[dict[str, Any]] = []
    for index, pool in enumerate(scenario.pools):
        entry: dict[str, Any] = {
            "name": pool.name,
            "models": list(pool.models),
            "budget_slots": pool.budget_slots,
            "policy": "static" if baseline else run.policy,
            "decision_period_s": scenario.decision_period_s,
            "engine_url": f"http://{HOST}:{ports.engine + index}",
        }
        if pool.replica_group is not None:
            entry["replica_group"] = pool.replica_group
        elif baseline:
            entry["tenants"] = [unpartitioned]
        else:
            entry["tenants"] = [
                _held(tenant.pool_tenant(pool.name), tenant)
                for tenant in scenario.pool_tenants(pool.name)
            ]
        pools.append(entry)
    groups = [
        {
            "name": group,
            "tenants": (
                [unpartitioned]
                if baseline
                else [_held(t.group_tenant(), t) for t in scenario.group_tenants(group)]
            ),
        }
        for group in scenario.replica_group_names
    ]
    controlplane = f"{HOST}:{ports.controlplane}"
    return {
        "pools": pools,
        **({"replica_groups": groups} if groups else {}),
        "controlplane": {
            "grpc_host": HOST,
            "grpc_port": ports.controlplane,
            "metrics_port": ports.controlplane_metrics,
        },
        "gateway": {
            "host": HOST,
            "pools": [p.name for p in scenario.pools],
            "controlplane_target": controlplane,
            "fallback_replicas": len(ports.gateways),
        },
        "agent": {
            "controlplane_target": controlplane,
            "metrics_port": ports.agent_metrics,
            "host": HOST,
            "engines": [
                {"pool": p["name"], "metrics_url": f"{p['engine_url']}/metrics", "gpus": []}
                for p in pools
            ],
        },
        "engine_sim": {"host": HOST, "port": ports.engine, "enable_prompt_tokens_details": True},
        "local_stack": {
            "gateway_ports": list(ports.gateways),
            "start_engine_sim": True,
            "emulator_profiles": {p.name: p.profile for p in scenario.pools},
        },
    }


def _held(config: TenantConfig, tenant: BenchTenant) -> dict[str, Any]:
    """A tenant's config entry as the file states it: the fields set, its keys revealed."""
    held = config.model_dump(mode="json", exclude_unset=True)
    held["api_keys"] = [reveal(k) for k in tenant.api_keys]
    return held


def merged_overrides(
    scenario: Scenario, run: PolicyRun, command_line: Mapping[str, Any]
) -> dict[str, Any]:
    """The scenario's overrides, then the run's, then the command line's (later ones win)."""
    return {**scenario.config_overrides, **run.config_overrides, **command_line}


def override_args(overrides: Mapping[str, Any]) -> list[str]:
    """`PATH=VALUE` pairs for `--set`; values as JSON, which the CLI reads back as YAML."""
    return [f"{path}={json.dumps(value)}" for path, value in overrides.items()]
