"""The grid's table, document and plot."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from matplotlib.image import imread

from slotshift_tools.scale.report import grid_document, markdown_table, plot_grid


def point(
    label: str, tenants: int, gateways: int, *, valid: bool = True, p99: float | None = 3.0
) -> dict[str, Any]:
    return {
        "point": {
            "label": label,
            "tenants": tenants,
            "gateways": gateways,
            "tenants_x_gateways": tenants * gateways,
            "report_interval_s": 0.25,
        },
        "valid": valid,
        "invalid_reasons": [] if valid else ["the host was saturated"],
        "controlplane": {"cpu_cores": 0.43, "rss_mb": 71.2},
        "decisions": {
            "made": 75,
            "periods_elapsed": 10.0,
            "missed_periods": 0,
            "duration": {"p50_ms": 1.25, "p99_ms": p99},
        },
        "decision_to_acknowledged": {"p50_ms": 5.0, "p99_ms": 17.0},
        "messages": {"updates_per_gateway_per_s": 27.04, "update_bytes_per_gateway_per_s": 7300.0},
        "budget": {"ok": valid, "violations": 0 if valid else 3},
    }


def test_the_table_has_a_row_a_point_and_says_why_a_point_is_invalid() -> None:
    table = markdown_table([point("30x4", 30, 4), point("100x10", 100, 10, valid=False, p99=None)])
    lines = table.splitlines()
    assert lines[0].startswith("| tenants x gateways |")
    assert lines[2] == (
        "| 30 x 4 | 0.25 | yes | 0.43 | 71 | 75 / 10 | 0 | 1.2 / 3.0 | 5 / 17 | 27.0 | 7.3 | ok |"
    )
    assert "| 100 x 10 |" in lines[3]
    assert "| NO |" in lines[3]
    assert "n/a" in lines[3]
    assert "3 violations" in lines[3]
    assert "- 100x10: invalid: the host was saturated" in table


def test_the_grid_document_says_whether_the_budget_held_everywhere() -> None:
    grid = grid_document([point("10x2", 10, 2)], {"grid": "10x2"}, {"30x4": "it died"})
    assert grid["budget_ok"] is True
    assert grid["failed_points"] == {"30x4": "it died"}
    assert grid_document([point("10x2", 10, 2, valid=False)], {}, {})["budget_ok"] is False


def test_the_plot_is_a_png(tmp_path: Path) -> None:
    path = tmp_path / "scale.png"
    plot_grid([point("10x2", 10, 2), point("100x10", 100, 10, valid=False, p99=None)], path)
    image = imread(str(path))
    assert image.shape[0] > 300
    assert image.shape[1] > 600
