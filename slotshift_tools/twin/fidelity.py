"""The twin's side of its fidelity check against the live bench (docs/results/fidelity-twin.md):
the figures the comparison reads, from one twin run on a recorded live run's scenario and window.

The live side is recorded, never run here: docs/results/fidelity-twin.json holds the live
medians (scripts/fidelity_twin.py writes it from the checked-in summaries).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from slotshift_tools.bench.scenario import Scenario, load_scenario
from slotshift_tools.bench.summary import run_summary
from slotshift_tools.twin.run import simulate_run


@dataclass(frozen=True)
class FidelityFigures:
    """What the comparison reads of one run (the live bench's summary.json fields)."""

    total_output: float
    """Total output throughput, tok/s (`total.output_throughput`)."""
    tenant_output: dict[str, float]
    """Each tenant's output throughput, tok/s."""
    interactive_median_ttft_ms: float | None
    """The interactive tenant's median time to first token; None when it completed nothing."""


def recorded_scenario(path: Path, tenant_overrides: Mapping[str, Mapping[str, Any]]) -> Scenario:
    """The scenario file with the named tenants' fields replaced, as a live run recorded on an
    earlier version of the file had them (its summary's `meta.scenario_document`)."""
    scenario = load_scenario(path)
    tenants = [
        t.model_copy(update=dict(tenant_overrides.get(t.name, {}))) for t in scenario.tenants
    ]
    return scenario.model_copy(update={"tenants": tenants})


def twin_figures(
    scenario: Scenario, run: str, *, interactive: str, warmup_s: float, steady_s: float
) -> FidelityFigures:
    """Run `run` of `scenario` in the twin on the given window; its fidelity figures."""
    result, _ = simulate_run(scenario, scenario.run(run), warmup_s=warmup_s, steady_s=steady_s)
    summary = run_summary(scenario, result)
    ttft = summary["tenants"][interactive]["median_ttft_ms"]
    return FidelityFigures(
        total_output=float(summary["total"]["output_throughput"]),
        tenant_output={t: float(v["output_throughput"]) for t, v in summary["tenants"].items()},
        interactive_median_ttft_ms=None if ttft is None else float(ttft),
    )
