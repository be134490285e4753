"""`slotshift simulate SCENARIO.yaml --frontier`: F(a) for a range of a (the best simulated
schedule and the upper bound, slotshift_tools/twin/frontier.py), with where each of the
scenario's policies lands in the twin (its output throughput and its minimum per-tenant SLO
attainment, from the same request records by the same functions), printed as a table and
written as frontier.json and frontier.png in the output folder. Every figure is the mean over
`--window-offsets` windows (frontier.py's docstring says why); `--window-offsets 1` is the
bench's single window."""

from __future__ import annotations

import datetime
import json
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TextIO

from matplotlib.figure import Figure

from slotshift.config import ConfigError
from slotshift_tools.bench.command import default_out_dir, scaled_warmup_s
from slotshift_tools.bench.scenario import POOL_BASELINE, Scenario, ScenarioError, load_scenario
from slotshift_tools.bench.stats import Window
from slotshift_tools.bench.trace import RequestTrace
from slotshift_tools.twin.command import simulate_scenario
from slotshift_tools.twin.frontier import (
    DEFAULT_LEVELS,
    DEFAULT_WINDOW_OFFSETS,
    DEFAULT_WINDOW_STEP_S,
    LENDER_SAFE_RATIO,
    FrontierPoint,
    FrontierProblem,
    OracleRun,
    WindowFigures,
    candidate_schedules,
    feasible_at,
    figures_by_window,
    frontier_points,
    frontier_problem,
    is_lender_safe,
    lender_safe_runs,
    mean_figures,
    min_attainment,
    nominal_static_run,
    search,
    throughput_bound,
    window_offsets,
)
from slotshift_tools.twin.settings import TwinSettings


@dataclass(frozen=True)
class PolicyPoint:
    """Where one of the scenario's runs lands, from its twin run's request records."""

    name: str
    output_tok_s: float
    attainment: dict[str, float | None]
    frontier_tok_s: float | None
    """F at the run's own minimum attainment (the best candidate reaching it)."""
    goodput: dict[str, float]
    """Each tenant's SLO goodput (req/s)."""
    goodput_vs_static: dict[str, float | None]
    """Each tenant's goodput over the nominal static split's (None where that has none, or
    the split was not simulated)."""
    safe_frontier_tok_s: float | None
    """F_safe at the run's own minimum attainment (the best lender-safe candidate)."""
    lender_safe: bool
    """Whether the run is lender-safe against the nominal static split (`is_lender_safe`);
    False when the split was not simulated."""
    per_window: tuple[WindowFigures, ...] = ()
    """Its figures in each window (the means above are theirs)."""
    window_ratios: tuple[float | None, ...] = ()
    """In each window alone: its throughput there over F there at its attainment there (the
    ratio a single window would have reported)."""

    @property
    def min_attainment(self) -> float:
        return min_attainment(self.attainment)

    @property
    def safe_ratio(self) -> float | None:
        """output / F_safe(its own attainment)."""
        if self.safe_frontier_tok_s is None or self.safe_frontier_tok_s == 0:
            return None
        return self.output_tok_s / self.safe_frontier_tok_s

    @property
    def ratio(self) -> float | None:
        """output / F(its own attainment)."""
        if self.frontier_tok_s is None or self.frontier_tok_s == 0:
            return None
        return self.output_tok_s / self.frontier_tok_s


@dataclass(frozen=True)
class FrontierResult:
    """Everything `--frontier` reports for one scenario."""

    scenario: str
    windows: tuple[Window, ...]
    """The windows every figure is the mean over."""
    points: list[FrontierPoint]
    safe_points: list[FrontierPoint]
    """F_safe(a): the frontier of the lender-safe candidates."""
    runs: list[OracleRun]
    skipped: int
    """Candidates left out when the CPU budget ran out."""
    bound_without_pausing_tok_s: float
    bound_carry_in_tok_s: float
    bound_inside_tok_s: float
    policies: list[PolicyPoint]
    cpu_s: float


