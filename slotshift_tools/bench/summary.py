"""The results: summary.json's document and the markdown table, from the runs' records.

summary.json:
- `policies.<run>.total.<field>` and `policies.<run>.tenants.<tenant>.<field>`: every field of
  slotshift_tools.bench.stats.RESULT_FIELDS (`vllm bench serve`'s names), plus the study's figures:
  total: mean_/peak_gpu_utilization_pct and gpu_utilization_emulated, decisions, moves, holds,
  rejected (the controller in the steady window); per tenant: moves_toward, final_cap_slots (the
  limit in force at the window's end; null in the pool baseline, where no tenant has a limit of
  its own), mean_limit_slots and mean_outstanding (the client-side demand); for tenants with
  on/off bursts, RECLAIM_FIELDS (slotshift_tools/bench/reclaim.py).
- WASTE_FIELDS (slotshift_tools/bench/waste.py), total (the engine's counters) and per tenant (the
  gateways'; null in the pool baseline, whose gateways know one tenant): tokens the engine
  computed that no client received, and their share of the output received.
- `policies.<run>.controller`: the same trajectory over the control plane's own tenants.
- `ratios.<a>/<b>`: a's figure over b's for the RatioField figures, total and per tenant.
- `goals`: the scenario's targets (a ratio between two runs, or one run's own value) with their
  values and whether they were met.
- `meta`: scenario, durations, seed, profile, git commit, and how everything is computed.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any, get_args

from slotshift.apportion import nominal_shares
from slotshift_tools.bench.arrivals import on_windows
from slotshift_tools.bench.decisions import trajectory
from slotshift_tools.bench.reclaim import burst_start_ttft_s, reclaim
from slotshift_tools.bench.runner import RunResult
from slotshift_tools.bench.sampler import Sample
from slotshift_tools.bench.scenario import POOL_BASELINE, Goal, OnOffArrival, RatioField, Scenario
from slotshift_tools.bench.stats import Figure, mean_and_peak, percentile, rate, ratio, summarise
from slotshift_tools.bench.waste import NO_WASTE_READING, pool_waste, tenant_waste

RATIO_FIELDS: tuple[str, ...] = get_args(RatioField)

STUDY_TOTAL_FIELDS = (
    "engine_output_throughput",
    "mean_gpu_utilization_pct",
    "peak_gpu_utilization_pct",
    "gpu_utilization_emulated",
    "decisions",
    "moves",
    "holds",
    "rejected",
)
"""The study's own figures, per run."""

STUDY_TENANT_FIELDS = ("moves_toward", "final_cap_slots", "mean_limit_slots", "mean_outstanding")
"""The study's figures per tenant."""

RECLAIM_FIELDS = (
    "reclaim_median_s",
    "reclaim_p90_s",
    "reclaim_bursts",
    "reclaim_short_bursts",
    "reclaim_unresolved",
    "burst_start_ttft_median_ms",
    "burst_start_ttft_p90_ms",
)
"""Per tenant with on/off bursts (null for others and in the pool baseline): slotshift_tools/bench/
reclaim.py's times over the bursts that start in the window, how many bursts were measured, in
how many the tenant was ever short, and in how many its first shortfall outlasted the burst; the
bursts' start waits (median and p90, ms)."""

WINDOWING = (
    "A request counts when it ends inside the steady window, wherever it started (client-side "
    "monotonic times, from the start of the warm-up); requests still running when the load "
    "stops are cancelled and never count. Throughputs divide by the "
    "window's length (`duration`). Samples (GPU, limits) count when taken inside the window; "
    "decisions when decided inside it (wall clock)."
)

