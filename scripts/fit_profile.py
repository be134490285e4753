"""Refit the default profile's step costs to the calibration points and print the residuals.

Reads the points from slotshift_tools/emulator/calibration.py, fits base, per-sequence and
per-context-token costs by least squares (slotshift_tools/emulator/step_fit.py; the prefill cost
stays the profile's), prints the costs, each point's residual under the fitted and under the stored costs, and the Python to paste
into engine_sim/profiles.py (H200_QWEN25_3B_STEP).

    python scripts/fit_profile.py                      # fit, print, paste by hand
    python scripts/fit_profile.py --check              # exit 1 if the stored costs are stale
    python scripts/fit_profile.py --prefill-us 20      # try another prefill cost
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Sequence

from engine_sim.profiles import DEFAULT_PROFILE, PROFILES, StepCosts
from slotshift_tools.emulator.calibration import CALIBRATION_POINTS, measured_step_ms, steady_batch
from slotshift_tools.emulator.step_fit import PointResidual, fit_step_costs, residuals

STALE_RELATIVE_DIFFERENCE = 1e-3
"""--check fails when a stored cost differs from the fitted one by more than this fraction."""


def main(argv: Sequence[str] | None = None) -> int:
    """Run the script; returns the exit status."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    stored = PROFILES[DEFAULT_PROFILE].step
    parser.add_argument(
        "--prefill-us",
        type=float,
        default=stored.per_prefill_token_us,
        help="prefill cost per token in microseconds, held fixed (default: the profile's)",
    )
    parser.add_argument(
        "--check", action="store_true", help="exit 1 if the stored costs differ from the fit"
    )
    args = parser.parse_args(argv)

    print(f"calibration points ({DEFAULT_PROFILE}):")
    for point in CALIBRATION_POINTS:
        batch = steady_batch(point)
        print(
            f"  {point.scenario:<12} {point.published_output_tokens_per_s:>8.0f} tok/s  "
            f"mean batch {batch.num_seqs:6.2f} seqs, {batch.context_tokens:8.0f} context, "
            f"{batch.prefill_tokens:6.2f} prefill tokens -> {measured_step_ms(point):6.3f} ms/step"
        )
    fit = fit_step_costs(CALIBRATION_POINTS, args.prefill_us)
    print("\nfitted step costs:")
    print(_costs_line(fit.costs))
    print("residuals, fitted costs:")
    _print_residuals(fit.residuals)
    print("stored costs (engine_sim/profiles.py):")
    print(_costs_line(stored))
    print("residuals, stored costs:")
    _print_residuals(residuals(CALIBRATION_POINTS, stored))
    print("\npaste into engine_sim/profiles.py:\n")
    print(_python_literal(fit.costs))
    if args.check:
        stale = _stale_costs(stored, fit.costs)
        if stale:
            print(f"\nstale stored costs: {', '.join(stale)}", file=sys.stderr)
            return 1
        print("\nstored costs match the fit")
    return 0


def _costs_line(costs: StepCosts) -> str:
    return (
        f"  base {costs.base_ms:.4f} ms + {costs.per_seq_ms:.6f} ms/seq + "
        f"{costs.per_context_token_us:.6f} us/context token + "
        f"{costs.per_prefill_token_us:.2f} us/prefill token"
    )


def _print_residuals(point_residuals: Sequence[PointResidual]) -> None:
    for residual in point_residuals:
        print(
            f"  {residual.scenario:<12} published {residual.published_output_tokens_per_s:8.0f}"
            f"  model {residual.modelled_output_tokens_per_s:9.1f}"
            f"  error {residual.error_percent:+8.4f}%"
        )


def _python_literal(costs: StepCosts) -> str:
    return (
        "H200_QWEN25_3B_STEP = StepCosts(\n"
        f"    base_ms={costs.base_ms:.4f}, per_seq_ms={costs.per_seq_ms:.6f}, "
        f"per_context_token_us={costs.per_context_token_us:.6f}, "
        f"per_prefill_token_us={costs.per_prefill_token_us}\n"
        ")"
    )


def _stale_costs(stored: StepCosts, fitted: StepCosts) -> list[str]:
    pairs = {
        "base_ms": (stored.base_ms, fitted.base_ms),
        "per_seq_ms": (stored.per_seq_ms, fitted.per_seq_ms),
        "per_context_token_us": (stored.per_context_token_us, fitted.per_context_token_us),
        "per_prefill_token_us": (stored.per_prefill_token_us, fitted.per_prefill_token_us),
    }
    return [
        name
        for name, (old, new) in pairs.items()
        if abs(old - new) > STALE_RELATIVE_DIFFERENCE * max(abs(new), 1e-12)
    ]


if __name__ == "__main__":
    sys.exit(main())
