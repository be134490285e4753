"""The grid's results: one JSON document, a plot of cost against T x G, a Markdown table."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from matplotlib.figure import Figure

TABLE_HEADER = (
    "| tenants x gateways | report s | valid | control plane CPU (cores) | RSS MB "
    "| decisions / periods | missed | decision p50 / p99 ms | decision -> acked p50 / p99 ms "
    "| updates / gw / s | kB / gw / s | budget |\n"
    "| ---: | ---: | :---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | :---: |"
)


def _number(value: Any, spec: str) -> str:
    return "n/a" if value is None else format(value, spec)


def table_row(point: Mapping[str, Any]) -> str:
    """One Markdown row of a point's document (point.py)."""
    p = point["point"]
    d = point["decisions"]
    acked = point["decision_to_acknowledged"]
    messages = point["messages"]
    budget = point["budget"]
    duration = d["duration"]
    budget_cell = "ok" if budget["ok"] else f"{budget['violations']} violations"
    return (
        f"| {p['tenants']:,} x {p['gateways']} | {p['report_interval_s']:g} "
        f"| {'yes' if point['valid'] else 'NO'} "
        f"| {point['controlplane']['cpu_cores']:.2f} | {point['controlplane']['rss_mb']:.0f} "
        f"| {d['made']} / {d['periods_elapsed']:.0f} | {d['missed_periods']} "
        f"| {_number(duration['p50_ms'], '.1f')} / {_number(duration['p99_ms'], '.1f')} "
        f"| {_number(acked['p50_ms'], '.0f')} / {_number(acked['p99_ms'], '.0f')} "
        f"| {messages['updates_per_gateway_per_s']:.1f} "
        f"| {messages['update_bytes_per_gateway_per_s'] / 1000:.1f} | {budget_cell} |"
    )


def markdown_table(points: Sequence[Mapping[str, Any]]) -> str:
    """The grid as a Markdown table, one row a point, and why each invalid point is invalid."""
    lines = [TABLE_HEADER, *(table_row(p) for p in points)]
    notes = [
        f"- {p['point']['label']}: invalid: {'; '.join(p['invalid_reasons'])}"
        for p in points
        if not p["valid"]
    ]
    return "\n".join(lines) + ("\n\n" + "\n".join(notes) if notes else "") + "\n"


def grid_document(
    points: Sequence[Mapping[str, Any]],
    settings: Mapping[str, Any],
    failures: Mapping[str, str],
) -> dict[str, Any]:
    """`grid.json`: the command's settings, every point's document, the points that failed."""
    return {
        "settings": dict(settings),
        "points": list(points),
        "failed_points": dict(failures),
        "budget_ok": all(p["budget"]["ok"] for p in points),
    }


def plot_grid(points: Sequence[Mapping[str, Any]], path: Path) -> None:
    """Control-plane CPU and decision p99 against T x G (log scales); invalid points hollow."""
    figure = Figure(figsize=(11, 4.5), layout="constrained")
    cpu_axes, p99_axes = figure.subplots(1, 2)
    for point in points:
        x = point["point"]["tenants_x_gateways"]
        label = f"{point['point']['label']} @{point['point']['report_interval_s']:g}s"
        face = "C0" if point["valid"] else "none"
        cpu = point["controlplane"]["cpu_cores"]
        cpu_axes.scatter([x], [cpu], s=50, facecolors=face, edgecolors="C0")
        cpu_axes.annotate(label, (x, cpu), textcoords="offset points", xytext=(5, 5), fontsize=8)
        p99 = point["decisions"]["duration"]["p99_ms"]
        if p99 is not None:
            p99_axes.scatter([x], [p99], s=50, facecolors=face.replace("C0", "C1"), edgecolors="C1")
            p99_axes.annotate(
                label, (x, p99), textcoords="offset points", xytext=(5, 5), fontsize=8
            )
    cpu_axes.set_xscale("log")
    cpu_axes.set_xlabel("tenants x gateways")
    cpu_axes.set_ylabel("control plane CPU (1.0 = one core)")
    cpu_axes.axhline(1.0, color="grey", linewidth=0.8, linestyle="--")
    cpu_axes.set_title("control-plane CPU")
    p99_axes.set_xscale("log")
    p99_axes.set_yscale("log")
    p99_axes.set_xlabel("tenants x gateways")
    p99_axes.set_ylabel("decision duration p99 (ms)")
    p99_axes.set_title("decision duration p99 (hollow: invalid point)")
    for axes in (cpu_axes, p99_axes):
        axes.grid(True, which="both", alpha=0.3)
    figure.savefig(path, dpi=120)
