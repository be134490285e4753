"""Cumulative Prometheus histograms: the change between two scrapes, and quantiles of it.

A Prometheus histogram series only ever grows (until its process restarts), so what happened
"in the last interval" is the bucket-by-bucket difference between two scrapes. Quantiles follow
Prometheus's `histogram_quantile`: linear interpolation inside the bucket that holds the rank,
the first bucket starting at 0, and a rank in the +Inf bucket answered with the highest finite
bound (the histogram knows nothing beyond it).
"""

from __future__ import annotations

import math
from collections.abc import Iterable
from dataclasses import dataclass


@dataclass(frozen=True)
class CumulativeHistogram:
    """One histogram series as scraped: bucket upper bounds and cumulative counts.

    upper_bounds is strictly increasing and ends with +Inf; cumulative_counts[i] is the number
    of observations <= upper_bounds[i]. created_s is the series' `_created` timestamp when the
    exporter publishes one: a new value means the series started over.
    """

    upper_bounds: tuple[float, ...]
    cumulative_counts: tuple[float, ...]
    created_s: float | None = None

    def __post_init__(self) -> None:
        if len(self.upper_bounds) != len(self.cumulative_counts):
            raise ValueError(
                f"{len(self.upper_bounds)} bucket bounds but {len(self.cumulative_counts)} counts"
            )
        if not self.upper_bounds or self.upper_bounds[-1] != math.inf:
            raise ValueError("a histogram needs a +Inf bucket")
        if any(b >= a for a, b in zip(self.upper_bounds[1:], self.upper_bounds, strict=False)):
            raise ValueError(f"bucket bounds are not strictly increasing: {self.upper_bounds}")

    @property
    def count(self) -> float:
        """Observations in the histogram (the +Inf bucket)."""
        return self.cumulative_counts[-1]


def histogram_increase(
    previous: CumulativeHistogram | None, current: CumulativeHistogram
) -> CumulativeHistogram:
    """The observations `current` holds that `previous` did not.

    Like Prometheus's increase(), a series that went down in any bucket, changed its buckets or
    its `_created` time is taken to have restarted between the scrapes, so everything it holds
    now was observed since then. No previous series means the series is new: the same.
    """
    if previous is None or _restarted(previous, current):
        return current
    return CumulativeHistogram(
        upper_bounds=current.upper_bounds,
        cumulative_counts=tuple(
            now - before
            for now, before in zip(
                current.cumulative_counts, previous.cumulative_counts, strict=True
            )
        ),
        created_s=current.created_s,
    )


def _restarted(previous: CumulativeHistogram, current: CumulativeHistogram) -> bool:
    if previous.upper_bounds != current.upper_bounds:
        return True
    if (
        previous.created_s is not None
        and current.created_s is not None
        and previous.created_s != current.created_s
    ):
        return True
    return any(
        now < before
        for now, before in zip(current.cumulative_counts, previous.cumulative_counts, strict=True)
    )


def merge_histograms(histograms: Iterable[CumulativeHistogram]) -> CumulativeHistogram | None:
    """One histogram holding the observations of all; None when there are none to merge.

    Series with the same buckets (every engine of one vLLM server) add bucket by bucket. Should
    bounds differ, each series is read at every bound of the union as the observations it knows
    to be at or below that bound, which can only move quantiles up, never hide latency.
    """
    series = list(histograms)
    if not series:
        return None
    bounds = tuple(sorted({bound for h in series for bound in h.upper_bounds}))
    totals = [0.0] * len(bounds)
    for histogram in series:
        for index, bound in enumerate(bounds):
            totals[index] += _count_at_or_below(histogram, bound)
    return CumulativeHistogram(upper_bounds=bounds, cumulative_counts=tuple(totals))


def _count_at_or_below(histogram: CumulativeHistogram, bound: float) -> float:
    known = 0.0
    for upper, count in zip(histogram.upper_bounds, histogram.cumulative_counts, strict=True):
        if upper > bound:
            break
        known = count
    return known


def histogram_quantile(quantile: float, histogram: CumulativeHistogram) -> float:
    """The quantile (0 to 1) of the observations, as Prometheus's histogram_quantile computes it.

    NaN when the histogram holds no observations or has no finite bucket to interpolate in.
    """
    if not 0.0 <= quantile <= 1.0:
        raise ValueError(f"quantile {quantile} is outside [0, 1]")
    bounds = histogram.upper_bounds
    counts = histogram.cumulative_counts
    total = histogram.count
    if total <= 0 or len(bounds) < 2:
        return math.nan
    rank = quantile * total
    # The first bucket whose cumulative count reaches the rank; past the last finite one, the
    # rank lies in +Inf.
    index = next(
        (i for i in range(len(bounds) - 1) if counts[i] >= rank),
        len(bounds) - 1,
    )
    if index == len(bounds) - 1:
        return bounds[-2]
    if index == 0 and bounds[0] <= 0:
        return bounds[0]
    start = 0.0 if index == 0 else bounds[index - 1]
    below = 0.0 if index == 0 else counts[index - 1]
    in_bucket = counts[index] - below
    if in_bucket <= 0:
        return bounds[index]
    return start + (bounds[index] - start) * (rank - below) / in_bucket
