"""The fidelity benchmark, briefly: the real emulator over HTTP for about a second a point."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from slotshift_tools.emulator.calibration import CalibrationPoint, ClosedLoopLoad
from slotshift_tools.emulator.fidelity import FidelityResult, format_table, main, run_fidelity

SMALL = CalibrationPoint(
    scenario="small",
    tenants=(ClosedLoopLoad("A", 4, 16, 8), ClosedLoopLoad("B", 8, 32, 64)),
    published_output_tokens_per_s=1000.0,
    source="test",
)


async def test_a_short_run_meets_the_step_model() -> None:
    (result,) = await run_fidelity("h200-qwen2.5-3b", 1.0, warmup_s=0.3, points=[SMALL])
    assert result.scenario == "small"
    assert result.failed_requests == 0
    assert result.completed_requests > 50  # A's 8-token requests complete every ~9 steps
    assert 0.9 < result.window_s < 1.5
    # Generous: one second is short, and a loaded test machine may slow the event loop.
    assert abs(result.model_error_percent) < 15.0, result
    assert result.error_percent == pytest.approx(
        (result.measured_output_tokens_per_s - 1000.0) / 10.0
    )
    assert 90.0 < result.mean_emulated_gpu_utilization_percent <= 100.0
    assert result.process_cpu_percent > 0


async def test_an_unknown_profile_is_refused_naming_the_known_ones() -> None:
    with pytest.raises(ValueError, match=r"h200-qwen2\.5-3b, h200-qwen2\.5-7b"):
        await run_fidelity("h100-llama", 1.0)


def test_the_command_prints_the_table_and_writes_json(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    status = main(
        ["--scenario", "batch-48", "--duration", "0.6", "--warmup", "1.0", "--out", str(tmp_path)]
    )
    printed = capsys.readouterr().out
    assert "| batch-48 | 6,557 |" in printed
    report = json.loads((tmp_path / "fidelity.json").read_text())
    assert report["profile"] == "h200-qwen2.5-3b"
    (result,) = report["results"]
    assert result["scenario"] == "batch-48"
    assert result["published_output_tokens_per_s"] == 6557.0
    # Whether 0.6 s on a shared machine lands within the goal is the benchmark's question
    # (`slotshift bench-fidelity`, docs/results/), not this test's: here the verdict, the
    # figures and the exit status agree.
    within = abs(result["error_percent"]) <= 10.0
    assert result["within_tolerance"] is within
    assert status == (0 if within else 1)


def test_a_profile_without_published_figures_is_judged_against_its_model() -> None:
    result = FidelityResult(
        profile="h200-qwen2.5-7b",
        scenario="batch-48",
        published_output_tokens_per_s=None,
        modelled_output_tokens_per_s=2000.0,
        measured_output_tokens_per_s=2100.0,
        completed_output_tokens_per_s=2050.0,
        completed_requests=10,
        failed_requests=0,
        window_s=10.0,
        mean_step_ms=20.0,
        mean_emulated_gpu_utilization_percent=100.0,
        process_cpu_percent=10.0,
        max_event_loop_lag_ms=1.0,
    )
    assert result.error_percent is None
    assert result.model_error_percent == pytest.approx(5.0)
    assert result.within_tolerance
    assert "| batch-48 | n/a | 2,000 | 2,100 | n/a | +5.0 |" in format_table([result])
