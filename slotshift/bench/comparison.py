"""One markdown table comparing policies across benchmark results.

    python -m slotshift.bench.comparison docs/results/seed docs/results/three-tenants ...

Each argument is a results folder of `slotshift bench` (its summary.json). One row per scenario
and run: total output throughput and its ratio to the scenario's `static` run, then per tenant
the p99 TTFT, the SLO goodput and, for bursty tenants, the median reclaim time. The README's
cross-scenario table is its output.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

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
    parser.add_argument("results", nargs="+", type=Path, help="results folders (summary.json)")
    args = parser.parse_args(argv)
    documents = []
    for folder in args.results:
        path = folder / "summary.json"
        try:
            documents.append(json.loads(path.read_text(encoding="utf-8")))
        except (OSError, json.JSONDecodeError) as exc:
            print(f"slotshift.bench.comparison: {path}: {exc}", file=sys.stderr)
            return 2
    sys.stdout.write(comparison_table(documents))
    return 0


if __name__ == "__main__":
    sys.exit(main())
