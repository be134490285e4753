"""The bench's statistics (pure): added latency from paired samples, medians of runs."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def percentile_ms(samples_s: Sequence[float], q: float) -> float:
    """The q-th percentile (0..100, linear interpolation) of `samples_s`, in ms; ValueError
    when there are none."""
    if not samples_s:
        raise ValueError("no samples")
    return float(np.percentile(np.asarray(samples_s, dtype=float), q)) * 1000.0


def added_p50_ms(through_s: Sequence[float], direct_s: Sequence[float]) -> float:
    """The median of the paired differences through - direct, in ms: pair i is the i-th
    request through the proxy and the i-th direct one, sent next to each other, so that drift
    of the machine cancels within a pair. ValueError when the lengths differ or are zero."""
    if len(through_s) != len(direct_s):
        raise ValueError(f"{len(through_s)} samples through against {len(direct_s)} direct")
    if not through_s:
        raise ValueError("no samples")
    differences = np.asarray(through_s, dtype=float) - np.asarray(direct_s, dtype=float)
    return float(np.median(differences)) * 1000.0


def added_p99_ms(through_s: Sequence[float], direct_s: Sequence[float]) -> float:
    """p99 through minus p99 direct, in ms (a tail is not a property of pairs: each side's own
    p99, then the difference). ValueError when either side has no samples."""
    return percentile_ms(through_s, 99) - percentile_ms(direct_s, 99)


def cpu_ms_per_1000_events(cpu_s: float, events: int) -> float:
    """CPU seconds over a window per 1,000 events relayed in it, in ms; ValueError when no
    event was relayed (the figure would be meaningless)."""
    if events <= 0:
        raise ValueError("no events relayed in the window")
    return cpu_s / events * 1_000_000.0


def median_of_runs(values: Sequence[float | None]) -> float | None:
    """The median of the runs' values (the runs that had one); None when none had."""
    present = [v for v in values if v is not None]
    return float(np.median(present)) if present else None
