"""A fleet run's results: the fleet's summary, the same summary per pool, the budget checks and
the replicas' split.

summary.json for a fleet scenario (`policies.<run>`) is a run's summary (summary.run_summary)
over the whole fleet, every request of every pool (engine figures summed over the engines, GPU
utilisation averaged, a tenant's limit summed over its pools; decisions, moves and holds summed
over the pools' own), with:
- `pools.<pool>`: run_summary over the requests routed to that pool and its own samples and
  decisions, plus `budget_slots`, `engine_in_flight_peak` (the engine's exact high-water mark
  of running plus waiting requests) and `within_budget`;
- `replicas.<model>.<pool>` for each model served by several pools: `completed` (the model's
  requests the pool completed in the window), `share` (of the model's completed requests),
  `output_share` (of the output tokens of those requests),
  `capacity_per_s` (what the replica completes per second held at its budget, the engine alone
  on the run's mix of the model's requests: twin.fleet.replica_capacity), `capacity_share` (the
  share that following the room should give), `share_over_capacity_share`, and
  `round_robin_share` (1 / replicas: what round robin would give).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from slotshift_tools.bench.runner import RunResult
from slotshift_tools.bench.scenario import POOL_BASELINE, Scenario
from slotshift_tools.bench.summary import run_summary
from slotshift_tools.bench.trace import RequestStatus

EQUAL_REPLICA_SHARE = (0.45, 0.55)
"""Issue 16: with equal replicas, each replica's share of the model's completed requests."""

CAPACITY_SHARE_TOLERANCE = 0.10
"""Issue 16: with unequal replicas, each replica's share within this much (relative) of its
capacity share: requests follow the room, not round robin."""


@dataclass(frozen=True)
class PoolRun:
    """One pool of a fleet run: what it recorded, and its engine's peak against its budget."""

    result: RunResult
    """The pool's requests (those routed to it), samples and decisions; its config's `pools`
    is the pool alone and its `engine_sim` the pool's engine."""
    budget_slots: int
    engine_in_flight_peak: int
    """The engine's most requests running plus waiting at any instant of the run."""


@dataclass(frozen=True)
class FleetRunResult:
    """Everything one run of a fleet recorded."""

    fleet: RunResult
    """Every request, and samples combining the pools' (see twin.fleet._fleet_samples)."""
    pools: Mapping[str, PoolRun]


def replica_groups(scenario: Scenario) -> dict[str, list[str]]:
    """model -> the pools serving it as their first model, for the models several serve."""
    groups: dict[str, list[str]] = {}
    for pool in scenario.pools:
        groups.setdefault(pool.models[0], []).append(pool.name)
    return {model: pools for model, pools in groups.items() if len(pools) > 1}


def equal_replicas(scenario: Scenario, pools: Sequence[str]) -> bool:
    """Whether `pools` are alike: the same budget, profile and engine overrides."""
    shapes = {
        (p.budget_slots, p.profile, tuple(sorted(p.engine_overrides.items())))
        for p in scenario.pools
        if p.name in pools
    }
    return len(shapes) == 1


def fleet_run_summary(
    scenario: Scenario, result: FleetRunResult, capacities: Mapping[str, float]
) -> dict[str, Any]:
    """`policies.<run>` for one fleet run (see the module docstring); `capacities`: pool ->
    replica capacity in requests per second, for the pools of replica groups."""
    pools: dict[str, dict[str, Any]] = {}
    for name, pool in result.pools.items():
        served = scenario.fleet_pool(name).models
        tenants = [
            t for t in scenario.tenants if name in (t.pools or {}) or scenario.model_of(t) in served
        ]
        figures = run_summary(scenario.model_copy(update={"tenants": tenants}), pool.result)
        figures.update(
            budget_slots=pool.budget_slots,
            engine_in_flight_peak=pool.engine_in_flight_peak,
            within_budget=pool.engine_in_flight_peak <= pool.budget_slots,
        )
        pools[name] = figures
    summary = run_summary(scenario, result.fleet)
    total = summary["total"]
    for field in ("decisions", "moves", "holds", "rejected"):
        total[field] = sum(p["total"][field] for p in pools.values())
    for tenant, figures in summary["tenants"].items():
        figures["moves_toward"] = sum(
            p["tenants"].get(tenant, {}).get("moves_toward", 0) for p in pools.values()
        )
    summary["controller"] = {
        "pools": {name: p["controller"] for name, p in pools.items()},
        **{field: total[field] for field in ("decisions", "moves", "holds", "rejected")},
    }
    summary["profile"] = "+".join(sorted({p["profile"] for p in pools.values()}))
    summary["pools"] = pools
    summary["replicas"] = _replicas(scenario, result, capacities)
    return summary