DEFINITIONS = {
    "windowing": WINDOWING,
    "percentiles": "numpy's default 'linear' method; median = p50; std with ddof=0",
    "tpot": "(e2el - ttft) / (output tokens - 1), requests with at least 2 output tokens",
    "itl": "gaps between consecutive text chunks after the first, pooled over requests",
    "request_goodput": "completed requests meeting every SLO of their tenant, per second "
    "(a one-token answer meets any TPOT objective)",
    "move_toward": "a published decision that raised the tenant's limit over the limits in "
    "force before it; a hold is a decision with outcome HELD",
    "engine_output_throughput": "the engine's own vllm:generation_tokens_total, its increase "
    "between the first and last samples in the window per second (server-side, all requests)",
    "gpu_utilization": "the engine's busy fraction of wall time; from the emulator's "
    "slotshift_sim_gpu_utilization_percent (labelled emulated) or the agent's NVML reading",
    "reclaim": "per burst of an on/off tenant starting in the window: the length of its first "
    "shortfall, from the first sample at which the tenant queues at the gateways while running "
    "less than its nominal share to the first later sample at which it does not (0 when it is "
    "never short); resolution: the sample interval",
    "burst_start_ttft": "per burst of an on/off tenant starting in the window: the slowest time "
    "to first token among its requests sent in the burst's first second (its first requests' "
    "wait for slots plus the engine's prefill; a request's resolution)",
    "waste": "output tokens the engine generated that no client received (restarts) plus prompt "
    "tokens it computed again (resumes) that were not prefix-cache hits, between the first and "
    "last samples in the window. Total: vllm:generation_tokens_total's increase minus the output "
    "tokens the clients received, plus (vllm:prefix_cache_queries_total - "
    "vllm:prefix_cache_hits_total)'s increase minus the prompt tokens of the requests whose first "
    "token arrived (their first prefill, taken to miss the cache), each clamped at 0; the span's "
    "ends are the moments the engine's /metrics was read. Per tenant: the gateways' "
    "slotshift_gateway_waste_tokens_total (their own count: an upper bound where the engine's "
    "usage reports no cached prompt tokens). waste_percent: of the output tokens the clients "
    "received in the same span. null: a counter is absent",
    "pool_baseline": "one tenant holding every key, floor 0, the whole budget, static policy; "
    "requests attributed to the scenario's tenants client-side",
}


DISTURBED_LOOP_LAG_P99_MS = 100.0
"""A run whose harness event loop was this late at p99 (a tenth of the 2 s decision period, ten
decode steps) shared its CPUs with something else: its timings and throughputs are suspect."""


def disturbance(harness: Mapping[str, Any]) -> str | None:
    """Why a run's figures are suspect, or None when the harness kept up."""
    lag = harness.get("loop_lag_p99_ms")
    if lag is None or lag <= DISTURBED_LOOP_LAG_P99_MS:
        return None
    return (
        f"the harness's event loop lagged (p99 {lag:.0f} ms, max "
        f"{harness.get('loop_lag_max_ms') or 0:.0f} ms; 1-min load average "
        f"{harness.get('load_average_1m_before', 0):.1f} before, "
        f"{harness.get('load_average_1m_after', 0):.1f} after): the host's CPUs were contended, "
        "so the harness saw events late and any engine on those CPUs (the emulator, vLLM's CPU "
        "build) fell behind; do not compare this run"
    )


