"""Least-squares fit of the step-time model to calibration points, in plain Python.

Unknowns: base_ms, per_seq_ms and per_context_token_us. The prefill cost is given, not fitted
(the study has no point that isolates it); its share of each point's step time is taken off
before the fit. Each point contributes one equation, mean step time = base + per_seq x seqs +
per_context x context tokens, weighted by 1 / its step time so that the fit minimises relative
error, which is what the fidelity goal (+-10%) is stated in. The normal equations are solved by
Gaussian elimination with partial pivoting: deterministic, and no numpy.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from engine_sim.profiles import StepCosts
from slotshift_tools.emulator.calibration import (
    CalibrationPoint,
    measured_step_ms,
    modelled_output_tokens_per_s,
    steady_batch,
)

FITTED_COSTS = 3
"""base_ms, per_seq_ms, per_context_token_us."""


@dataclass(frozen=True)
class PointResidual:
    """How far the model's steady-state throughput lies from a published figure."""

    scenario: str
    published_output_tokens_per_s: float
    modelled_output_tokens_per_s: float

    @property
    def error_percent(self) -> float:
        """(modelled - published) / published, in percent."""
        published = self.published_output_tokens_per_s
        return (self.modelled_output_tokens_per_s - published) / published * 100.0


@dataclass(frozen=True)
class StepFit:
    """Fitted costs and each point's residual under them."""

    costs: StepCosts
    residuals: tuple[PointResidual, ...]


def fit_step_costs(points: Sequence[CalibrationPoint], per_prefill_token_us: float) -> StepFit:
    """Fit base, per-sequence and per-context-token costs to `points` (at least three).

    ValueError when the points do not determine the costs (too few, or linearly dependent), or
    when the best fit needs a negative cost (the model cannot explain the points).
    """
    if len(points) < FITTED_COSTS:
        raise ValueError(f"{FITTED_COSTS} costs need at least {FITTED_COSTS} points")
    rows: list[list[float]] = []
    targets: list[float] = []
    for point in points:
        batch = steady_batch(point)
        step_ms = measured_step_ms(point)
        weight = 1.0 / step_ms
        prefill_ms = per_prefill_token_us * batch.prefill_tokens / 1000.0
        rows.append([weight, batch.num_seqs * weight, batch.context_tokens / 1000.0 * weight])
        targets.append((step_ms - prefill_ms) * weight)
    base_ms, per_seq_ms, per_context_token_us = _least_squares(rows, targets)
    costs = StepCosts(
        base_ms=base_ms,
        per_seq_ms=per_seq_ms,
        per_context_token_us=per_context_token_us,
        per_prefill_token_us=per_prefill_token_us,
    )
    return StepFit(costs, residuals(points, costs))


def residuals(points: Sequence[CalibrationPoint], costs: StepCosts) -> tuple[PointResidual, ...]:
    """Each point's published throughput against what `costs` predict."""
    return tuple(
        PointResidual(
            point.scenario,
            point.published_output_tokens_per_s,
            modelled_output_tokens_per_s(point, costs),
        )
        for point in points
    )


def _least_squares(rows: list[list[float]], targets: list[float]) -> list[float]:
    """x minimising |rows x - targets|^2, from the normal equations (rows^T rows) x = rows^T t."""
    width = len(rows[0])
    normal = [
        [sum(row[i] * row[j] for row in rows) for j in range(width)]
        + [sum(row[i] * target for row, target in zip(rows, targets, strict=True))]
        for i in range(width)
    ]
    scale = max(abs(value) for line in normal for value in line[:width])
    for column in range(width):
        pivot = max(range(column, width), key=lambda r: abs(normal[r][column]))
        if abs(normal[pivot][column]) <= 1e-12 * scale:
            raise ValueError("the points do not determine the step costs (singular system)")
        normal[column], normal[pivot] = normal[pivot], normal[column]
        for row in range(width):
            if row != column:
                factor = normal[row][column] / normal[column][column]
                normal[row] = [
                    a - factor * b for a, b in zip(normal[row], normal[column], strict=True)
                ]
    return [normal[i][width] / normal[i][i] for i in range(width)]