def simulate_policies(
    scenario: Scenario,
    problem: FrontierProblem,
    *,
    overrides: dict[str, Any] | None = None,
    settings: TwinSettings | None = None,
) -> dict[str, list[RequestTrace]]:
    """Each of the scenario's runs in the twin (with the command line's `overrides`), once, to
    the end of the problem's last window: its request records."""
    last = problem.windows[-1]
    simulated = simulate_scenario(
        scenario,
        steady_s=last.length_s,
        warmup_s=last.start_s,
        overrides=overrides,
        settings=settings,
    )
    return {name: run.result.traces for name, run in simulated.items()}


def place(
    name: str,
    traces: list[RequestTrace],
    problem: FrontierProblem,
    runs: Sequence[OracleRun],
    safe_runs: Sequence[OracleRun],
) -> PolicyPoint:
    """Where a run lands: its output throughput, attainment and goodput by the oracle's own
    functions, as means over the problem's windows, and F (among `runs`) and F_safe (among
    `safe_runs`, `lender_safe_runs(runs)`) at its own minimum attainment; and in each window
    alone, its ratio to F there."""
    per_window = figures_by_window(traces, problem.windows, problem.slos)
    mean = mean_figures(per_window)
    level = mean.min_attainment
    best = feasible_at(runs, level)
    best_safe = feasible_at(safe_runs, level)
    static = nominal_static_run(runs)
    served = mean.goodput
    return PolicyPoint(
        name=name,
        output_tok_s=mean.output_throughput,
        attainment=mean.attainment,
        frontier_tok_s=None if best is None else best.output_throughput,
        goodput=served,
        goodput_vs_static={
            tenant: (
                value / static.goodput[tenant]
                if static is not None and static.goodput.get(tenant)
                else None
            )
            for tenant, value in served.items()
        },
        safe_frontier_tok_s=None if best_safe is None else best_safe.output_throughput,
        lender_safe=static is not None and is_lender_safe(served, static.goodput),
        per_window=per_window,
        window_ratios=tuple(
            _window_ratio(figures, runs, index) for index, figures in enumerate(per_window)
        ),
    )


def _window_ratio(figures: WindowFigures, runs: Sequence[OracleRun], index: int) -> float | None:
    best = feasible_at(runs, figures.min_attainment, window_index=index)
    if best is None or best.per_window[index].output_throughput == 0:
        return None
    return figures.output_throughput / best.per_window[index].output_throughput


def compute_frontier(
    scenario: Scenario,
    problem: FrontierProblem,
    *,
    levels: Sequence[float] = DEFAULT_LEVELS,
    cpu_budget_s: float = 600.0,
    quick: bool = False,
    with_policies: bool = True,
    overrides: dict[str, Any] | None = None,
    settings: TwinSettings | None = None,
    progress: TextIO | None = None,
) -> FrontierResult:
    """Search the candidates within `cpu_budget_s` of CPU (the policies' twin runs are extra),
    bound them, and place the policies."""
    started = time.process_time()

    def report(run: OracleRun) -> None:
        if progress is not None:
            print(
                f"  {run.schedule.name:28s} {run.output_throughput:8.0f} tok/s  "
                f"min attainment {run.min_attainment:.3f}  ({run.cpu_s:.1f} s)",
                file=progress,
            )

    # The policies' twin runs first: they take seconds, and a twin that fails should fail
    # before minutes of search.
    simulated = (
        simulate_policies(scenario, problem, overrides=overrides, settings=settings)
        if with_policies
        else {}
    )
    runs, skipped = search(
        problem,
        candidate_schedules(problem, quick=quick),
        cpu_budget_s=cpu_budget_s,
        progress=report,
    )
    with_pausing = throughput_bound(problem, pausing=True)
    without = throughput_bound(problem, pausing=False)
    bound = max(with_pausing.total_tok_s, without.total_tok_s)
    points = frontier_points(runs, bound, levels)
    safe_runs = lender_safe_runs(runs)
    safe_points = frontier_points(safe_runs, bound, levels)
    policies = [place(name, traces, problem, runs, safe_runs) for name, traces in simulated.items()]
    return FrontierResult(
        scenario=scenario.name,
        windows=problem.windows,
        points=points,
        safe_points=safe_points,
        runs=runs,
        skipped=skipped,
        bound_without_pausing_tok_s=without.total_tok_s,
        bound_carry_in_tok_s=with_pausing.carry_in_tok_s,
        bound_inside_tok_s=with_pausing.inside_tok_s,
        policies=policies,
        cpu_s=time.process_time() - started,
    )


