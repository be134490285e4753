"""The bench's outputs: the figures of one run, their medians over runs, JSON, Markdown, a plot."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from slotshift_tools.gateway_bench.stats import (
    added_p50_ms,
    added_p99_ms,
    cpu_ms_per_1000_events,
    median_of_runs,
    percentile_ms,
)

FIGURES = (
    "non_streamed_added_p50_ms",
    "non_streamed_added_p99_ms",
    "ttft_added_p50_ms",
    "ttft_added_p99_ms",
    "non_streamed_after_idle_added_p50_ms",
    "cpu_ms_per_1000_events_plain",
    "cpu_ms_per_1000_events_preemptible",
    "interactive_added_ttft_p50_ms_under_batch",
    "interactive_added_ttft_p99_ms_under_batch",
    "cpu_ms_per_1000_events_mix_counted",
    "cpu_ms_per_1000_events_mix_uncounted",
    "token_accounting_cpu_percent",
)
"""The headline figures of a proxy (gateway, haproxy), each the median over the runs (the
accounting mix's only for the gateway)."""

_LABELS = {
    "non_streamed_added_p50_ms": "added latency p50, non-streamed (ms)",
    "non_streamed_added_p99_ms": "added latency p99, non-streamed (ms)",
    "ttft_added_p50_ms": "added TTFT p50 (ms)",
    "ttft_added_p99_ms": "added TTFT p99 (ms)",
    "non_streamed_after_idle_added_p50_ms": (
        "added latency p50, non-streamed after a stream's idle (the TTFT's control, ms)"
    ),
    "cpu_ms_per_1000_events_plain": "CPU per 1,000 relayed events, plain streams (ms)",
    "cpu_ms_per_1000_events_preemptible": "CPU per 1,000 relayed events, preemptible (ms)",
    "interactive_added_ttft_p50_ms_under_batch": "interactive added TTFT p50 under batch (ms)",
    "interactive_added_ttft_p99_ms_under_batch": "interactive added TTFT p99 under batch (ms)",
    "cpu_ms_per_1000_events_mix_counted": "CPU per 1,000 events, mix, tokens counted (ms)",
    "cpu_ms_per_1000_events_mix_uncounted": "CPU per 1,000 events, mix, not counted (ms)",
    "token_accounting_cpu_percent": "token accounting's added CPU per event, mix (%)",
}


def latency_figures(samples: Mapping[str, Sequence[float]], through: str) -> dict[str, float]:
    """Added p50 (paired) and p99 of `through` against `direct`, with both sides' own."""
    direct = samples["direct"]
    mine = samples[through]
    return {
        "added_p50_ms": added_p50_ms(mine, direct),
        "added_p99_ms": added_p99_ms(mine, direct),
        "p50_ms": percentile_ms(mine, 50),
        "p99_ms": percentile_ms(mine, 99),
        "direct_p50_ms": percentile_ms(direct, 50),
        "direct_p99_ms": percentile_ms(direct, 99),
        "requests": len(mine),
    }


def cpu_figure(window: Mapping[str, Any], process: str) -> float:
    """CPU of `process` per 1,000 events the client received in the window, ms."""
    seconds = window["seconds"]
    return cpu_ms_per_1000_events(window["cores"][process] * seconds, window["events"])


def proxy_figures(run: Mapping[str, Any], proxy: str) -> dict[str, float | None]:
    """One run's headline figures (FIGURES) of `proxy`; None where the run did not measure one."""
    latency = run["latency"]
    cpu = run["cpu"].get(proxy, {})
    interference = run["interference"].get(proxy)
    preemptible = cpu.get("preemptible")
    mix = run.get("accounting", {}) if proxy == "gateway" else {}
    counted, uncounted = (
        next((w["cpu_ms_per_1000_events"] for w in mix.values() if w["count_tokens"] is c), None)
        for c in (True, False)
    )
    return {
        "cpu_ms_per_1000_events_mix_counted": counted,
        "cpu_ms_per_1000_events_mix_uncounted": uncounted,
        # Within one run, side by side: the ratio, not the difference of two medians.
        "token_accounting_cpu_percent": None
        if counted is None or not uncounted
        else (counted / uncounted - 1.0) * 100.0,
        "non_streamed_added_p50_ms": latency["non_streamed"][proxy]["added_p50_ms"],
        "non_streamed_added_p99_ms": latency["non_streamed"][proxy]["added_p99_ms"],
        "ttft_added_p50_ms": latency["ttft"][proxy]["added_p50_ms"],
        "ttft_added_p99_ms": latency["ttft"][proxy]["added_p99_ms"],
        "non_streamed_after_idle_added_p50_ms": latency["non_streamed_after_idle"][proxy][
            "added_p50_ms"
        ],
        "cpu_ms_per_1000_events_plain": cpu["plain"]["cpu_ms_per_1000_events"],
        "cpu_ms_per_1000_events_preemptible": None
        if preemptible is None
        else preemptible["cpu_ms_per_1000_events"],
        "interactive_added_ttft_p50_ms_under_batch": None
        if interference is None
        else interference["added_p50_ms"],
        "interactive_added_ttft_p99_ms_under_batch": None
        if interference is None
        else interference["added_p99_ms"],
    }


def summary(runs: Sequence[Mapping[str, Any]], proxies: Sequence[str]) -> dict[str, Any]:
    """Each proxy's FIGURES, the median over `runs`."""
    per_run = {proxy: [proxy_figures(run, proxy) for run in runs] for proxy in proxies}
    return {
        proxy: {name: median_of_runs([f[name] for f in figures]) for name in FIGURES}
        for proxy, figures in per_run.items()
    }


def markdown_table(figures: Mapping[str, Mapping[str, float | None]]) -> str:
    """The headline figures, one row each, one column per proxy."""
    proxies = list(figures)
    lines = [
        "| figure | " + " | ".join(proxies) + " |",
        "| --- | " + " | ".join("---:" for _ in proxies) + " |",
    ]
    for name in FIGURES:
        cells = []
        for proxy in proxies:
            value = figures[proxy][name]
            cells.append("-" if value is None else f"{value:.2f}")
        lines.append(f"| {_LABELS[name]} | " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def plot(figures: Mapping[str, Mapping[str, float | None]], path: Path, title: str) -> None:
    """Three panels of bars, one bar per proxy: added latency, CPU per 1,000 events, and the
    interactive tenant's added TTFT under batch load. Blocks (writes the PNG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    panels = [
        (
            "added latency (ms)",
            [
                ("non-streamed\np50", "non_streamed_added_p50_ms"),
                ("non-streamed\np99", "non_streamed_added_p99_ms"),
                ("TTFT\np50", "ttft_added_p50_ms"),
                ("TTFT\np99", "ttft_added_p99_ms"),
                ("non-streamed\nafter idle p50", "non_streamed_after_idle_added_p50_ms"),
            ],
        ),
        (
            "CPU per 1,000 relayed events (ms)",
            [
                ("plain", "cpu_ms_per_1000_events_plain"),
                ("preemptible", "cpu_ms_per_1000_events_preemptible"),
                ("mix,\ncounted", "cpu_ms_per_1000_events_mix_counted"),
                ("mix, not\ncounted", "cpu_ms_per_1000_events_mix_uncounted"),
            ],
        ),
        (
            "interactive added TTFT under batch (ms)",
            [
                ("p50", "interactive_added_ttft_p50_ms_under_batch"),
                ("p99", "interactive_added_ttft_p99_ms_under_batch"),
            ],
        ),
    ]
    proxies = list(figures)
    fig, axes = plt.subplots(1, len(panels), figsize=(15, 4.5))
    width = 0.8 / max(1, len(proxies))
    for axis, (ylabel, bars) in zip(axes, panels, strict=True):
        for offset, proxy in enumerate(proxies):
            values = [figures[proxy][key] or 0.0 for _, key in bars]
            positions = [i + offset * width for i in range(len(bars))]
            axis.bar(positions, values, width=width, label=proxy)
        axis.set_xticks([i + width * (len(proxies) - 1) / 2 for i in range(len(bars))])
        axis.set_xticklabels([label for label, _ in bars])
        axis.set_ylabel(ylabel)
        axis.axhline(0.0, color="black", linewidth=0.5)
        axis.legend()
    fig.suptitle(title)
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)
    plt.close(fig)
