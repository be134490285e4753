"""End to end: `slotshift bench-scale` measures one tiny point against a real control plane
process, with real gateway streams from a generator process of its own."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from matplotlib.image import imread

from tests.e2e.service_processes import run_in_checkout

pytestmark = pytest.mark.e2e


def _walk(document: Any, path: str = "") -> list[str]:
    """Paths of every null in a JSON document."""
    if isinstance(document, dict):
        return [p for key, value in document.items() for p in _walk(value, f"{path}.{key}")]
    if isinstance(document, list):
        return [p for i, value in enumerate(document) for p in _walk(value, f"{path}[{i}]")]
    return [path] if document is None else []


def test_a_tiny_point_has_every_figure_holds_the_budget_and_decides(tmp_path: Path) -> None:
    out = tmp_path / "scale"
    run_in_checkout(
        "-m",
        "slotshift_tools",
        "bench-scale",
        "--grid",
        "10x2",
        "--interval-s",
        "0.25",
        "--dynamics",
        "fluctuating",
        "--duration-s",
        "8",
        "--warmup-s",
        "1",
        "--out",
        str(out),
        timeout_s=100,
    )

    grid = json.loads((out / "grid.json").read_text())
    assert grid["failed_points"] == {}
    assert grid["budget_ok"] is True
    [point] = grid["points"]
    assert point == json.loads((out / "10x2@0.25s" / "point.json").read_text())
    assert _walk(point) == [], "every figure is measured"

    assert point["point"]["tenants"] == 10
    assert point["point"]["gateways"] == 2
    assert point["point"]["budget_slots"] == 96
    assert point["point"]["policy"] == "slo"
    assert point["controlplane"]["cpu_cores"] > 0
    assert point["controlplane"]["rss_mb"] > 10
    assert point["generator"]["processes"] == 1
    assert point["generator"]["cpu_cores"] > 0
    assert point["generator"]["stream_errors"] == []

    decisions = point["decisions"]
    assert decisions["made"] >= 3, "a decision every 2 s over 8 s"
    # A fast-path decision restarts the period, so not every one of them is the period's.
    assert decisions["period_triggered"] >= 1
    assert decisions["duration"]["count"] == decisions["made"]
    assert decisions["duration"]["p99_ms"] >= decisions["duration"]["p50_ms"] > 0
    assert decisions["lost_from_log"] == 0
    assert point["decision_to_acknowledged"]["count"] >= 1
    assert point["decision_to_acknowledged"]["p99_ms"] >= 0

    messages = point["messages"]
    assert messages["updates_per_gateway_per_s"] > 0
    assert messages["update_bytes_per_gateway_per_s"] > 0
    assert messages["acks_per_gateway_per_s"] == pytest.approx(
        messages["updates_per_gateway_per_s"], rel=0.2
    )
    assert messages["reports_per_gateway_per_s"] == pytest.approx(4.0, rel=0.2)

    budget = point["budget"]
    assert budget["ok"] is True
    assert budget["violations"] == 0
    assert budget["events"] > 0
    assert 0 < budget["max_held_slots"] <= 96

    assert (out / "summary.md").read_text().count("| 10 x 2 |") == 1
    image = imread(str(out / "scale.png"))
    assert image.shape[0] > 300
