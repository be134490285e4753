"""`slotshift simulate SCENARIO.yaml`: every run of a bench scenario in the twin, then the
bench's results (summary.json, summary.md, the plots, each run's traces, samples and decisions),
with the twin's own figures (CPU time, speed against real time, engine steps) in
`meta.twin`. With `--replay LOG [LOG ...]` the traffic is a recorded request log's instead of
the scenario's arrival processes (slotshift_tools/twin/replay.py), described in `meta.replay`."""

from __future__ import annotations

import datetime
import io
import sys
from collections.abc import Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, TextIO

from slotshift.apportion import nominal_shares
from slotshift.config import ConfigError
from slotshift_tools.bench.command import (
    RunRecord,
    default_out_dir,
    results_meta,
    scaled_warmup_s,
    write_results,
    write_run_files,
)
from slotshift_tools.bench.fleet import (
    FleetRunResult,
    fleet_checks,
    fleet_markdown,
    fleet_run_summary,
)
from slotshift_tools.bench.load import ScheduledRequest
from slotshift_tools.bench.plots import PoolSeries, RunSeries, plot_fleet
from slotshift_tools.bench.runner import RunResult, RunSettings
from slotshift_tools.bench.scenario import (
    POOL_BASELINE,
    PolicyRun,
    Scenario,
    ScenarioError,
    load_scenario,
)
from slotshift_tools.bench.summary import markdown_table, run_summary, summary_document
from slotshift_tools.twin.fleet import replica_capacities, simulate_fleet_run
from slotshift_tools.twin.replay import ReplayedTraffic, ReplayError, replayed_traffic
from slotshift_tools.twin.run import TwinStats, simulate_run
from slotshift_tools.twin.settings import TwinSettings


@dataclass(frozen=True)
class SimulatedRun:
    """One run in the twin: what the bench would have recorded, and how the twin fared."""

    record: RunRecord
    """Its summary (`policies.<run>` of summary.json) and series, for the plots."""
    result: RunResult
    stats: TwinStats
    fleet: FleetRunResult | None = None
    """A fleet scenario's run: each pool's own (`result` is then the whole fleet's)."""


def simulate_scenario(
    scenario: Scenario,
    *,
    steady_s: float,
    warmup_s: float,
    overrides: dict[str, Any] | None = None,
    settings: TwinSettings | None = None,
    schedule: Mapping[str, Sequence[ScheduledRequest]] | None = None,
) -> dict[str, SimulatedRun]:
    """Every run of `scenario` in the twin, in order. Deterministic: the same arguments give
    the same results. schedule: every tenant's sends instead of its arrival process (see
    `simulate_run`), the same in every run."""
    runs: dict[str, SimulatedRun] = {}
    if scenario.fleet and schedule is not None:
        raise ValueError("a fleet runs its scenario's arrival processes, not a schedule")
    for run in scenario.policies:
        if scenario.fleet:
            runs[run.name] = simulate_fleet(
                scenario,
                run,
                warmup_s=warmup_s,
                steady_s=steady_s,
                overrides=overrides,
                settings=settings,
            )
            continue
        result, stats = simulate_run(
            scenario,
            run,
            warmup_s=warmup_s,
            steady_s=steady_s,
            overrides=overrides,
            settings=settings,
            schedule=schedule,
        )
        record = RunRecord(
            run_summary(scenario, result),
            RunSeries(run.name, result.window, result.samples),
            limited=run.policy != POOL_BASELINE,
            nominal_slots=nominal_shares(result.config.pools[0]),
        )
        runs[run.name] = SimulatedRun(record, result, stats)
    return runs