def result_document(result: FrontierResult) -> dict[str, Any]:
    """frontier.json's content."""
    return {
        "scenario": result.scenario,
        "windows": [[w.start_s, w.end_s] for w in result.windows],
        "cpu_s": result.cpu_s,
        "candidates_skipped": result.skipped,
        "bound": {
            "total_tok_s": result.points[0].bound_tok_s if result.points else None,
            "without_pausing_tok_s": result.bound_without_pausing_tok_s,
            "carry_in_tok_s": result.bound_carry_in_tok_s,
            "inside_tok_s": result.bound_inside_tok_s,
        },
        "frontier": [
            {
                "level": p.level,
                "feasible_tok_s": p.feasible_tok_s,
                "schedule": p.schedule,
                "bound_tok_s": p.bound_tok_s,
                "gap": p.gap,
                "by_window_tok_s": list(p.by_window_tok_s),
            }
            for p in result.points
        ],
        "lender_safe_ratio": LENDER_SAFE_RATIO,
        "safe_frontier": [
            {
                "level": p.level,
                "feasible_tok_s": p.feasible_tok_s,
                "schedule": p.schedule,
                "by_window_tok_s": list(p.by_window_tok_s),
            }
            for p in result.safe_points
        ],
        "candidates": [
            {
                **run.schedule.describe(),
                "output_tok_s": run.output_throughput,
                "attainment": run.attainment,
                "min_attainment": run.min_attainment,
                "goodput": run.goodput,
                "max_in_engine": run.max_in_engine,
                "max_limits_sum": run.max_limits_sum,
                "share_shortfall_slots": run.share_shortfall_slots,
                "pauses": run.pauses,
                "cpu_s": run.cpu_s,
                "per_window": [_figures_document(f) for f in run.per_window],
            }
            for run in result.runs
        ],
        "policies": [
            {
                "name": p.name,
                "output_tok_s": p.output_tok_s,
                "attainment": p.attainment,
                "min_attainment": p.min_attainment,
                "frontier_tok_s": p.frontier_tok_s,
                "ratio": p.ratio,
                "goodput": p.goodput,
                "goodput_vs_static": p.goodput_vs_static,
                "lender_safe": p.lender_safe,
                "safe_frontier_tok_s": p.safe_frontier_tok_s,
                "safe_ratio": p.safe_ratio,
                "window_ratios": list(p.window_ratios),
                "per_window": [_figures_document(f) for f in p.per_window],
            }
            for p in result.policies
        ],
    }


def _figures_document(figures: WindowFigures) -> dict[str, Any]:
    return {
        "output_tok_s": figures.output_throughput,
        "attainment": figures.attainment,
        "min_attainment": figures.min_attainment,
        "goodput": figures.goodput,
    }


def _windows_phrase(windows: Sequence[Window]) -> str:
    first = windows[0]
    if len(windows) == 1:
        return f"the window [{first.start_s:g}, {first.end_s:g}] s"
    offsets = ", ".join(f"{w.start_s - first.start_s:g}" for w in windows)
    return (
        f"means over {len(windows)} windows of {first.length_s:g} s starting "
        f"{offsets} s after {first.start_s:g} s"
    )


