"""The twin against the recorded live bench (issue 15, deliverable 3; docs/results/fidelity-twin.md).

Each case runs one of a scenario's policies in the twin (deterministic) on the live runs' own
window and compares one figure with the live median recorded in docs/results/fidelity-twin.json
(from the checked-in summaries; no live run here): total output within +-5%, each tenant's within
+-10%, the interactive tenant's median TTFT within +-20%. A figure the twin misses is marked
xfail(strict=True) with its measured gap and why, not given a wider tolerance: if the twin comes
within tolerance, the strict xfail fails and the mark must go.

CPU: the twelve runs take about 30 s together (each once, shared by its figures).
"""

from __future__ import annotations

import json
import statistics
from pathlib import Path
from typing import Any

import pytest

from slotshift_tools.twin.fidelity import FidelityFigures, recorded_scenario, twin_figures

ROOT = Path(__file__).resolve().parents[4]
LIVE: dict[str, Any] = json.loads((ROOT / "docs" / "results" / "fidelity-twin.json").read_text())

_HOST = (
    "the twin leaves out the host: the HTTP/SSE path (client -> gateway -> engine and the "
    "first chunk back) and the scheduling delays of five processes on two shared cores (the "
    "live harness's loop lag p99 11-16 ms in these runs, 4-5 ms in issue 12's of the same "
    "scenario); A's TTFT there is one or two engine steps of about 12 ms"
)
KNOWN_MISSES = {
    "seed/static/ttft": f"twin 12.5 ms vs live 23.5 ms (-47%; -25% against issue 12's runs): {_HOST}",
    "seed/slo/ttft": f"twin 17.5 ms vs live 37.0 ms (-53%; -29% against issue 12's runs): {_HOST}",
    "seed/demand/ttft": (
        "twin 184.2 ms vs live 236.9 ms (-22%): A waits for slots lent to B in both; live, "
        "each reclaim's messages (report, decision, push, pause, the engine's abort) cross "
        f"the same host: {_HOST}"
    ),
}
"""Comparisons the twin misses, by case id, with the measured gap (fidelity-twin.md)."""


def _cases() -> list[Any]:
    cases = []
    for scenario, entry in LIVE["scenarios"].items():
        for run, live in entry["runs"].items():
            figures = [("total", None)] + [("tenant", t) for t in live["tenant_output"]]
            figures.append(("ttft", entry["interactive"]))
            for figure, tenant in figures:
                case = f"{scenario}/{run}/{figure}" + (f"-{tenant}" if figure == "tenant" else "")
                marks = []
                if case in KNOWN_MISSES:
                    marks.append(pytest.mark.xfail(strict=True, reason=KNOWN_MISSES[case]))
                cases.append(pytest.param(scenario, run, figure, tenant, id=case, marks=marks))
    return cases


@pytest.fixture(scope="module")
def twin_runs() -> dict[tuple[str, str], FidelityFigures]:
    """Each (scenario, run) simulated once, on demand, for the whole module."""
    return {}


def _twin(
    cache: dict[tuple[str, str], FidelityFigures], scenario: str, run: str
) -> FidelityFigures:
    if (scenario, run) not in cache:
        entry = LIVE["scenarios"][scenario]
        cache[scenario, run] = twin_figures(
            recorded_scenario(ROOT / entry["file"], entry["runs"][run]["tenant_overrides"]),
            run,
            interactive=entry["interactive"],
            warmup_s=entry["warmup_s"],
            steady_s=entry["steady_s"],
        )
    return cache[scenario, run]


@pytest.mark.parametrize(("scenario", "run", "figure", "tenant"), _cases())
def test_the_twin_matches_the_live_bench(
    twin_runs: dict[tuple[str, str], FidelityFigures],
    scenario: str,
    run: str,
    figure: str,
    tenant: str | None,
) -> None:
    live = LIVE["scenarios"][scenario]["runs"][run]
    tolerances = LIVE["tolerances"]
    twin = _twin(twin_runs, scenario, run)
    got: float | None
    if figure == "total":
        want, got, bound = live["total_output"], twin.total_output, tolerances["total_output"]
    elif figure == "tenant":
        assert tenant is not None
        want = live["tenant_output"][tenant]
        got, bound = twin.tenant_output[tenant], tolerances["tenant_output"]
    else:
        want = live["interactive_median_ttft_ms"]
        got = twin.interactive_median_ttft_ms
        bound = tolerances["interactive_median_ttft"]
    assert got is not None
    assert abs(got / want - 1.0) <= bound, f"twin {got:.1f}, live {want:.1f}"


def test_the_live_figures_are_the_recorded_medians() -> None:
    for entry in LIVE["scenarios"].values():
        for run, live in entry["runs"].items():
            summaries = [
                json.loads((ROOT / path).read_text())["policies"][run] for path in live["files"]
            ]
            assert live["total_output"] == statistics.median(
                s["total"]["output_throughput"] for s in summaries
            )
            for tenant, value in live["tenant_output"].items():
                assert value == statistics.median(
                    s["tenants"][tenant]["output_throughput"] for s in summaries
                )
            assert live["interactive_median_ttft_ms"] == statistics.median(
                s["tenants"][entry["interactive"]]["median_ttft_ms"] for s in summaries
            )
