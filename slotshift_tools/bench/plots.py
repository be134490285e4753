"""The plots a person reads at a glance: throughput, allocation against demand, a burst's
reclaim, GPU utilisation.

Drawn with matplotlib's object API on the Agg canvas (Figure.savefig), never pyplot: no global
figure state, no display needed.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from matplotlib.axes import Axes
from matplotlib.figure import Figure

from slotshift_tools.bench.sampler import Sample
from slotshift_tools.bench.stats import Window

_COLOURS = ("tab:blue", "tab:orange", "tab:green", "tab:red", "tab:purple", "tab:brown")
_POOL_COLOUR = "tab:gray"
DPI = 110


@dataclass(frozen=True)
class RunSeries:
    """What the time plots need of one run."""

    name: str
    window: Window
    samples: Sequence[Sample]


def tenant_colours(tenants: Sequence[str]) -> dict[str, str]:
    colours = {t: _COLOURS[i % len(_COLOURS)] for i, t in enumerate(tenants)}
    colours.setdefault("pool", _POOL_COLOUR)
    return colours


def plot_throughput(
    policies: Mapping[str, Mapping[str, Any]], tenants: Sequence[str], path: Path
) -> None:
    """Stacked bars: each run's output throughput in the steady window, split by tenant."""
    figure = Figure(figsize=(2.6 + 1.6 * len(policies), 4.2), dpi=DPI)
    axes = figure.subplots()
    colours = tenant_colours(tenants)
    runs = list(policies)
    bottoms = [0.0] * len(runs)
    for tenant in tenants:
        heights = [float(policies[r]["tenants"][tenant]["output_throughput"] or 0.0) for r in runs]
        bars = axes.bar(runs, heights, bottom=bottoms, color=colours[tenant], label=tenant)
        axes.bar_label(bars, labels=[f"{h:,.0f}" for h in heights], label_type="center")
        bottoms = [b + h for b, h in zip(bottoms, heights, strict=True)]
    for index, total in enumerate(bottoms):
        axes.annotate(
            f"{total:,.0f}",
            (index, total),
            ha="center",
            va="bottom",
            xytext=(0, 3),
            textcoords="offset points",
            fontweight="bold",
        )
    axes.set_ylabel("output tokens/s (steady window)")
    axes.set_title("Output throughput per run and tenant")
    axes.set_ylim(0, max(bottoms, default=1.0) * 1.15 or 1.0)
    axes.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), title="tenant")
    figure.tight_layout()
    figure.savefig(path)


def plot_allocation(
    runs: Sequence[RunSeries], tenants: Sequence[str], budget_slots: int, path: Path
) -> None:
    """Per run: each tenant's decided limit (solid) against its outstanding requests (dashed,
    the demand), over time; the warm-up is shaded."""
    figure = Figure(figsize=(11, 2.6 * len(runs) + 0.6), dpi=DPI)
    axes_list: list[Axes] = list(figure.subplots(len(runs), 1, squeeze=False)[:, 0])
    colours = tenant_colours(tenants)
    for axes, run in zip(axes_list, runs, strict=True):
        times = [s.t_s for s in run.samples]
        limited = sorted({t for s in run.samples for t in s.limits})
        for tenant in limited:
            axes.step(
                times,
                _gaps([s.limits.get(tenant) for s in run.samples]),
                where="post",
                color=colours.get(tenant, _POOL_COLOUR),
                label=f"limit {tenant}",
            )
        for tenant in tenants:
            axes.plot(
                times,
                _gaps([s.outstanding.get(tenant) for s in run.samples]),
                linestyle="--",
                linewidth=1.0,
                color=colours[tenant],
                label=f"demand {tenant}",
            )
        axes.axhline(budget_slots, color="black", linewidth=0.6, linestyle=":", label="budget")
        _shade_warmup(axes, run.window)
        axes.set_title(f"{run.name}: allocation against demand")
        axes.set_ylabel("slots / requests")
        axes.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small")
    axes_list[-1].set_xlabel("seconds from the start of the load")
    figure.tight_layout()
    figure.savefig(path)


def plot_reclaim(
    runs: Sequence[RunSeries],
    tenant: str,
    burst_start_s: float,
    nominal_slots: int,
    path: Path,
    *,
    before_s: float = 1.0,
    after_s: float = 4.0,
) -> None:
    """Around one burst's start, per run: the lender's decided limit and what the gateways may
    admit of it (its grant, steps), the requests it runs and those it queues: how fast its
    share comes back (with pausing, the queue empties within a control round trip)."""
    figure = Figure(figsize=(11, 2.4 * len(runs) + 0.6), dpi=DPI)
    axes_list: list[Axes] = list(figure.subplots(len(runs), 1, squeeze=False)[:, 0])
    start, end = burst_start_s - before_s, burst_start_s + after_s
    for axes, run in zip(axes_list, runs, strict=True):
        near = [s for s in run.samples if start <= s.t_s <= end]
        times = [s.t_s - burst_start_s for s in near]
        axes.step(times, _gaps([s.limits.get(tenant) for s in near]), where="post", label="limit")
        axes.step(
            times, _gaps([s.granted.get(tenant) for s in near]), where="post", label="granted"
        )
        axes.plot(times, _gaps([s.in_flight.get(tenant) for s in near]), label="running")
        axes.plot(
            times, _gaps([s.queued.get(tenant) for s in near]), linestyle="--", label="queued"
        )
        axes.axhline(nominal_slots, color="black", linewidth=0.6, linestyle=":", label="share")
        axes.axvline(0.0, color="0.5", linewidth=0.6)
        axes.set_title(f"{run.name}: tenant {tenant} around a burst's start")
        axes.set_ylabel("slots / requests")
        axes.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize="small")
    axes_list[-1].set_xlabel(f"seconds from the burst's start (t = {burst_start_s:g} s)")
    figure.tight_layout()
    figure.savefig(path)