def _range(values: Sequence[float | None], fmt: str) -> str:
    present = [v for v in values if v is not None]
    if not present:
        return "-"
    low, high = min(present), max(present)
    return format(low, fmt) if low == high else f"{format(low, fmt)}-{format(high, fmt)}"


def markdown(result: FrontierResult) -> str:
    """The tables the command prints."""
    several = len(result.windows) > 1
    lines = [
        f"F(a) on {result.scenario} (output tok/s, {_windows_phrase(result.windows)}; bound "
        f"{result.points[0].bound_tok_s:,.0f} = {result.bound_inside_tok_s:,.0f} inside the "
        f"window + {result.bound_carry_in_tok_s:,.0f} carry-in); F_safe(a) among the "
        "lender-safe schedules (every tenant's SLO goodput >= "
        f"{LENDER_SAFE_RATIO:g}x the nominal static split's)",
        "",
        "| a | F(a) feasible | schedule | bound | gap | F_safe(a) | schedule |"
        + (" F(a) in one window |" if several else ""),
        "| ---: | ---: | --- | ---: | ---: | ---: | --- |" + (" ---: |" if several else ""),
    ]
    for p, safe in zip(result.points, result.safe_points, strict=True):
        gap = "-" if p.gap is None else f"{100 * p.gap:.1f}%"
        lines.append(
            f"| {p.level:.2f} | {_tok_s(p.feasible_tok_s)} | {p.schedule or '-'} "
            f"| {p.bound_tok_s:,.0f} | {gap} | {_tok_s(safe.feasible_tok_s)} | {safe.schedule or '-'} |"
            + (f" {_range(p.by_window_tok_s, ',.0f')} |" if several else "")
        )
    if result.policies:
        lines += [
            "",
            "| run | output tok/s | min attainment | per tenant | F(own a) | ratio "
            "| goodput vs static | F_safe(own a) | ratio to F_safe |"
            + (" ratio in one window |" if several else ""),
            "| --- | ---: | ---: | --- | ---: | ---: | --- | ---: | ---: |"
            + (" ---: |" if several else ""),
        ]
        for q in result.policies:
            tenants = ", ".join(
                f"{k} {v:.3f}" if v is not None else f"{k} -" for k, v in q.attainment.items()
            )
            served = ", ".join(
                f"{k} {v:.3f}" if v is not None else f"{k} -"
                for k, v in q.goodput_vs_static.items()
            )
            note = (
                " (no per-tenant limits: outside the schedules' space)"
                if q.name == POOL_BASELINE
                else ""
            )
            lines.append(
                f"| {q.name}{note} | {q.output_tok_s:,.0f} | {q.min_attainment:.3f} | {tenants} "
                f"| {_tok_s(q.frontier_tok_s)} | {_ratio(q.ratio)} | {served} "
                f"| {_tok_s(q.safe_frontier_tok_s)} | {_ratio(q.safe_ratio)} |"
                + (f" {_range(q.window_ratios, '.3f')} |" if several else "")
            )
    if result.skipped:
        lines.append(f"\n{result.skipped} candidates left out: the CPU budget ran out")
    return "\n".join(lines)


def _tok_s(value: float | None) -> str:
    return "-" if value is None else f"{value:,.0f}"


def _ratio(value: float | None) -> str:
    return "-" if value is None else f"{value:.3f}"