def simulate_fleet(
    scenario: Scenario,
    run: PolicyRun,
    *,
    steady_s: float,
    warmup_s: float,
    overrides: dict[str, Any] | None = None,
    settings: TwinSettings | None = None,
) -> SimulatedRun:
    """One run of fleet scenario `scenario` in the twin, with its fleet summary (bench/fleet.py)
    and the replicas' capacities measured on its own mix of requests."""
    fleet, stats = simulate_fleet_run(
        scenario, run, warmup_s=warmup_s, steady_s=steady_s, overrides=overrides, settings=settings
    )
    summary = fleet_run_summary(scenario, fleet, replica_capacities(scenario, fleet))
    nominal: dict[str, int] = {}
    for pool in fleet.pools.values():
        for tenant, slots in nominal_shares(pool.result.config.pools[0]).items():
            nominal[tenant] = nominal.get(tenant, 0) + slots
    record = RunRecord(
        summary,
        RunSeries(run.name, fleet.fleet.window, fleet.fleet.samples),
        limited=run.policy != POOL_BASELINE,
        nominal_slots=nominal,
    )
    return SimulatedRun(record, fleet.fleet, stats, fleet)


def write_fleet_files(folder: Path, simulated: Mapping[str, SimulatedRun]) -> None:
    """Each fleet run's pools' samples and decisions (`<run>/pools/<pool>/`), and fleet.png."""
    series: dict[str, list[PoolSeries]] = {}
    window = None
    for name, run in simulated.items():
        if run.fleet is None:
            continue
        replicas = {
            pool: figures
            for group in run.record.summary["replicas"].values()
            for pool, figures in group.items()
        }
        series[name] = []
        for pool, pool_run in run.fleet.pools.items():
            write_run_files(folder / name / "pools" / pool, pool_run.result)
            # The pool's traces are the run's own, already in <run>/traces.jsonl with their pool.
            (folder / name / "pools" / pool / "traces.jsonl").unlink()
            figures = replicas.get(pool, {})
            series[name].append(
                PoolSeries(
                    pool,
                    pool_run.budget_slots,
                    pool_run.result.samples,
                    figures.get("share"),
                    figures.get("capacity_share"),
                )
            )
        window = run.result.window
    if window is not None:
        plot_fleet(series, window, folder / "fleet.png")


