"""`slotshift bench-scale`'s command line: defaults, per-point settings, refusals."""

from __future__ import annotations

from pathlib import Path

import pytest

from slotshift_tools.cli import main as slotshift_main
from slotshift_tools.scale.command import (
    build_parser,
    default_generator_processes,
    main,
    point_settings,
)
from slotshift_tools.scale.grid import GridPoint


def test_defaults_are_the_issues_grid_at_the_shipped_report_interval() -> None:
    args = build_parser().parse_args([])
    assert args.grid == "10x2,30x4,100x10,1000x10,1000x100,10000x10"
    assert args.interval_s == 0.25
    assert args.dynamics == "fluctuating"
    assert args.duration_s == 60.0


def test_each_point_gets_its_budget_interval_and_processes() -> None:
    args = build_parser().parse_args(
        ["--interval-s", "0.5", "--generator-processes", "4", "--set", "pools.0.fast_path=false"]
    )
    small = point_settings(GridPoint(10, 2), args)
    assert small.budget_slots == 96
    assert small.report_interval_s == 0.5
    assert small.generator_processes == 2, "never more processes than gateways"
    assert small.overrides == ("pools.0.fast_path=false",)
    large = point_settings(GridPoint(1000, 10, 1.0), args)
    assert large.budget_slots == 2000
    assert large.report_interval_s == 1.0
    assert large.generator_processes == 4


@pytest.mark.parametrize(("cpus", "processes"), [(1, 1), (2, 1), (16, 8)])
def test_the_generators_get_half_the_cpus(cpus: int, processes: int) -> None:
    assert default_generator_processes(cpus) == processes


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        pytest.param(["--grid", "10by2"], "expected TENANTSxGATEWAYS", id="bad-grid"),
        pytest.param(["--grid", "10x2", "--duration-s", "0"], "must be positive", id="no-window"),
    ],
)
def test_bad_arguments_are_refused_before_anything_starts(
    argv: list[str], message: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    out = tmp_path / "out"
    assert main([*argv, "--out", str(out)]) == 2
    assert message in capsys.readouterr().err
    assert not out.exists()


def test_the_slotshift_command_runs_it(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert slotshift_main(["bench-scale", "--grid", "nope", "--out", str(tmp_path)]) == 2
    assert "bench-scale" in capsys.readouterr().err