def run_summary(scenario: Scenario, result: RunResult) -> dict[str, Any]:
    """`policies.<run>` for one run."""
    window = result.window
    slos = {t.name: t.slo for t in scenario.tenants}
    total: dict[str, Any] = dict(summarise(result.traces, window, slos))
    tenants: dict[str, dict[str, Any]] = {
        t.name: dict(summarise([r for r in result.traces if r.tenant == t.name], window, slos))
        for t in scenario.tenants
    }
    in_window = [s for s in result.samples if window.holds(s.t_s)]
    mean_gpu, peak_gpu = mean_and_peak(
        ((s.t_s, s.gpu_utilization_pct) for s in result.samples), window
    )
    emulated = {s.gpu_emulated for s in in_window if s.gpu_emulated is not None}
    start_wall_s, end_wall_s = result.window_wall_s
    path = trajectory(
        result.decisions,
        start_wall_s=start_wall_s,
        end_wall_s=end_wall_s,
        tenants=result.stack_tenants,
    )
    final_caps = _final_caps(in_window)
    total.update(
        engine_output_throughput=rate(
            ((s.t_s, s.engine_generation_tokens) for s in result.samples), window
        ),
        mean_gpu_utilization_pct=mean_gpu,
        peak_gpu_utilization_pct=peak_gpu,
        # Mixed sources cannot happen within one run; None: no reading at all.
        gpu_utilization_emulated=emulated.pop() if len(emulated) == 1 else None,
        decisions=path.decisions,
        moves=path.moves,
        holds=path.holds,
        rejected=path.rejected,
    )
    total.update(pool_waste(result.samples, result.traces, window).figures())
    baseline = result.run.policy == POOL_BASELINE
    for name, figures in tenants.items():
        figures.update(_reclaim_figures(scenario, result, name))
        waste = (
            NO_WASTE_READING
            if baseline
            else tenant_waste(result.samples, result.traces, window, name)
        )
        figures.update(waste.figures())
        figures.update(
            moves_toward=path.moves_toward.get(name, 0),
            final_cap_slots=None if baseline else final_caps.get(name),
            mean_limit_slots=None if baseline else _mean(s.limits.get(name) for s in in_window),
            mean_outstanding=_mean(s.outstanding.get(name) for s in in_window),
        )
    return {
        "policy": result.run.policy,
        "model": result.model,
        "engine": result.config.local_stack.engine,
        "profile": result.config.engine_sim.profile,
        "window_s": [window.start_s, window.end_s],
        "requests_sent": len(result.traces),
        "harness": {**result.harness, "disturbed": disturbance(result.harness)},
        "total": total,
        "tenants": tenants,
        "controller": {
            "tenants": result.stack_tenants,
            "final_caps": final_caps,
            "moves_toward": dict(path.moves_toward),
            "decisions": path.decisions,
            "moves": path.moves,
            "holds": path.holds,
            "rejected": path.rejected,
        },
    }


def _reclaim_figures(scenario: Scenario, result: RunResult, tenant: str) -> dict[str, Any]:
    arrival = scenario.tenant(tenant).arrival
    if result.run.policy == POOL_BASELINE or not isinstance(arrival, OnOffArrival):
        return dict.fromkeys(RECLAIM_FIELDS)
    pool = result.config.pools[0]
    bursts = on_windows(arrival, result.window.end_s)
    measured = reclaim(result.samples, tenant, nominal_shares(pool)[tenant], bursts, result.window)
    waits_ms = [
        w * 1000.0 for w in burst_start_ttft_s(result.traces, tenant, bursts, result.window)
    ]
    return {
        "reclaim_median_s": measured.median_s,
        "reclaim_p90_s": measured.p90_s,
        "reclaim_bursts": measured.bursts,
        "reclaim_short_bursts": measured.short_bursts,
        "reclaim_unresolved": measured.unresolved,
        "burst_start_ttft_median_ms": percentile(waits_ms, 50) if waits_ms else None,
        "burst_start_ttft_p90_ms": percentile(waits_ms, 90) if waits_ms else None,
    }


def _final_caps(in_window: Sequence[Sample]) -> dict[str, int]:
    for sample in reversed(in_window):
        if sample.limits:
            return dict(sample.limits)
    return {}


def _mean(values: Any) -> float | None:
    present = [v for v in values if v is not None]
    return math.fsum(present) / len(present) if present else None


def ratio_pairs(runs: Sequence[str], baseline_runs: Sequence[str]) -> list[tuple[str, str]]:
    """(a, b) for every run a that is not a baseline against every run before it and every
    baseline: for [static, demand, pool] that is static/pool, demand/static, demand/pool."""
    pairs = []
    for index, a in enumerate(runs):
        if a in baseline_runs:
            continue
        for b in runs:
            if b != a and (b in baseline_runs or runs.index(b) < index):
                pairs.append((a, b))
    return pairs


def ratios(
    policies: Mapping[str, Mapping[str, Any]], pairs: Sequence[tuple[str, str]]
) -> dict[str, Any]:
    """`ratios.<a>/<b>`: RATIO_FIELDS of a over b, total and per tenant."""
    document: dict[str, Any] = {}
    for a, b in pairs:
        entry: dict[str, Any] = {
            field: ratio(policies[a]["total"][field], policies[b]["total"][field])
            for field in RATIO_FIELDS
        }
        entry["tenants"] = {
            tenant: {
                field: ratio(figures[field], policies[b]["tenants"][tenant][field])
                for field in RATIO_FIELDS
            }
            for tenant, figures in policies[a]["tenants"].items()
        }
        document[f"{a}/{b}"] = entry
    return document


