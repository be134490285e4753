"""The throughput / interactive-TTFT trade-off, measured with EngineCore in virtual time."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from slotshift.config import EngineSimConfig
from slotshift_tools.bench.arrivals import is_open_loop
from slotshift_tools.bench.scenario import (
    ClosedLoopArrival,
    OnOffArrival,
    TokenRange,
    load_scenario,
)
from slotshift_tools.emulator.calibration import CALIBRATION_POINTS
from slotshift_tools.emulator.tradeoff import (
    EnginePoint,
    TradeoffSetup,
    batch_sizes,
    main,
    measure_point,
    policy_bounds,
)

ROOT = Path(__file__).resolve().parents[4]
ENGINE = EngineSimConfig.model_validate({"profile": "h200-qwen2.5-3b"})


def measure(size: int, *, interactive: bool, duration_s: float = 20.0) -> EnginePoint:
    return measure_point(
        TradeoffSetup(),
        ENGINE,
        size,
        interactive=interactive,
        duration_s=duration_s,
        warmup_s=10.0,
        seed=1,
    )


def test_the_defaults_are_the_seed_scenarios_tenants() -> None:
    scenario = load_scenario(ROOT / "bench" / "scenarios" / "seed.yaml")
    interactive, batch = scenario.tenants
    assert isinstance(interactive.arrival, OnOffArrival) and is_open_loop(interactive.arrival)
    assert isinstance(batch.arrival, ClosedLoopArrival)
    assert isinstance(batch.output_tokens, TokenRange)
    assert isinstance(interactive.prompt_tokens, int)
    assert isinstance(interactive.output_tokens, int)
    assert isinstance(batch.prompt_tokens, int)
    assert scenario.budget_slots is not None, "the seed is one server"
    on = interactive.arrival.on_s / (interactive.arrival.on_s + interactive.arrival.off_s)
    assert TradeoffSetup() == TradeoffSetup(
        budget_slots=scenario.budget_slots,
        static_batch_slots=scenario.budget_slots // 2,  # equal weights
        interactive_floor_slots=interactive.floor_slots,
        interactive_rate_per_s=interactive.arrival.rate_per_s or 0.0,
        interactive_active_fraction=on,
        interactive_prompt_tokens=interactive.prompt_tokens,
        interactive_output_tokens=interactive.output_tokens,
        batch_prompt_tokens=batch.prompt_tokens,
        batch_min_output_tokens=batch.output_tokens.min_tokens,
        batch_max_output_tokens=batch.output_tokens.max_tokens,
    )
    assert interactive.weight == batch.weight


@pytest.mark.parametrize("point", ["batch-48", "batch-92"])
def test_the_batch_tenant_alone_meets_the_calibration_points(point: str) -> None:
    [calibration] = [p for p in CALIBRATION_POINTS if p.scenario == point]
    [load] = calibration.tenants
    measured = measure(load.in_flight, interactive=False)
    assert (measured.interactive_tokens_per_s, measured.ttft_p99_ms) == (0.0, None)
    published = calibration.published_output_tokens_per_s
    assert measured.batch_tokens_per_s == pytest.approx(published, rel=0.10)


def test_interactive_ttft_grows_with_the_batch_and_so_does_the_throughput() -> None:
    small, large = measure(48, interactive=True), measure(92, interactive=True)
    assert small.interactive_requests > 100 and large.interactive_requests > 100
    assert small.ttft_p50_ms is not None and large.ttft_p50_ms is not None
    # Steps of about 8 ms against about 12 ms: the first token needs one step and a part.
    assert 8.0 < small.ttft_p50_ms < 20.0
    assert large.ttft_p50_ms > 1.3 * small.ttft_p50_ms
    assert large.total_tokens_per_s > 1.1 * small.total_tokens_per_s
    # The interactive tenant is served in full either way: 8 requests/s of 64 tokens.
    for point in (small, large):
        assert point.interactive_tokens_per_s == pytest.approx(8 * 64, rel=0.25)


def point(size: int, total: float, p99: float | None, *, interactive: bool = True) -> EnginePoint:
    return EnginePoint(size, interactive, total - 500.0, 500.0, None, p99, 10)


def test_bounds_weigh_the_active_and_idle_phases_against_static() -> None:
    setup = TradeoffSetup(
        budget_slots=10,
        static_batch_slots=5,
        interactive_floor_slots=2,
        interactive_active_fraction=0.25,
    )
    active = [point(5, 1000.0, 10.0), point(7, 1200.0, 14.0), point(8, 1300.0, None)]
    idle = [point(5, 900.0, None, interactive=False), point(8, 1500.0, None, interactive=False)]
    [static, seven] = policy_bounds(setup, active, idle)
    static_total = 0.25 * 1000.0 + 0.75 * 900.0
    assert static.batch_while_active == 5 and static.batch_while_idle == 8
    assert static.total_throughput_ratio == pytest.approx(
        (0.25 * 1000 + 0.75 * 1500) / static_total
    )
    assert static.ttft_p99_ratio == 1.0
    assert seven.total_throughput_ratio == pytest.approx((0.25 * 1200 + 0.75 * 1500) / static_total)
    assert seven.ttft_p99_ratio == pytest.approx(1.4)


def test_batch_sizes_run_from_the_static_share_to_all_but_the_floor() -> None:
    assert batch_sizes(TradeoffSetup()) == [48, 52, 56, 60, 64, 68, 72, 76, 80, 84, 88, 92]


def test_main_prints_the_table_and_writes_the_report(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(["--duration", "3", "--warmup", "1", "--out", str(tmp_path)]) == 0
    printed = capsys.readouterr().out
    assert "| 92 |" in printed
    report = json.loads((tmp_path / "tradeoff.json").read_text())
    assert [p["batch_in_flight"] for p in report["active"]] == batch_sizes(TradeoffSetup())
    assert [p["batch_in_flight"] for p in report["idle"]] == [48, 92]
    assert report["bounds"][0]["ttft_p99_ratio"] == 1.0
