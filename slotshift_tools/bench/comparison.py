"""Markdown tables across benchmark results: policies across scenarios, or one scenario's goals
over repeated runs (machines here are noisy: quote the median of runs made the same way).

    python -m slotshift_tools.bench.comparison docs/results/seed docs/results/three-tenants ...
    python -m slotshift_tools.bench.comparison --goals docs/results/seed/repeats/run-*.json

Each argument is a results folder of `slotshift bench` (its summary.json). One row per scenario
and run: total output throughput and its ratio to the scenario's `static` run, then per tenant
the p99 TTFT, the SLO goodput and, for bursty tenants, the median reclaim time. The
cross-scenario table of docs/results/scenarios.md is its output.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from slotshift_tools.bench.summary import MET_TEXT, goal_label, goal_met, goal_target

BASELINE_RUN = "static"


def comparison_table(documents: Sequence[Mapping[str, Any]]) -> str:
    """The table for several summary.json documents, in the order given."""
    lines = [
        "| scenario | run | output tok/s | vs static | p99 TTFT (ms) | goodput (req/s) "
        "| reclaim median (s) |",
        "| --- | --- | ---: | ---: | --- | --- | --- |",
    ]
    for document in documents:
        scenario = document["meta"]["scenario"]
        policies: Mapping[str, Any] = document["policies"]
        baseline = policies.get(BASELINE_RUN)
        for run, figures in policies.items():
            total = figures["total"]["output_throughput"]
            versus = (
                f"{total / baseline['total']['output_throughput']:.3f}"
                if baseline is not None and baseline["total"]["output_throughput"]
                else "-"
            )
            tenants: Mapping[str, Any] = figures["tenants"]
            lines.append(
                "| "
                + " | ".join(
                    [
                        scenario,
                        run,
                        f"{total:,.0f}",
                        versus,
                        _per_tenant(tenants, "p99_ttft_ms", "{:,.0f}"),
                        _per_tenant(tenants, "request_goodput", "{:.2f}"),
                        _per_tenant(tenants, "reclaim_median_s", "{:.2f}", skip_missing=True),
                    ]
                )
                + " |"
            )
    return "\n".join(lines) + "\n"


def goals_table(documents: Sequence[Mapping[str, Any]]) -> str:
    """Each goal of the first document with its value in every document, their median, and
    whether the median meets it (documents without the goal, or without a value, are skipped)."""
    header = ["goal", *(f"run {n}" for n in range(1, len(documents) + 1)), "median", "target"]
    lines = ["| " + " | ".join(header) + " | met |", "| --- |" + " ---: |" * (len(header) - 1)]
    lines[1] += " --- |"
    for goal in documents[0]["goals"] if documents else []:
        key = _goal_key(goal)
        values = [
            next((g["value"] for g in d.get("goals", []) if _goal_key(g) == key), None)
            for d in documents
        ]
        present = [v for v in values if v is not None]
        middle = statistics.median(present) if present else None
        met = goal_met(middle, goal["at_least"], goal["at_most"])
        cells = [goal_label(goal)]
        cells += ["-" if v is None else f"{v:.3f}" for v in values]
        cells += ["-" if middle is None else f"{middle:.3f}", goal_target(goal), MET_TEXT[met]]
        lines.append("| " + " | ".join(cells) + " |")
    return "\n".join(lines) + "\n"


def _goal_key(goal: Mapping[str, Any]) -> tuple[Any, ...]:
    return (goal.get("ratio"), goal.get("run"), goal["field"], goal["tenant"])


def _per_tenant(
    tenants: Mapping[str, Any], field: str, fmt: str, *, skip_missing: bool = False
) -> str:
    cells = []
    for name, figures in tenants.items():
        value = figures.get(field)
        if value is None and skip_missing:
            continue
        cells.append(f"{name} {'-' if value is None else fmt.format(value)}")
    return ", ".join(cells) if cells else "-"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "results", nargs="+", type=Path, help="results folders, or their summary.json files"
    )
    parser.add_argument(
        "--goals",
        action="store_true",
        help="the goals of repeated runs of one scenario, with their medians",
    )
    args = parser.parse_args(argv)
    documents = []
    for folder in args.results:
        path = folder if folder.is_file() else folder / "summary.json"
        try:
            documents.append(json.loads(path.read_text(encoding="utf-8")))
        except (OSError, json.JSONDecodeError) as exc:
            print(f"slotshift_tools.bench.comparison: {path}: {exc}", file=sys.stderr)
            return 2
    sys.stdout.write(goals_table(documents) if args.goals else comparison_table(documents))
    return 0


if __name__ == "__main__":
    sys.exit(main())