def goal_results(
    goals: Sequence[Goal], policies: Mapping[str, Mapping[str, Any]]
) -> list[dict[str, Any]]:
    """Each goal with its value and whether it was met (None: a figure is missing)."""
    results = []
    for goal in goals:
        value: Figure = None
        if all(run in policies for run in goal.runs):
            figures = [_figure(policies[run], goal) for run in goal.runs]
            value = figures[0] if len(figures) == 1 else ratio(figures[0], figures[1])
        met = goal_met(value, goal.at_least, goal.at_most)
        results.append({**goal.model_dump(), "value": value, "met": met})
    return results


def goal_met(value: Figure, at_least: float | None, at_most: float | None) -> bool | None:
    """Whether a goal's value meets its bound; None when there is no value."""
    if value is None:
        return None
    if at_least is not None:
        return value >= at_least
    if at_most is not None:
        return value <= at_most
    return None


MET_TEXT = {True: "yes", False: "NO", None: "-"}
"""How a goal's outcome reads in a table."""


def goal_label(goal: Mapping[str, Any]) -> str:
    """A goal of summary.json's `goals` as a table names it: what it compares, and its scope."""
    scope = "total" if goal["tenant"] is None else f"tenant {goal['tenant']}"
    return f"{goal.get('ratio') or goal.get('run')} {goal['field']} ({scope})"


def goal_target(goal: Mapping[str, Any]) -> str:
    """A goal's bound as a table shows it."""
    if goal["at_least"] is not None:
        return f">= {goal['at_least']:g}"
    return f"<= {goal['at_most']:g}"


def _figure(policy: Mapping[str, Any], goal: Goal) -> Figure:
    figures = policy["total"] if goal.tenant is None else policy["tenants"][goal.tenant]
    value: Figure = figures[goal.field]
    return value


def summary_document(
    scenario: Scenario,
    policies: Mapping[str, Mapping[str, Any]],
    meta: Mapping[str, Any],
) -> dict[str, Any]:
    """The whole summary.json."""
    runs = [r.name for r in scenario.policies if r.name in policies]
    baselines = [r.name for r in scenario.policies if r.policy == POOL_BASELINE]
    return {
        "meta": {**meta, "definitions": DEFINITIONS},
        "policies": dict(policies),
        "ratios": ratios(policies, ratio_pairs(runs, baselines)),
        "goals": goal_results(scenario.goals, policies),
    }


# --- the markdown table ---------------------------------------------------------------------

_PERFORMANCE_ROWS: tuple[tuple[str, str | None, str, str], ...] = (
    # (label, tenant or None for total / "*" for each tenant, field, format)
    ("output throughput (tok/s)", None, "output_throughput", "{:,.0f}"),
    ("output throughput {tenant} (tok/s)", "*", "output_throughput", "{:,.0f}"),
    ("delivered output (tok/s)", None, "delivered_output_throughput", "{:,.0f}"),
    ("delivered output {tenant} (tok/s)", "*", "delivered_output_throughput", "{:,.0f}"),
    ("engine output (tok/s)", None, "engine_output_throughput", "{:,.0f}"),
    ("completed requests", None, "completed", "{:,}"),
    ("completed {tenant}", "*", "completed", "{:,}"),
    ("requests/s", None, "request_throughput", "{:,.1f}"),
    ("goodput (req/s)", None, "request_goodput", "{:,.1f}"),
    ("failed", None, "failed", "{:,}"),
    ("p99 E2EL (ms)", None, "p99_e2el_ms", "{:,.0f}"),
    ("p99 E2EL {tenant} (ms)", "*", "p99_e2el_ms", "{:,.0f}"),
    ("mean TTFT {tenant} (ms)", "*", "mean_ttft_ms", "{:,.0f}"),
    ("p99 TTFT {tenant} (ms)", "*", "p99_ttft_ms", "{:,.0f}"),
    ("mean TPOT {tenant} (ms)", "*", "mean_tpot_ms", "{:,.2f}"),
)

