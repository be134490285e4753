"""The harness's statistics on hand-made traces: percentiles, windowing, throughput, goodput."""

from __future__ import annotations

import random
from dataclasses import dataclass

import numpy as np
import pytest

from slotshift_tools.bench.stats import (
    RESULT_FIELDS,
    Window,
    chunks_inside,
    describe_ms,
    is_good,
    mean_and_peak,
    percentile,
    rate,
    ratio,
    summarise,
    tpot_s,
)
from slotshift_tools.bench.trace import RequestStatus, RequestTrace
from tests.unit.slotshift_tools.bench.traces import cancelled, done, failed


@dataclass(frozen=True)
class Slo:
    ttft_ms: float | None = None
    tpot_ms: float | None = None
    e2el_ms: float | None = None


def _random_values(seed: int, n: int) -> list[float]:
    rng = random.Random(seed)
    return [rng.lognormvariate(0, 1) for _ in range(n)]


@pytest.mark.parametrize(
    ("values", "q"),
    [
        pytest.param([7.0], 99, id="one value"),
        pytest.param([1.0, 2.0], 50, id="two values, median between"),
        pytest.param([1.0, 2.0, 3.0, 4.0], 90, id="p90 interpolates"),
        pytest.param([5.0, 1.0, 4.0, 2.0, 3.0], 0, id="p0 is the minimum"),
        pytest.param([5.0, 1.0, 4.0, 2.0, 3.0], 100, id="p100 is the maximum"),
        pytest.param([3.0, 3.0, 3.0, 9.0], 99, id="repeated values"),
        pytest.param(_random_values(1, 10), 99, id="10 random, p99"),
        pytest.param(_random_values(2, 1001), 99, id="1001 random, p99"),
        pytest.param(_random_values(3, 1000), 90, id="1000 random, p90"),
        pytest.param(_random_values(4, 37), 50, id="37 random, median"),
    ],
)
def test_percentile_matches_numpys_default_linear_method(values: list[float], q: float) -> None:
    assert percentile(values, q) == pytest.approx(float(np.percentile(values, q)), rel=1e-12)


def test_percentile_refuses_no_values_and_bad_q() -> None:
    with pytest.raises(ValueError, match="no values"):
        percentile([], 50)
    with pytest.raises(ValueError, match="outside"):
        percentile([1.0], 101)


def test_describe_gives_milliseconds_and_none_for_no_values() -> None:
    values_s = _random_values(5, 200)
    figures = describe_ms(values_s, "ttft")
    values_ms = np.array(values_s) * 1000
    assert figures["mean_ttft_ms"] == pytest.approx(float(values_ms.mean()))
    assert figures["median_ttft_ms"] == pytest.approx(float(np.median(values_ms)))
    assert figures["std_ttft_ms"] == pytest.approx(float(values_ms.std()))
    assert figures["p90_ttft_ms"] == pytest.approx(float(np.percentile(values_ms, 90)))
    assert figures["p99_ttft_ms"] == pytest.approx(float(np.percentile(values_ms, 99)))
    assert describe_ms([], "itl") == {
        "mean_itl_ms": None,
        "median_itl_ms": None,
        "std_itl_ms": None,
        "p90_itl_ms": None,
        "p99_itl_ms": None,
    }


WINDOW = Window(10.0, 20.0)


@pytest.mark.parametrize(
    ("trace", "counts"),
    [
        pytest.param(done("A", 11.0, 0.5, [0.1]), True, id="inside"),
        pytest.param(done("A", 10.0, 0.5, [0.1]), True, id="starts on the start edge"),
        pytest.param(done("A", 19.0, 0.5, [0.5]), True, id="ends on the end edge"),
        pytest.param(done("A", 9.9, 0.5, [0.1]), True, id="starts before, ends inside"),
        pytest.param(done("A", 8.0, 0.5, [0.1]), False, id="ends before"),
        pytest.param(done("A", 19.5, 0.5, [0.1]), False, id="ends after"),
        pytest.param(failed("A", 12.0, 13.0), True, id="failed inside"),
        pytest.param(failed("A", 19.0, 20.5), False, id="failed after the end"),
        pytest.param(cancelled("A", 12.0, 13.0, []), False, id="cancelled never counts"),
        pytest.param(
            RequestTrace(tenant="A", gateway=0, prompt_tokens=1, max_tokens=1, start_s=12.0),
            False,
            id="still pending",
        ),
    ],
)
def test_a_request_counts_when_it_ends_inside_the_window(trace: RequestTrace, counts: bool) -> None:
    assert WINDOW.counts(trace) is counts


def test_an_empty_window_is_refused() -> None:
    with pytest.raises(ValueError, match="empty window"):
        Window(5.0, 5.0)


def test_tpot_leaves_out_the_first_token() -> None:
    trace = done("A", 0.0, 0.4, [0.1, 0.1, 0.1], tail_s=0.0)  # 4 tokens, e2el 0.7 s
    assert tpot_s(trace) == pytest.approx((0.7 - 0.4) / 3)


def test_tpot_of_one_output_token_is_undefined() -> None:
    assert tpot_s(done("A", 0.0, 0.4, [])) is None


def test_tpot_of_a_request_without_first_token_is_undefined() -> None:
    assert tpot_s(failed("A", 0.0, 1.0)) is None


