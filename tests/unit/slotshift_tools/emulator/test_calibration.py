"""Calibration: the steady-state batch, the fit, and the pure core at the study's points."""

from __future__ import annotations

import dataclasses

import pytest

from engine_sim.engine_core import EngineCore, RequestSpec
from engine_sim.profiles import DEFAULT_PROFILE, PROFILES, StepCosts
from engine_sim.tokens import synthetic_prompt_ids
from slotshift.clock import ManualClock
from slotshift.config import EngineSimConfig
from slotshift_tools.emulator.calibration import (
    CALIBRATION_POINTS,
    REFILL_GAP_STEPS,
    CalibrationPoint,
    ClosedLoopLoad,
    steady_batch,
)
from slotshift_tools.emulator.step_fit import fit_step_costs, residuals

STORED = PROFILES[DEFAULT_PROFILE].step


def point(*tenants: ClosedLoopLoad, published: float = 1000.0) -> CalibrationPoint:
    return CalibrationPoint("p", tenants, published, "test")


def test_the_steady_batch_averages_one_slot_cycle() -> None:
    # 10 slots, 4-token prompts, 3 output tokens, one empty step per cycle of 4 steps:
    # contexts 4, 5, 6 and an empty step -> 3 of 4 steps busy, 15 context tokens per cycle.
    assert REFILL_GAP_STEPS == 1
    batch = steady_batch(point(ClosedLoopLoad("t", 10, prompt_tokens=4, output_tokens=3)))
    assert batch.num_seqs == pytest.approx(7.5)
    assert batch.context_tokens == pytest.approx(10 * 15 / 4)
    assert batch.prefill_tokens == pytest.approx(10 * 4 / 4)
    assert batch.output_tokens == pytest.approx(7.5)


def test_the_stored_costs_reproduce_every_published_figure() -> None:
    for residual in residuals(CALIBRATION_POINTS, STORED):
        assert abs(residual.error_percent) < 0.05, residual


def test_the_fit_reproduces_the_stored_costs() -> None:
    fit = fit_step_costs(CALIBRATION_POINTS, STORED.per_prefill_token_us)
    assert fit.costs.base_ms == pytest.approx(STORED.base_ms, rel=1e-3)
    assert fit.costs.per_seq_ms == pytest.approx(STORED.per_seq_ms, rel=1e-3)
    assert fit.costs.per_context_token_us == pytest.approx(STORED.per_context_token_us, rel=1e-3)
    assert all(abs(r.error_percent) < 1e-6 for r in fit.residuals)


def test_a_batch_size_only_line_misses_the_mixed_run_by_about_a_fifth() -> None:
    # The study's observation that motivates the context term.
    line = dataclasses.replace(STORED, per_seq_ms=0.10386, per_context_token_us=0.0)
    line = dataclasses.replace(line, per_prefill_token_us=0.0, base_ms=2.335)
    by_scenario = {r.scenario: r.error_percent for r in residuals(CALIBRATION_POINTS, line)}
    assert abs(by_scenario["batch-48"]) < 1.0
    assert abs(by_scenario["batch-92"]) < 1.0
    assert -25.0 < by_scenario["mixed-48-48"] < -15.0


def test_the_fit_recovers_known_costs_from_more_points_than_unknowns() -> None:
    truth = StepCosts(
        base_ms=3.0, per_seq_ms=0.05, per_context_token_us=0.2, per_prefill_token_us=10
    )
    loads = [
        (ClosedLoopLoad("x", n, prompt, out),)
        for n, prompt, out in ((8, 32, 64), (32, 128, 256), (64, 16, 16), (96, 512, 128))
    ]
    shapes = [point(*load) for load in loads]
    exact = [
        dataclasses.replace(p, published_output_tokens_per_s=r.modelled_output_tokens_per_s)
        for p, r in zip(shapes, residuals(shapes, truth), strict=True)
    ]
    fitted = fit_step_costs(exact, per_prefill_token_us=10).costs
    assert fitted.base_ms == pytest.approx(3.0, rel=1e-9)
    assert fitted.per_seq_ms == pytest.approx(0.05, rel=1e-9)
    assert fitted.per_context_token_us == pytest.approx(0.2, rel=1e-9)


@pytest.mark.parametrize(
    ("points", "message"),
    [
        pytest.param(CALIBRATION_POINTS[:2], "at least 3 points", id="too-few"),
        pytest.param([CALIBRATION_POINTS[0]] * 3, "singular", id="the-same-point-thrice"),
    ],
)
def test_the_fit_refuses_points_that_do_not_determine_the_costs(
    points: list[CalibrationPoint], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        fit_step_costs(points, per_prefill_token_us=12.0)


def test_the_fit_refuses_a_negative_cost() -> None:
    # Equal 128-token prompts with the compute-bound prefill cost: see calibration.py.
    equal_prompts = [
        dataclasses.replace(
            p, tenants=tuple(dataclasses.replace(t, prompt_tokens=128) for t in p.tenants)
        )
        for p in CALIBRATION_POINTS
    ]
    with pytest.raises(ValueError, match="per_seq_ms must not be negative"):
        fit_step_costs(equal_prompts, per_prefill_token_us=20.0)


def closed_loop_throughput(calibration: CalibrationPoint, steps: int, skip: int) -> float:
    """Drive the pure core as the emulator's clients do: refills arrive one step late."""
    core, clock = EngineCore(EngineSimConfig()), ManualClock()
    loads: dict[str, ClosedLoopLoad] = {}
    for load in calibration.tenants:
        for index in range(load.in_flight):
            request_id = f"{load.tenant}{index}-0"
            loads[request_id] = load
            # As the fidelity clients start: mid-cycle, the tokens already generated as prompt.
            done = index * load.output_tokens // load.in_flight
            first = RequestSpec(
                request_id,
                synthetic_prompt_ids(request_id, load.prompt_tokens + done),
                load.output_tokens - done,
                ignore_eos=True,
            )
            core.add_request(first, 0.0)
    refills: list[RequestSpec] = []
    tokens = 0
    started_s = 0.0
    for number in range(steps):
        if number == skip:
            tokens, started_s = 0, clock.monotonic()
        step = core.schedule(clock.monotonic())
        for refill in refills:  # sent when the previous step's responses reached the clients
            core.add_request(refill, clock.monotonic())
        refills = []
        clock.advance(step.duration_s)
        outcome = core.complete(step, clock.monotonic())
        tokens += len(outcome.tokens)
        for finished in outcome.finished:
            load = loads.pop(finished.request_id)
            slot, count = finished.request_id.rsplit("-", 1)
            request_id = f"{slot}-{int(count) + 1}"
            loads[request_id] = load
            prompt = synthetic_prompt_ids(request_id, load.prompt_tokens)
            refills.append(RequestSpec(request_id, prompt, load.output_tokens, ignore_eos=True))
    return tokens / (clock.monotonic() - started_s)


@pytest.mark.parametrize("calibration", CALIBRATION_POINTS, ids=lambda p: p.scenario)
def test_the_core_meets_each_published_figure_in_closed_loop(
    calibration: CalibrationPoint,
) -> None:
    # The steady-state averaging of calibration.py and the fit hold for the real scheduler:
    # well within the rounding of the stored costs, from the first steps on.
    measured = closed_loop_throughput(calibration, steps=600, skip=50)
    published = calibration.published_output_tokens_per_s
    assert measured == pytest.approx(published, rel=0.002)