def plot_gpu_utilization(runs: Sequence[RunSeries], path: Path) -> None:
    """Each run's GPU utilisation over time (labelled emulated when it is)."""
    figure = Figure(figsize=(10, 3.6), dpi=DPI)
    axes = figure.subplots()
    emulated = any(s.gpu_emulated for run in runs for s in run.samples)
    for index, run in enumerate(runs):
        axes.plot(
            [s.t_s for s in run.samples],
            _gaps([s.gpu_utilization_pct for s in run.samples]),
            color=_COLOURS[index % len(_COLOURS)],
            label=run.name,
        )
    if runs:
        _shade_warmup(axes, runs[0].window)
    axes.set_ylim(0, 105)
    axes.set_xlabel("seconds from the start of the load")
    axes.set_ylabel("GPU utilisation (%)" + (", emulated" if emulated else ""))
    axes.set_title("GPU utilisation" + (" (emulated by engine_sim)" if emulated else ""))
    axes.legend(loc="lower right")
    figure.tight_layout()
    figure.savefig(path)


def _shade_warmup(axes: Axes, window: Window) -> None:
    if window.start_s > 0:
        axes.axvspan(0, window.start_s, color="0.9", zorder=0, label="_warm-up")


def _gaps(values: Sequence[float | None]) -> list[float]:
    """Missing readings as NaN, which matplotlib leaves as gaps in a line."""
    return [math.nan if v is None else float(v) for v in values]


@dataclass(frozen=True)
class PoolSeries:
    """What the fleet plot needs of one pool in one run."""

    pool: str
    budget_slots: int
    samples: Sequence[Sample]
    share: float | None
    """Its share of its model's completed requests (None: no other pool serves its model)."""
    capacity_share: float | None
    """The share its capacity gives it among its model's replicas (None: not measured)."""


def plot_fleet(runs: Mapping[str, Sequence[PoolSeries]], window: Window, path: Path) -> None:
    """Per run: each engine's requests inside it (running plus waiting, solid) against its
    pool's budget (dotted, the same colour); beside it, each replica's share of its model's
    completed requests (bars) against its capacity share (a black tick)."""
    names = list(runs)
    figure = Figure(figsize=(12, 2.6 * len(names) + 0.6), dpi=DPI)
    grid = figure.subplots(len(names), 2, squeeze=False, width_ratios=(3, 1))
    for row, run in enumerate(names):
        engines_axes: Axes = grid[row, 0]
        shares_axes: Axes = grid[row, 1]
        replicas = [p for p in runs[run] if p.share is not None]
        for index, pool in enumerate(runs[run]):
            colour = _COLOURS[index % len(_COLOURS)]
            engines_axes.plot(
                [s.t_s for s in pool.samples],
                _gaps(
                    [
                        None
                        if s.engine_running is None or s.engine_waiting is None
                        else s.engine_running + s.engine_waiting
                        for s in pool.samples
                    ]
                ),
                color=colour,
                linewidth=1.0,
                label=pool.pool,
            )
            engines_axes.axhline(pool.budget_slots, color=colour, linewidth=0.8, linestyle=":")
        _shade_warmup(engines_axes, window)
        engines_axes.set_title(f"{run}: requests in each engine (dotted: its budget)")
        engines_axes.set_ylabel("requests")
        engines_axes.legend(loc="lower right", fontsize="small")
        positions = list(range(len(replicas)))
        heights = [p.share or 0.0 for p in replicas]
        bars = shares_axes.bar(
            positions,
            heights,
            color=[_COLOURS[runs[run].index(p) % len(_COLOURS)] for p in replicas],
        )
        shares_axes.bar_label(bars, labels=[f"{h:.1%}" for h in heights], label_type="center")
        for position, pool in zip(positions, replicas, strict=True):
            if pool.capacity_share is not None:
                shares_axes.hlines(
                    pool.capacity_share, position - 0.4, position + 0.4, color="black"
                )
        shares_axes.set_xticks(positions, [p.pool for p in replicas])
        shares_axes.set_ylim(0, 1)
        shares_axes.set_title("share of the model's completed", fontsize="small")
    grid[-1, 0].set_xlabel("seconds from the start of the load")
    figure.tight_layout()
    figure.savefig(path)
