"""The twin against the recorded live bench: the live medians, and the side-by-side table.

    python scripts/fidelity_twin.py live      # write docs/results/fidelity-twin.json from the
                                              # recorded live summaries (medians of their runs)
    python scripts/fidelity_twin.py table     # run the twin, print the markdown table

The live runs are those checked in under docs/results/ (`SOURCES` names each, and why); none is
run here. tests/unit/slotshift_tools/twin/test_fidelity.py compares the twin with the JSON.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from slotshift_tools.twin.fidelity import recorded_scenario, twin_figures

ROOT = Path(__file__).resolve().parents[1]
LIVE_JSON = ROOT / "docs" / "results" / "fidelity-twin.json"

TOLERANCES = {"total_output": 0.05, "tenant_output": 0.10, "interactive_median_ttft": 0.20}
"""Relative: the issue's +-5% total, +-10% per tenant, +-20% for the interactive tenant's
median TTFT."""

_I12 = "docs/results/issue12/{scenario}/run-{k}/summary.json"
_LIVE = "docs/results/fidelity-live/{scenario}/run-{k}/summary.json"


def _runs(scenario: str, pattern: str) -> dict[str, list[str]]:
    return {"files": [pattern.format(scenario=scenario, k=k) for k in (1, 2, 3)]}


SOURCES: dict[str, dict[str, Any]] = {
    "seed": {
        "interactive": "A",
        "runs": {
            "static": _runs("seed-static-slo", _LIVE),
            "slo": _runs("seed-static-slo", _LIVE),
            "demand": _runs("seed", _LIVE),
            "pool": _runs("seed", _LIVE),
        },
    },
    **{
        scenario: {
            "interactive": "A",
            "runs": {
                "static": _runs(scenario, _I12),
                "slo": _runs(scenario, _I12),
                "demand": _runs(scenario, _LIVE),
                "pool": _runs(scenario, _LIVE),
            },
        }
        for scenario in ("burst-full-share", "idle-then-storm")
    },
}
"""Per scenario and run, the recorded live summaries, three of each (medians): the seed's four
runs and the other scenarios' demand and pool runs made for this comparison
(docs/results/fidelity-live/, one commit); the other scenarios' static and slo runs are issue
12's repetitions."""


def live_document() -> dict[str, Any]:
    """The live medians of every SOURCES run, with the files, commits and windows they are from."""
    scenarios: dict[str, Any] = {}
    for name, source in SOURCES.items():
        interactive = source["interactive"]
        runs: dict[str, Any] = {}
        window: tuple[float, float] | None = None
        for run, spec in source["runs"].items():
            documents = [json.loads((ROOT / f).read_text()) for f in spec["files"]]
            summaries = [d["policies"][run] for d in documents]
            windows = {(d["meta"]["warmup_s"], d["meta"]["duration"]) for d in documents}
            if len(windows) != 1 or (window is not None and windows != {window}):
                raise ValueError(f"{name}/{run}: the live runs' windows differ: {windows}")
            window = next(iter(windows))
            tenants = sorted(summaries[0]["tenants"])
            runs[run] = {
                "files": spec["files"],
                "commits": sorted({d["meta"]["git_commit"][:7] for d in documents}),
                "tenant_overrides": spec.get("tenant_overrides", {}),
                "total_output": _median(s["total"]["output_throughput"] for s in summaries),
                "tenant_output": {
                    t: _median(s["tenants"][t]["output_throughput"] for s in summaries)
                    for t in tenants
                },
                "interactive_median_ttft_ms": _median(
                    s["tenants"][interactive]["median_ttft_ms"] for s in summaries
                ),
            }
        assert window is not None
        scenarios[name] = {
            "file": f"bench/scenarios/{name}.yaml",
            "interactive": interactive,
            "warmup_s": window[0],
            "steady_s": window[1],
            "runs": runs,
        }
    return {"tolerances": TOLERANCES, "scenarios": scenarios}


def _median(values: Any) -> float:
    return float(statistics.median(list(values)))


def _table(document: Mapping[str, Any]) -> str:
    tol = document["tolerances"]
    lines = [
        "| scenario | run | live runs | figure | live | twin | gap | within |",
        "| --- | --- | ---: | --- | ---: | ---: | ---: | --- |",
    ]
    for name, entry in document["scenarios"].items():
        for run, live in entry["runs"].items():
            scenario = recorded_scenario(ROOT / entry["file"], live["tenant_overrides"])
            twin = twin_figures(
                scenario,
                run,
                interactive=entry["interactive"],
                warmup_s=entry["warmup_s"],
                steady_s=entry["steady_s"],
            )
            rows: list[tuple[str, float, float | None, str]] = [
                ("total output (tok/s)", live["total_output"], twin.total_output, "total_output")
            ]
            rows += [
                (f"{t} output (tok/s)", want, twin.tenant_output[t], "tenant_output")
                for t, want in live["tenant_output"].items()
            ]
            rows.append(
                (
                    f"{entry['interactive']} median TTFT (ms)",
                    live["interactive_median_ttft_ms"],
                    twin.interactive_median_ttft_ms,
                    "interactive_median_ttft",
                )
            )
            for figure, want, got, kind in rows:
                bound = tol[kind]
                assert got is not None
                gap = got / want - 1.0
                ok = "yes" if abs(gap) <= bound else f"**no** (+-{bound:.0%})"
                lines.append(
                    f"| {name} | {run} | {len(live['files'])} | {figure} | {want:,.1f} | "
                    f"{got:,.1f} | {gap:+.1%} | {ok} |"
                )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the script; returns the exit status."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("what", choices=["live", "table"])
    args = parser.parse_args(argv)
    if args.what == "live":
        LIVE_JSON.write_text(json.dumps(live_document(), indent=2) + "\n")
        print(f"wrote {LIVE_JSON}")
    else:
        print(_table(json.loads(LIVE_JSON.read_text())))
    return 0


if __name__ == "__main__":
    sys.exit(main())
