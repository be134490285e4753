"""Histogram increases between scrapes and Prometheus-style quantiles over them."""

from __future__ import annotations

import math

import pytest

from telemetry_agent.engine_scraper import latency_summary
from telemetry_agent.histogram import (
    CumulativeHistogram,
    histogram_increase,
    histogram_quantile,
    merge_histograms,
)

INF = math.inf
BOUNDS = (0.1, 0.2, 0.5, 1.0, INF)


def hist(
    *counts: float, bounds: tuple[float, ...] = BOUNDS, created_s: float | None = None
) -> CumulativeHistogram:
    return CumulativeHistogram(upper_bounds=bounds, cumulative_counts=counts, created_s=created_s)


def test_increase_is_the_bucket_by_bucket_difference() -> None:
    before = hist(10, 20, 30, 30, 30)
    after = hist(14, 30, 45, 46, 47)
    assert histogram_increase(before, after).cumulative_counts == (4, 10, 15, 16, 17)


def test_an_interval_without_observations_has_count_zero_and_no_percentiles() -> None:
    same = hist(10, 20, 30, 30, 30)
    interval = histogram_increase(same, same)
    assert interval.count == 0
    assert math.isnan(histogram_quantile(0.5, interval))
    summary = latency_summary(interval)
    assert (summary.count, summary.p50_ms, summary.p90_ms, summary.p99_ms) == (0, 0.0, 0.0, 0.0)


@pytest.mark.parametrize(
    ("before", "after"),
    [
        pytest.param(hist(10, 20, 30, 30, 30), hist(1, 2, 3, 3, 3), id="every-bucket-went-down"),
        pytest.param(hist(10, 20, 30, 30, 30), hist(12, 19, 31, 31, 31), id="one-bucket-went-down"),
        pytest.param(
            hist(10, 20, 30, 30, 30, created_s=100.0),
            hist(11, 21, 31, 31, 31, created_s=200.0),
            id="created-time-changed",
        ),
        pytest.param(
            hist(10, 20, 30, 30, 30),
            hist(1, 2, 3, 3, bounds=(0.1, 0.2, 0.5, INF)),
            id="buckets-changed",
        ),
    ],
)
def test_a_restarted_series_counts_everything_it_holds_now(
    before: CumulativeHistogram, after: CumulativeHistogram
) -> None:
    assert histogram_increase(before, after) == after


def test_a_new_series_counts_everything_it_holds() -> None:
    after = hist(1, 2, 3, 3, 3)
    assert histogram_increase(None, after) == after


def test_quantiles_interpolate_linearly_inside_the_bucket() -> None:
    # 100 observations: 20 in (0, 0.1], 30 in (0.1, 0.2], 40 in (0.2, 0.5], 10 in (0.5, 1.0].
    h = hist(20, 50, 90, 100, 100)
    # rank 50 is the last of bucket (0.1, 0.2].
    assert histogram_quantile(0.5, h) == pytest.approx(0.2)
    # rank 10 is half-way through the first bucket, which starts at 0.
    assert histogram_quantile(0.1, h) == pytest.approx(0.05)
    # rank 70: 20 of the 40 in (0.2, 0.5].
    assert histogram_quantile(0.7, h) == pytest.approx(0.35)
    # rank 99: 9 of the 10 in (0.5, 1.0].
    assert histogram_quantile(0.99, h) == pytest.approx(0.95)


def test_a_rank_in_the_inf_bucket_gives_the_highest_finite_bound() -> None:
    h = hist(0, 0, 0, 5, 10)
    assert histogram_quantile(0.9, h) == 1.0


def test_a_histogram_with_only_the_inf_bucket_has_no_quantile() -> None:
    assert math.isnan(histogram_quantile(0.5, hist(3, bounds=(INF,))))


def test_quantile_outside_zero_to_one_is_refused() -> None:
    with pytest.raises(ValueError, match="outside"):
        histogram_quantile(1.5, hist(1, 1, 1, 1, 1))


def test_merge_adds_series_with_the_same_buckets() -> None:
    merged = merge_histograms([hist(1, 2, 3, 4, 5), hist(10, 10, 10, 10, 10)])
    assert merged == hist(11, 12, 13, 14, 15)


def test_merge_of_different_buckets_counts_only_what_is_known_below_each_bound() -> None:
    coarse = hist(4, 8, bounds=(0.5, INF))
    fine = hist(1, 2, 3, 3, 3)
    merged = merge_histograms([coarse, fine])
    assert merged is not None
    assert merged.upper_bounds == BOUNDS
    # The coarse series says nothing about 0.1 and 0.2, so it adds to the counts from 0.5 on.
    assert merged.cumulative_counts == (1, 2, 7, 7, 11)


def test_merge_of_nothing_is_none() -> None:
    assert merge_histograms([]) is None


def test_latency_summary_counts_observations_and_reports_milliseconds() -> None:
    summary = latency_summary(hist(20, 50, 90, 100, 100))
    assert summary.count == 100
    assert summary.p50_ms == pytest.approx(200.0)
    assert summary.p90_ms == pytest.approx(500.0)
    assert summary.p99_ms == pytest.approx(950.0)


@pytest.mark.parametrize(
    ("bounds", "counts", "message"),
    [
        pytest.param((0.1, 0.2), (1, 2), "Inf", id="no-inf-bucket"),
        pytest.param((0.2, 0.1, INF), (1, 2, 3), "increasing", id="unsorted"),
        pytest.param((0.1, INF), (1, 2, 3), "counts", id="length-mismatch"),
    ],
)
def test_malformed_histograms_are_refused(
    bounds: tuple[float, ...], counts: tuple[float, ...], message: str
) -> None:
    with pytest.raises(ValueError, match=message):
        CumulativeHistogram(upper_bounds=bounds, cumulative_counts=counts)