@pytest.mark.parametrize(
    ("trace", "slo", "good"),
    [
        pytest.param(done("A", 0, 0.5, [0.1]), Slo(ttft_ms=500), True, id="ttft on the limit"),
        pytest.param(done("A", 0, 0.6, [0.1]), Slo(ttft_ms=500), False, id="ttft over"),
        pytest.param(done("A", 0, 0.1, [1.0]), Slo(e2el_ms=1000), False, id="e2el over"),
        pytest.param(done("A", 0, 0.1, [0.05, 0.05]), Slo(tpot_ms=40), False, id="tpot over"),
        pytest.param(done("A", 0, 0.1, [0.03, 0.03]), Slo(tpot_ms=40), True, id="tpot within"),
        pytest.param(done("A", 0, 0.1, []), Slo(tpot_ms=1), True, id="one token meets any tpot"),
        pytest.param(failed("A", 0, 0.1), Slo(e2el_ms=1000), False, id="failed is never good"),
    ],
)
def test_goodness_needs_every_objective(trace: RequestTrace, slo: Slo, good: bool) -> None:
    assert is_good(trace, slo) is good


def _hand_made() -> list[RequestTrace]:
    return [
        done("A", 11.0, 0.5, [0.1, 0.1, 0.2]),  # counted, good; chunks 11.5 11.6 11.7 11.9
        done("A", 12.0, 1.5, [0.1]),  # counted, TTFT over A's objective
        done("A", 9.6, 0.2, [0.25, 0.25]),  # counted (ends inside), good: chunks 9.8 10.05 10.3
        done("B", 10.0, 0.3, []),  # counted, one token, good
        done("B", 15.0, 1.0, [1.0] * 5),  # ends at 21: chunks 16 ... 21
        failed("A", 14.0, 14.2),  # counted as failed
        failed("B", 19.0, 20.5),  # ends after the window
        cancelled("A", 18.0, 20.0, [0.5, 0.5]),  # chunks 18.1 18.6 19.1
    ]


SLOS = {"A": Slo(ttft_ms=1000, e2el_ms=3000), "B": Slo(e2el_ms=5000, tpot_ms=10)}


def test_summary_of_hand_made_traces() -> None:
    figures = summarise(_hand_made(), WINDOW, SLOS)
    assert set(figures) == set(RESULT_FIELDS)
    assert figures["completed"] == 4
    assert figures["failed"] == 1
    assert figures["duration"] == 10.0
    assert figures["total_input_tokens"] == 40
    assert figures["total_output_tokens"] == 4 + 2 + 3 + 1
    assert figures["request_throughput"] == pytest.approx(0.4)
    assert figures["output_throughput"] == pytest.approx(1.0)
    assert figures["total_token_throughput"] == pytest.approx(5.0)
    assert figures["request_goodput"] == pytest.approx(0.3)
    assert figures["mean_ttft_ms"] == pytest.approx((500 + 1500 + 200 + 300) / 4)
    assert figures["median_ttft_ms"] == pytest.approx(400)
    assert figures["mean_tpot_ms"] == pytest.approx((400 / 3 + 100 + 250) / 3)
    itl_ms = [100, 100, 200, 100, 250, 250]
    assert figures["mean_itl_ms"] == pytest.approx(sum(itl_ms) / 6)
    assert figures["p99_itl_ms"] == pytest.approx(float(np.percentile(itl_ms, 99)))
    assert figures["median_e2el_ms"] == pytest.approx(800)
    assert figures["delivered_output_throughput"] == pytest.approx((4 + 2 + 2 + 1 + 5 + 3) / 10)


def test_summary_of_one_tenant() -> None:
    figures = summarise([t for t in _hand_made() if t.tenant == "B"], WINDOW, SLOS)
    assert figures["completed"] == 1
    assert figures["failed"] == 0
    assert figures["mean_tpot_ms"] is None  # its only request has one token
    assert figures["request_goodput"] == pytest.approx(0.1)
    assert figures["delivered_output_throughput"] == pytest.approx(0.6)


def test_a_tenant_without_objectives_has_no_goodput() -> None:
    figures = summarise([done("C", 11.0, 0.1, [0.1])], WINDOW, SLOS)
    assert figures["completed"] == 1
    assert figures["request_goodput"] == 0.0


def test_summary_of_nothing_has_zero_rates_and_no_latencies() -> None:
    figures = summarise([], WINDOW, SLOS)
    assert figures["completed"] == 0
    assert figures["output_throughput"] == 0.0
    assert figures["p99_e2el_ms"] is None


def test_chunks_inside_counts_the_straddling_part() -> None:
    assert chunks_inside(done("B", 15.0, 1.0, [1.0] * 5), WINDOW) == 5
    assert chunks_inside(failed("A", 12.0, 13.0), WINDOW) == 0


def test_failed_requests_bring_no_tokens() -> None:
    trace = failed("A", 12.0, 13.0)
    assert trace.status is RequestStatus.FAILED
    assert summarise([trace], WINDOW, SLOS)["total_output_tokens"] == 0


def test_mean_and_peak_of_samples_inside_the_window() -> None:
    points = [(9.0, 100.0), (10.0, 50.0), (15.0, None), (20.0, 70.0), (20.5, 99.0)]
    assert mean_and_peak(points, WINDOW) == (60.0, 70.0)
    assert mean_and_peak([(1.0, 5.0)], WINDOW) == (None, None)


def test_rate_of_a_counter_between_first_and_last_reading_inside() -> None:
    points = [(9.0, 0.0), (10.0, 100.0), (12.0, None), (15.0, 600.0), (21.0, 9999.0)]
    assert rate(points, WINDOW) == pytest.approx(100.0)
    assert rate([(12.0, 5.0)], WINDOW) is None


def test_ratio_is_none_without_a_denominator() -> None:
    assert ratio(3.0, 2.0) == 1.5
    assert ratio(3.0, 0) is None
    assert ratio(None, 2.0) is None
