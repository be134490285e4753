"""`slotshift bench SCENARIO.yaml`: every run of a scenario, then the results.

Writes into the results folder (default `results/<scenario>-<timestamp>/`):
- summary.json, summary.md (the table, also printed at the end), throughput.png,
  allocation.png, gpu_utilization.png;
- per run `<run>/`: slotshift.yaml (the stack's generated config), traces.jsonl (one request a
  line), samples.jsonl (allocation, demand, engine, GPU every sample), decisions.jsonl (the
  control plane's decisions, as GetDecisions returned them).
"""

from __future__ import annotations

import asyncio
import datetime
import json
import os
import platform
import subprocess
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from slotshift.apportion import nominal_shares
from slotshift.clock import SystemClock
from slotshift.config import ConfigError
from slotshift_tools.bench.arrivals import on_windows
from slotshift_tools.bench.plots import (
    RunSeries,
    plot_allocation,
    plot_gpu_utilization,
    plot_reclaim,
    plot_throughput,
)
from slotshift_tools.bench.runner import RunResult, RunSettings, run_policy
from slotshift_tools.bench.scenario import (
    POOL_BASELINE,
    OnOffArrival,
    Scenario,
    ScenarioError,
    load_scenario,
)
from slotshift_tools.bench.summary import markdown_table, run_summary, summary_document
from slotshift_tools.local_stack import StackError

REPO_ROOT = Path(__file__).resolve().parents[2]


@dataclass
class RunRecord:
    """One run's results, as the summary and the plots take them."""

    summary: dict[str, Any]
    series: RunSeries
    limited: bool
    """Whether the run had per-tenant limits (not the unpartitioned pool)."""
    nominal_slots: dict[str, int]


def default_out_dir(scenario: str, now: datetime.datetime) -> Path:
    """results/<scenario>-<YYYYmmdd-HHMMSS>/ under the current folder."""
    return Path("results") / f"{scenario}-{now.strftime('%Y%m%d-%H%M%S')}"


def scaled_warmup_s(scenario: Scenario, steady_s: float) -> float:
    """The warm-up for a steady window other than the scenario's: shortened in the same
    proportion when the window is shorter, never lengthened."""
    return scenario.warmup_s * min(1.0, steady_s / scenario.steady_s)