def _replicas(
    scenario: Scenario, result: FleetRunResult, capacities: Mapping[str, float]
) -> dict[str, dict[str, Any]]:
    window = result.fleet.window
    groups: dict[str, dict[str, Any]] = {}
    for model, names in replica_groups(scenario).items():
        completed = {
            name: sum(
                1
                for t in result.pools[name].result.traces
                if t.status is RequestStatus.OK and t.end_s is not None and window.holds(t.end_s)
            )
            for name in names
        }
        output = {
            name: sum(
                t.output_tokens
                for t in result.pools[name].result.traces
                if t.status is RequestStatus.OK and t.end_s is not None and window.holds(t.end_s)
            )
            for name in names
        }
        all_output = sum(output.values())
        all_done = sum(completed.values())
        capacity_total = sum(capacities.get(name, 0.0) for name in names)
        group: dict[str, Any] = {}
        for name in names:
            share = completed[name] / all_done if all_done else None
            capacity = capacities.get(name)
            capacity_share = (
                capacity / capacity_total if capacity is not None and capacity_total else None
            )
            group[name] = {
                "completed": completed[name],
                "share": share,
                "output_share": output[name] / all_output if all_output else None,
                "capacity_per_s": capacity,
                "capacity_share": capacity_share,
                "share_over_capacity_share": (
                    share / capacity_share if share is not None and capacity_share else None
                ),
                "round_robin_share": 1.0 / len(names),
            }
        groups[model] = group
    return groups


def fleet_checks(
    scenario: Scenario, policies: Mapping[str, Mapping[str, Any]]
) -> list[dict[str, Any]]:
    """Issue 16's checks of a fleet bench, per run: every pool's engine within its budget; per
    replica group, each replica's share of the model's completed requests in 45-55% when the
    replicas are alike, else within 10% (relative) of its capacity share; and, for runs with
    limits, `slo` at least 0.97x the baseline's output throughput where both ran (a scenario
    goal says the same; repeated here so that the fleet table is whole)."""
    checks: list[dict[str, Any]] = []
    for run, summary in policies.items():
        for pool, figures in summary["pools"].items():
            checks.append(
                {
                    "run": run,
                    "check": f"{pool}: engine in flight <= budget",
                    "value": f"{figures['engine_in_flight_peak']} / {figures['budget_slots']}",
                    "met": figures["within_budget"],
                }
            )
        for model, group in summary["replicas"].items():
            alike = equal_replicas(scenario, list(group))
            for pool, figures in group.items():
                share = figures["share"]
                if alike:
                    low, high = EQUAL_REPLICA_SHARE
                    met = None if share is None else low <= share <= high
                    check = f"{model} on {pool}: share of completed in 45-55%"
                    value = "-" if share is None else f"{share:.3f}"
                else:
                    over = figures["share_over_capacity_share"]
                    met = None if over is None else abs(over - 1.0) <= CAPACITY_SHARE_TOLERANCE
                    check = f"{model} on {pool}: share within 10% of its capacity share"
                    value = (
                        "-"
                        if over is None
                        else f"{share:.3f} vs {figures['capacity_share']:.3f} ({over:.3f}x)"
                    )
                checks.append({"run": run, "check": check, "value": value, "met": met})
    baselines = [r.name for r in scenario.policies if r.policy == POOL_BASELINE]
    if "slo" in policies:
        for baseline in baselines:
            if baseline not in policies:
                continue
            slo = policies["slo"]["total"]["output_throughput"]
            base = policies[baseline]["total"]["output_throughput"]
            ratio = slo / base if slo is not None and base else None
            checks.append(
                {
                    "run": "slo",
                    "check": f"output throughput >= 0.97x {baseline}'s",
                    "value": "-" if ratio is None else f"{ratio:.3f}",
                    "met": None if ratio is None else ratio >= 0.97,
                }
            )
    return checks


def fleet_markdown(
    policies: Mapping[str, Mapping[str, Any]], checks: Sequence[Mapping[str, Any]]
) -> str:
    """The per-pool table (a row per run and pool) and the checks, as markdown."""
    lines = [
        "| run | pool | output (tok/s) | completed | p99 TTFT (ms) | engine peak / budget | share |",
        "| --- | --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for run, summary in policies.items():
        shares = {
            pool: figures["share"]
            for group in summary["replicas"].values()
            for pool, figures in group.items()
        }
        for pool, figures in summary["pools"].items():
            total = figures["total"]
            share = shares.get(pool)
            p99 = total.get("p99_ttft_ms")
            lines.append(
                f"| {run} | {pool} | {total['output_throughput']:,.0f} | {total['completed']:,} "
                f"| {'-' if p99 is None else f'{p99:,.0f}'} "
                f"| {figures['engine_in_flight_peak']} / {figures['budget_slots']} "
                f"| {'-' if share is None else f'{share:.3f}'} |"
            )
    lines += ["", "| run | check | value | met |", "| --- | --- | ---: | --- |"]
    met_text = {True: "yes", False: "NO", None: "-"}
    for check in checks:
        lines.append(
            f"| {check['run']} | {check['check']} | {check['value']} | {met_text[check['met']]} |"
        )
    return "\n".join(lines) + "\n"
