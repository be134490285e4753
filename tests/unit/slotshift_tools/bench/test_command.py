"""`slotshift bench` refuses what it cannot run before starting anything."""

from __future__ import annotations

import io
from pathlib import Path

import pytest

from slotshift_tools.bench.command import run_bench

SEED = Path(__file__).resolve().parents[4] / "bench" / "scenarios" / "seed.yaml"


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        pytest.param({"runs": ["static", "fastest"]}, "no run named 'fastest'", id="unknown run"),
        pytest.param({"runs": []}, "--runs names no run", id="no run"),
        pytest.param({"duration_s": 0.0}, "--duration must be positive", id="no window"),
        pytest.param({"warmup_s": -1.0}, "--warmup must not be negative", id="negative warm-up"),
    ],
)
def test_bad_arguments_are_refused_by_name(
    kwargs: dict[str, object], message: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    progress = io.StringIO()
    status = run_bench(SEED, out_dir=tmp_path / "out", out=progress, **kwargs)  # type: ignore[arg-type]
    assert status == 2
    assert message in capsys.readouterr().err
    assert progress.getvalue() == ""  # nothing started
    assert not (tmp_path / "out").exists()


def test_an_invalid_scenario_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    broken = tmp_path / "broken.yaml"
    broken.write_text("name: x\nbudget_slots: 0\n")
    assert run_bench(broken, out_dir=tmp_path / "out", out=io.StringIO()) == 2
    assert "invalid scenario" in capsys.readouterr().err