def run_simulate(
    scenario_path: Path,
    *,
    duration_s: float | None = None,
    warmup_s: float | None = None,
    out_dir: Path | None = None,
    overrides: dict[str, Any] | None = None,
    runs: Sequence[str] | None = None,
    settings: TwinSettings | None = None,
    replay: Sequence[Path] | None = None,
    replay_pool: str | None = None,
    out: TextIO = sys.stdout,
) -> int:
    """Simulate the scenario and write the results; the exit status (0 done, 2 a bad scenario,
    run selection, config or log).

    replay: request logs whose traffic replaces the scenario's arrival processes (the records
    of `replay_pool`, or of the log's only pool); each run's horizon is then the log's span, of
    which the first `warmup_s` (default: the scenario's, scaled to the span) is warm-up, and
    `duration_s` must not be given."""
    try:
        scenario = load_scenario(scenario_path)
    except ScenarioError as exc:
        print(f"slotshift simulate: invalid scenario: {exc}", file=sys.stderr)
        return 2
    if runs is not None:
        known = [r.name for r in scenario.policies]
        unknown = [name for name in runs if name not in known]
        if not runs or unknown:
            print(f"slotshift simulate: --runs: pick among {', '.join(known)}", file=sys.stderr)
            return 2
        scenario = scenario.model_copy(
            update={"policies": [r for r in scenario.policies if r.name in runs]}
        )
    if (duration_s is not None and duration_s <= 0) or (warmup_s is not None and warmup_s < 0):
        print(
            "slotshift simulate: --duration must be positive, --warmup not negative",
            file=sys.stderr,
        )
        return 2
    traffic: ReplayedTraffic | None = None
    if replay is not None:
        if scenario.fleet:
            # A log is one pool's; a fleet's traffic comes from its own arrival processes.
            print("slotshift simulate: --replay takes a one-server scenario", file=sys.stderr)
            return 2
        if duration_s is not None:
            print(
                "slotshift simulate: --duration: a replay's window is the log's span",
                file=sys.stderr,
            )
            return 2
        try:
            traffic = replayed_traffic(replay, scenario, pool=replay_pool)
        except ReplayError as exc:
            print(f"slotshift simulate: --replay: {exc}", file=sys.stderr)
            return 2
        warmup = warmup_s if warmup_s is not None else scaled_warmup_s(scenario, traffic.span_s)
        steady_s = traffic.span_s - warmup
        if steady_s <= 0:
            print(
                f"slotshift simulate: --warmup ({warmup:g} s) leaves nothing of the log's "
                f"span ({traffic.span_s:g} s)",
                file=sys.stderr,
            )
            return 2
    else:
        steady_s = duration_s if duration_s is not None else scenario.steady_s
        warmup = warmup_s if warmup_s is not None else scaled_warmup_s(scenario, steady_s)
    schedule: Mapping[str, Sequence[ScheduledRequest]] | None = (
        traffic.sends if traffic is not None else None
    )
    started = datetime.datetime.now(datetime.UTC)
    suffix = "replay" if traffic is not None else "twin"
    folder = (
        out_dir if out_dir is not None else default_out_dir(f"{scenario.name}-{suffix}", started)
    )
    try:
        simulated = simulate_scenario(
            scenario,
            steady_s=steady_s,
            warmup_s=warmup,
            overrides=overrides,
            settings=settings,
            schedule=schedule,
        )
    except ConfigError as exc:
        print(f"slotshift simulate: {exc}", file=sys.stderr)
        return 2
    folder.mkdir(parents=True, exist_ok=True)
    records = {name: run.record for name, run in simulated.items()}
    stats = {name: run.stats for name, run in simulated.items()}
    for name, run in simulated.items():
        write_run_files(folder / name, run.result)
    write_fleet_files(folder, simulated)
    bench_settings = RunSettings(
        warmup_s=warmup,
        steady_s=steady_s,
        out_dir=folder,
        command_line_overrides=dict(overrides or {}),
        log_level="WARNING",
        progress=io.StringIO(),
    )
    meta = results_meta(scenario, scenario_path, bench_settings, started, records, runs)
    meta["command"] = meta["command"].replace("slotshift bench", "slotshift simulate", 1)
    meta["twin"] = twin_meta(stats, settings or TwinSettings())
    if traffic is not None:
        meta["command"] += "".join(f" --replay {path}" for path in traffic.files)
        meta["replay"] = traffic.meta()
    document = summary_document(
        scenario, {name: record.summary for name, record in records.items()}, meta
    )
    table = markdown_table(document)
    if scenario.fleet:
        checks = fleet_checks(scenario, document["policies"])
        document["fleet_checks"] = checks
        table += "\n" + fleet_markdown(document["policies"], checks)
    write_results(scenario, folder, document, table, records, meta)
    twin = meta["twin"]
    print(table, file=out)
    if traffic is not None:
        print(_replay_line(traffic), file=out)
    print(
        f"twin: {twin['simulated_s']:.0f} s simulated in {twin['cpu_s']:.1f} s of CPU "
        f"({twin['speed_factor']:.0f}x real time); results: {folder}",
        file=out,
    )
    return 0


def twin_meta(stats: dict[str, TwinStats], settings: TwinSettings) -> dict[str, Any]:
    """summary.json's `meta.twin`: the settings, and how fast the runs were together."""
    cpu_s = sum(s.cpu_s for s in stats.values())
    simulated_s = sum(s.simulated_s for s in stats.values())
    return {
        "settings": settings.model_dump(mode="json"),
        "cpu_s": cpu_s,
        "simulated_s": simulated_s,
        "speed_factor": simulated_s / cpu_s if cpu_s > 0 else None,
        "runs": {name: asdict(s) for name, s in stats.items()},
    }


def _replay_line(traffic: ReplayedTraffic) -> str:
    """What the replay sent, and what it could not."""
    sent = ", ".join(f"{name} {len(t.requests)}" for name, t in traffic.schedule.tenants.items())
    line = (
        f"replay: {traffic.schedule.requests} requests of pool {traffic.pool} from "
        f"{len(traffic.files)} file(s) over {traffic.span_s:.1f} s ({sent})"
    )
    if traffic.silent_tenants:
        line += f"; not in the log, so sending nothing: {', '.join(traffic.silent_tenants)}"
    if traffic.schedule.left_out:
        left = ", ".join(
            f"{why} {count}" for why, count in sorted(traffic.schedule.left_out.items())
        )
        line += f"; records left out: {left}"
    return line