def run_bench(
    scenario_path: Path,
    *,
    duration_s: float | None = None,
    warmup_s: float | None = None,
    out_dir: Path | None = None,
    overrides: dict[str, Any] | None = None,
    runs: Sequence[str] | None = None,
    log_level: str = "WARNING",
    out: TextIO = sys.stdout,
) -> int:
    """Run the benchmark; the exit status (0 done, 1 a run failed, 2 a bad scenario or config).

    runs: the scenario's runs to make, by name, in the scenario's order; None: all of them.
    Goals on a run left out are reported without a value.
    """
    try:
        scenario = load_scenario(scenario_path)
    except ScenarioError as exc:
        print(f"slotshift bench: invalid scenario: {exc}", file=sys.stderr)
        return 2
    if scenario.fleet:
        # The live bench starts one engine and one pool; a fleet runs in the twin.
        print(
            "slotshift bench: a fleet scenario (pools) runs in the twin: slotshift simulate "
            f"{scenario_path}",
            file=sys.stderr,
        )
        return 2
    if runs is not None:
        known = [r.name for r in scenario.policies]
        unknown = [name for name in runs if name not in known]
        if not runs:
            print("slotshift bench: --runs names no run", file=sys.stderr)
            return 2
        if unknown:
            print(
                f"slotshift bench: --runs: no run named {unknown[0]!r} in the scenario; "
                f"its runs: {', '.join(known)}",
                file=sys.stderr,
            )
            return 2
        selected = [r for r in scenario.policies if r.name in runs]
        scenario = scenario.model_copy(update={"policies": selected})
    if duration_s is not None and duration_s <= 0:
        print("slotshift bench: --duration must be positive", file=sys.stderr)
        return 2
    if warmup_s is not None and warmup_s < 0:
        print("slotshift bench: --warmup must not be negative", file=sys.stderr)
        return 2
    steady_s = duration_s if duration_s is not None else scenario.steady_s
    warmup = warmup_s if warmup_s is not None else scaled_warmup_s(scenario, steady_s)
    started = datetime.datetime.now(datetime.UTC)
    folder = out_dir if out_dir is not None else default_out_dir(scenario.name, started)
    folder.mkdir(parents=True, exist_ok=True)
    settings = RunSettings(
        warmup_s=warmup,
        steady_s=steady_s,
        out_dir=folder,
        command_line_overrides=dict(overrides or {}),
        log_level=log_level,
        progress=out,
    )
    print(
        f"slotshift bench: {scenario.name}: runs {', '.join(r.name for r in scenario.policies)}; "
        f"warm-up {warmup:g} s, steady window {steady_s:g} s each; results in {folder}",
        file=out,
        flush=True,
    )
    try:
        records = asyncio.run(_run_all(scenario, settings))
    except (StackError, ConfigError) as exc:
        print(f"slotshift bench: {exc}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        # asyncio.run has cancelled the run, and the stack was stopped on the way out.
        print("slotshift bench: interrupted; no summary written", file=sys.stderr)
        return 130
    meta = results_meta(scenario, scenario_path, settings, started, records, runs)
    policies = {name: record.summary for name, record in records.items()}
    document = summary_document(scenario, policies, meta)
    table = markdown_table(document)
    write_results(scenario, folder, document, table, records, meta)
    print(f"\n{table}", file=out)
    print(f"results: {folder}", file=out, flush=True)
    return 0


async def _run_all(scenario: Scenario, settings: RunSettings) -> dict[str, RunRecord]:
    clock = SystemClock()
    records: dict[str, RunRecord] = {}
    for run in scenario.policies:
        print(
            f"\n== {run.name} (policy {run.policy}): starting the local stack",
            file=settings.progress,
            flush=True,
        )
        result = await run_policy(scenario, run, settings, clock)
        summary = run_summary(scenario, result)
        await asyncio.to_thread(write_run_files, settings.out_dir / run.name, result)
        total = summary["total"]
        print(
            f"== {run.name}: {total['completed']} completed, {total['failed']} failed, "
            f"{total['output_throughput']:,.0f} output tok/s in the steady window",
            file=settings.progress,
            flush=True,
        )
        if summary["harness"]["disturbed"]:
            print(f"WARNING: {run.name}: {summary['harness']['disturbed']}", file=settings.progress)
        records[run.name] = RunRecord(
            summary,
            RunSeries(run.name, result.window, result.samples),
            limited=run.policy != POOL_BASELINE,
            nominal_slots=nominal_shares(result.config.pools[0]),
        )
    return records


def write_run_files(run_dir: Path, result: RunResult) -> None:
    """A run's traces.jsonl, samples.jsonl and decisions.jsonl in `run_dir`."""
    run_dir.mkdir(parents=True, exist_ok=True)
    _write_jsonl(run_dir / "traces.jsonl", (t.to_json() for t in result.traces))
    _write_jsonl(run_dir / "samples.jsonl", (s.to_json() for s in result.samples))
    _write_jsonl(
        run_dir / "decisions.jsonl",
        (
            {
                "id": d.id,
                "decided_at_wall_s": d.decided_at_wall_s,
                "outcome": d.outcome,
                "outputs": dict(d.outputs),
                "reason": d.reason,
            }
            for d in result.decisions
        ),
    )


def _write_jsonl(path: Path, rows: Any) -> None:
    with path.open("w", encoding="utf-8") as sink:
        for row in rows:
            sink.write(json.dumps(row, separators=(",", ":")) + "\n")


def write_results(
    scenario: Scenario,
    folder: Path,
    document: dict[str, Any],
    table: str,
    records: dict[str, RunRecord],
    meta: dict[str, Any],
) -> None:
    """summary.json, summary.md and the plots of a benchmark in `folder`."""
    (folder / "summary.json").write_text(
        json.dumps(document, indent=2, allow_nan=False) + "\n", encoding="utf-8"
    )
    heading = (
        f"# {scenario.name}: {', '.join(records)}\n\n"
        f"`{meta['command']}` — profile {meta['profile']}, seed {scenario.seed}, "
        f"warm-up {meta['warmup_s']:g} s, steady window {meta['duration']:g} s per run, "
        f"commit {meta['git_commit'] or 'unknown'}{' (dirty)' if meta['git_dirty'] else ''}.\n\n"
    )
    (folder / "summary.md").write_text(heading + table, encoding="utf-8")
    tenants = [t.name for t in scenario.tenants]
    series = [r.series for r in records.values()]
    plot_throughput(document["policies"], tenants, folder / "throughput.png")
    plot_allocation(series, tenants, scenario.total_budget_slots, folder / "allocation.png")
    plot_gpu_utilization(series, folder / "gpu_utilization.png")
    _plot_reclaims(scenario, records, folder)


def _plot_reclaims(scenario: Scenario, records: Mapping[str, RunRecord], folder: Path) -> None:
    """reclaim_TENANT.png for each bursty tenant: the first burst that starts in the steady
    window, in every run but the unpartitioned pool (which has no limits)."""
    limited = [r for r in records.values() if r.limited]
    if not limited:
        return
    window = limited[0].series.window
    for tenant in scenario.tenants:
        if not isinstance(tenant.arrival, OnOffArrival):
            continue
        starts = [s for s, _ in on_windows(tenant.arrival, window.end_s) if window.holds(s)]
        if starts:
            plot_reclaim(
                [r.series for r in limited],
                tenant.name,
                starts[0],
                limited[0].nominal_slots[tenant.name],
                folder / f"reclaim_{tenant.name}.png",
            )


def results_meta(
    scenario: Scenario,
    scenario_path: Path,
    settings: RunSettings,
    started: datetime.datetime,
    records: dict[str, RunRecord],
    runs: Sequence[str] | None,
) -> dict[str, Any]:
    """summary.json's `meta`: what ran, how, on which code and host."""
    engines = sorted({r.summary["engine"] for r in records.values()})
    profiles = sorted({r.summary["profile"] for r in records.values()})
    models = sorted({r.summary["model"] for r in records.values()})
    commit, dirty = _git_state()
    command = f"slotshift bench {scenario_path} --duration {settings.steady_s:g} --warmup {settings.warmup_s:g}"
    for path, value in settings.command_line_overrides.items():
        command += f" --set {path}={json.dumps(value)}"
    if runs is not None:
        command += f" --runs {','.join(runs)}"
    return {
        "scenario": scenario.name,
        "scenario_file": str(scenario_path),
        "description": scenario.description,
        "command": command,
        "seed": scenario.seed,
        "warmup_s": settings.warmup_s,
        "duration": settings.steady_s,
        "sample_interval_s": scenario.sample_interval_s,
        "engine": engines[0] if len(engines) == 1 else engines,
        "profile": profiles[0] if len(profiles) == 1 else profiles,
        "model": models[0] if len(models) == 1 else models,
        "runs": list(records),
        "git_commit": commit,
        "git_dirty": dirty,
        "started_at": started.isoformat(timespec="seconds"),
        "finished_at": datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds"),
        "host": {"cpus": os.cpu_count(), "python": platform.python_version()},
        "command_line_overrides": settings.command_line_overrides,
        "scenario_document": scenario.model_dump(mode="json"),
    }


def _git_state() -> tuple[str | None, bool | None]:
    """The repository's commit and whether the tree has changes; (None, None) outside git."""
    try:
        commit = subprocess.run(
            ["git", "rev-parse", "HEAD"],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            check=True,
            timeout=10,
        ).stdout.strip()
        status = subprocess.run(
            ["git", "status", "--porcelain"],
            cwd=REPO_ROOT,
            capture_output=True,
            text=True,
            check=True,
            timeout=10,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None, None
    return commit, bool(status.strip())