_STUDY_ROWS: tuple[tuple[str, str | None, str, str], ...] = (
    ("mean GPU utilisation{emulated} (%)", None, "mean_gpu_utilization_pct", "{:.1f}"),
    ("peak GPU utilisation{emulated} (%)", None, "peak_gpu_utilization_pct", "{:.1f}"),
    ("moves toward {tenant}", "*", "moves_toward", "{}"),
    ("holds", None, "holds", "{}"),
    ("mean limit {tenant} (slots)", "*", "mean_limit_slots", "{:.1f}"),
    ("final cap {tenant} (slots)", "*", "final_cap_slots", "{}"),
    ("reclaim median {tenant} (s)", "*", "reclaim_median_s", "{:.2f}"),
    ("reclaim p90 {tenant} (s)", "*", "reclaim_p90_s", "{:.2f}"),
    ("burst start TTFT median {tenant} (ms)", "*", "burst_start_ttft_median_ms", "{:,.0f}"),
    ("waste (tokens)", None, "waste_tokens", "{:,.0f}"),
    ("waste (% of output)", None, "waste_percent", "{:.2f}"),
    ("waste {tenant} (% of its output)", "*", "waste_percent", "{:.2f}"),
    # Every latency the client measures includes its own event loop's lag: a run's tail
    # latencies are to be read against it.
    ("harness loop lag p99 (ms)", None, "harness.loop_lag_p99_ms", "{:.0f}"),
)


def markdown_table(document: Mapping[str, Any]) -> str:
    """The results as a markdown table: one column per run, then one per ratio."""
    policies: Mapping[str, Any] = document["policies"]
    runs = list(policies)
    pairs = list(document["ratios"])
    tenants = list(next(iter(policies.values()))["tenants"]) if policies else []
    emulated = any(p["total"].get("gpu_utilization_emulated") for p in policies.values())
    header = ["figure", *runs, *pairs]
    lines = [_row(header), _row(["---"] + ["---:"] * (len(header) - 1))]
    for rows, with_ratios in ((_PERFORMANCE_ROWS, True), (_STUDY_ROWS, False)):
        for label, which, field, fmt in rows:
            for tenant in tenants if which == "*" else [None]:
                text = label.format(tenant=tenant, emulated=", emulated" if emulated else "")
                cells = [_cell(_lookup(policies[r], tenant, field), fmt) for r in runs]
                ratio_cells = []
                for pair in pairs:
                    a, b = pair.split("/")
                    value = (
                        ratio(
                            _lookup(policies[a], tenant, field), _lookup(policies[b], tenant, field)
                        )
                        if with_ratios
                        else None
                    )
                    ratio_cells.append(_cell(value, "{:.3f}"))
                lines.append(_row([text, *cells, *ratio_cells]))
    for run in runs:
        reason = policies[run].get("harness", {}).get("disturbed")
        if reason:
            lines.append("")
            lines.append(f"WARNING: run {run}: {reason}.")
    goals = document.get("goals") or []
    if goals:
        lines.append("")
        lines.append("| goal | value | target | met |")
        lines.append("| --- | ---: | ---: | --- |")
        for goal in goals:
            lines.append(
                _row(
                    [
                        goal_label(goal),
                        _cell(goal["value"], "{:.3f}"),
                        goal_target(goal),
                        MET_TEXT[goal["met"]],
                    ]
                )
            )
    return "\n".join(lines) + "\n"


def _lookup(policy: Mapping[str, Any], tenant: str | None, field: str) -> Figure:
    section, _, name = field.rpartition(".")
    if section:
        value_of_section: Figure = policy.get(section, {}).get(name)
        return value_of_section
    figures = policy["total"] if tenant is None else policy["tenants"].get(tenant, {})
    value: Figure = figures.get(field)
    return value


def _cell(value: Figure, fmt: str) -> str:
    if value is None:
        return "-"
    return fmt.format(value)


def _row(cells: Sequence[str]) -> str:
    return "| " + " | ".join(cells) + " |"
