"""The cross-scenario table, from hand-made summary documents."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from slotshift_tools.bench.comparison import comparison_table, goals_table, main


def _run(throughput: float, ttft: dict[str, float], reclaim: float | None) -> dict[str, Any]:
    return {
        "total": {"output_throughput": throughput},
        "tenants": {
            name: {
                "p99_ttft_ms": value,
                "request_goodput": 1.5,
                "reclaim_median_s": reclaim if name == "A" else None,
            }
            for name, value in ttft.items()
        },
    }


POLICIES = {
    "static": _run(6000.0, {"A": 85.0, "B": 7800.0}, 0.25),
    "demand": _run(7200.0, {"A": 2300.0, "B": 6300.0}, 1.5),
    "pool": _run(7100.0, {"A": 5700.0, "B": 5400.0}, None),
}
DOCUMENT: dict[str, Any] = {"meta": {"scenario": "seed"}, "policies": POLICIES}


def test_one_row_per_run_with_its_ratio_to_static() -> None:
    lines = comparison_table([DOCUMENT, {**DOCUMENT, "meta": {"scenario": "other"}}]).splitlines()
    assert len(lines) == 2 + 6
    assert lines[3] == (
        "| seed | demand | 7,200 | 1.200 | A 2,300, B 6,300 | A 1.50, B 1.50 | A 1.50 |"
    )
    assert lines[4].startswith("| seed | pool | 7,100 | 1.183 |")
    assert lines[4].endswith("| - |")  # no tenant of the pool baseline has a reclaim time
    assert lines[5].startswith("| other | static | 6,000 | 1.000 |")


def test_a_scenario_without_a_static_run_has_no_ratio() -> None:
    document = {**DOCUMENT, "policies": {"demand": POLICIES["demand"]}}
    assert "| seed | demand | 7,200 | - |" in comparison_table([document])


def test_main_reads_results_folders(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    (tmp_path / "summary.json").write_text(json.dumps(DOCUMENT))
    assert main([str(tmp_path)]) == 0
    assert "| seed | static | 6,000 | 1.000 |" in capsys.readouterr().out
    assert main([str(tmp_path / "missing")]) == 2


def _with_goals(*values: float | None) -> dict[str, Any]:
    goals = [
        {"ratio": "demand/static", "run": None, "field": "output_throughput", "tenant": None,
         "at_least": 1.14, "at_most": None, "value": values[0]},
        {"ratio": None, "run": "slo", "field": "reclaim_median_s", "tenant": "A",
         "at_least": None, "at_most": 1.0, "value": values[1]},
    ]  # fmt: skip
    return {**DOCUMENT, "goals": goals}


def test_goals_over_repeated_runs_are_judged_by_their_median() -> None:
    documents = [_with_goals(1.10, 0.5), _with_goals(1.20, None), _with_goals(1.15, 1.5)]
    lines = goals_table(documents).splitlines()
    assert lines[0] == "| goal | run 1 | run 2 | run 3 | median | target | met |"
    assert lines[2] == (
        "| demand/static output_throughput (total) | 1.100 | 1.200 | 1.150 | 1.150 "
        "| >= 1.14 | yes |"
    )
    # A run without a value is left out of the median: (0.5 + 1.5) / 2 = 1.0 is within 1.0.
    assert (
        lines[3] == "| slo reclaim_median_s (tenant A) | 0.500 | - | 1.500 | 1.000 | <= 1 | yes |"
    )


def test_main_prints_the_goals_table_on_request(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "summary.json").write_text(json.dumps(_with_goals(1.0, 2.0)))
    assert main(["--goals", str(tmp_path / "summary.json")]) == 0  # a file works too
    assert "| demand/static output_throughput (total) | 1.000 | 1.000 | >= 1.14 | NO |" in (
        capsys.readouterr().out
    )