def plot(result: FrontierResult, path: Path) -> None:
    """The frontier curve (feasible, a step function of a), the bound, every candidate and
    each policy's point, throughput against minimum attainment."""
    figure = Figure(figsize=(7.5, 4.8))
    axes = figure.subplots()
    axes.scatter(
        [r.min_attainment for r in result.runs],
        [r.output_throughput for r in result.runs],
        s=10,
        color="tab:gray",
        alpha=0.5,
        label="candidate schedules",
    )
    feasible = [p for p in result.points if p.feasible_tok_s is not None]
    axes.step(
        [p.level for p in feasible],
        [p.feasible_tok_s or 0.0 for p in feasible],
        where="post",
        color="tab:blue",
        label="F(a), feasible",
    )
    safe = [p for p in result.safe_points if p.feasible_tok_s is not None]
    axes.step(
        [p.level for p in safe],
        [p.feasible_tok_s or 0.0 for p in safe],
        where="post",
        color="tab:green",
        label=f"F_safe(a): every tenant's goodput >= {LENDER_SAFE_RATIO:g}x static's",
    )
    levels = [p.level for p in result.points]
    axes.plot(
        levels, [p.bound_tok_s for p in result.points], "--", color="tab:red", label="upper bound"
    )
    axes.plot(
        levels,
        [result.bound_inside_tok_s] * len(levels),
        ":",
        color="tab:red",
        label="bound without the carry-in term (not a bound)",
    )
    markers = "osD^vP*X"
    for index, q in enumerate(result.policies):
        axes.scatter(
            [q.min_attainment],
            [q.output_tok_s],
            marker=markers[index % len(markers)],
            s=60,
            label=q.name,
            zorder=3,
        )
    axes.set_xlabel("minimum per-tenant SLO attainment a")
    axes.set_ylabel("total output throughput (tok/s)")
    several = f", means over {len(result.windows)} windows" if len(result.windows) > 1 else ""
    axes.set_title(f"{result.scenario}: the frontier F(a){several}")
    axes.grid(alpha=0.3)
    axes.legend(fontsize=7, loc="lower left")
    figure.tight_layout()
    figure.savefig(path, dpi=110)


def run_frontier(
    scenario_path: Path,
    *,
    duration_s: float | None = None,
    warmup_s: float | None = None,
    out_dir: Path | None = None,
    overrides: dict[str, Any] | None = None,
    cpu_budget_s: float = 600.0,
    settings: TwinSettings | None = None,
    windows: int = DEFAULT_WINDOW_OFFSETS,
    window_step_s: float = DEFAULT_WINDOW_STEP_S,
    out: TextIO = sys.stdout,
) -> int:
    """The `--frontier` command, every figure the mean over `windows` windows `window_step_s`
    apart (`window_offsets`); its exit status (0 done, 2 a bad scenario, config or window)."""
    try:
        scenario = load_scenario(scenario_path)
    except ScenarioError as exc:
        print(f"slotshift simulate: invalid scenario: {exc}", file=sys.stderr)
        return 2
    if (duration_s is not None and duration_s <= 0) or (warmup_s is not None and warmup_s < 0):
        print(
            "slotshift simulate: --duration must be positive, --warmup not negative",
            file=sys.stderr,
        )
        return 2
    steady_s = duration_s if duration_s is not None else scenario.steady_s
    warmup = warmup_s if warmup_s is not None else scaled_warmup_s(scenario, steady_s)
    try:
        problem = frontier_problem(
            scenario,
            warmup_s=warmup,
            steady_s=steady_s,
            overrides=overrides,
            window_offsets_s=window_offsets(windows, window_step_s),
        )
    except (ConfigError, ValueError) as exc:
        print(f"slotshift simulate: {exc}", file=sys.stderr)
        return 2
    started = datetime.datetime.now(datetime.UTC)
    folder = (
        out_dir if out_dir is not None else default_out_dir(f"{scenario.name}-frontier", started)
    )
    print(
        f"frontier of {scenario.name}: simulating candidate schedules, "
        f"{_windows_phrase(problem.windows)}",
        file=out,
    )
    result = compute_frontier(
        scenario,
        problem,
        cpu_budget_s=cpu_budget_s,
        overrides=overrides,
        settings=settings,
        progress=out,
    )
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "frontier.json").write_text(
        json.dumps(result_document(result), indent=2) + "\n", encoding="utf-8"
    )
    plot(result, folder / "frontier.png")
    print(markdown(result), file=out)
    print(f"frontier: {result.cpu_s:.0f} s of CPU; results: {folder}", file=out)
    return 0
