"""The benchmark's statistics: pure functions over request traces, under `vllm bench serve`'s names.

Definitions (each as vllm/benchmarks/serve.py computes it, unless said otherwise):

- Windowing: a request counts when it ENDS inside the steady window (client-side times), the
  study's "completed in the window", wherever it started (the warm-up is there so that the
  first requests to end in the window ran under steady load); requests cancelled when the load
  stopped never count. Every throughput divides by the window's length (`duration`). vLLM
  counts every request of the run and divides by the run's wall time, which no steady window
  allows. Counting by end alone keeps the throughput unbiased: asking that a request also START
  inside the window would leave out, in every run, the whole population a closed loop has
  outstanding at the window's start, a fixed number that inflates every ratio between runs.
- completed / failed: counted requests that finished in full / failed.
- request_throughput = completed / duration; output_throughput = output tokens of completed
  requests / duration; total_token_throughput = (their prompt + output tokens) / duration.
- TTFT: first chunk with output text minus sending. E2EL: last byte minus sending.
  ITL: every gap between consecutive output chunks after the first, pooled over requests.
  TPOT = (E2EL - TTFT) / (output tokens - 1), for requests with more than one output token.
- request_goodput = completed requests that meet every SLO of their tenant / duration; a request
  with a single output token meets any TPOT objective (vLLM counts its TPOT as 0).
- delivered_output_throughput (not a vLLM field): text chunks received inside the window by
  every request, whether or not it ended there, per second of the window: the tokens of
  requests still running at the window's end count too.
- Percentiles: numpy's default method ('linear'): for n sorted values x and q in [0, 100],
  h = (n - 1) q / 100 and the result is x[floor h] + (h - floor h)(x[floor h + 1] - x[floor h]).
  The median is the 50th percentile; std is the population standard deviation (numpy's ddof=0).
  A statistic of no values is None (null in JSON), never 0.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Protocol

from slotshift_tools.bench.trace import RequestStatus, RequestTrace

LATENCY_METRICS = ("ttft", "tpot", "itl", "e2el")
"""The latencies reported, in milliseconds."""

LATENCY_STATISTICS = ("mean", "median", "std", "p90", "p99")
"""The statistics of each latency."""

LATENCY_FIELDS = tuple(f"{s}_{m}_ms" for m in LATENCY_METRICS for s in LATENCY_STATISTICS)
"""`mean_ttft_ms`, `median_ttft_ms`, ... `p99_e2el_ms`."""

THROUGHPUT_FIELDS = (
    "completed",
    "failed",
    "duration",
    "total_input_tokens",
    "total_output_tokens",
    "request_throughput",
    "request_goodput",
    "output_throughput",
    "total_token_throughput",
)
"""Counts, the window's length in seconds, and rates per second."""

EXTRA_FIELDS = ("delivered_output_throughput",)
"""Figures of ours, not vLLM's (see the module's doc)."""

RESULT_FIELDS = THROUGHPUT_FIELDS + LATENCY_FIELDS + EXTRA_FIELDS
"""Every field summarise() returns, in `vllm bench serve`'s names."""

Figure = float | int | None


class SloLike(Protocol):
    """A tenant's objectives in milliseconds; None: no objective on that latency."""

    @property
    def ttft_ms(self) -> float | None: ...

    @property
    def tpot_ms(self) -> float | None: ...

    @property
    def e2el_ms(self) -> float | None: ...


@dataclass(frozen=True)
class Window:
    """The steady window, in seconds from the start of the load."""

    start_s: float
    end_s: float

    def __post_init__(self) -> None:
        if self.end_s <= self.start_s:
            raise ValueError(f"empty window [{self.start_s}, {self.end_s}]")

    @property
    def length_s(self) -> float:
        return self.end_s - self.start_s

    def counts(self, trace: RequestTrace) -> bool:
        """Whether the request ended inside the window (see the module's doc)."""
        return (
            trace.status in (RequestStatus.OK, RequestStatus.FAILED)
            and trace.end_s is not None
            and self.holds(trace.end_s)
        )

    def holds(self, t_s: float) -> bool:
        """Whether an instant (a sample's time) lies in the window, both ends included."""
        return self.start_s <= t_s <= self.end_s


def percentile(values: Sequence[float], q: float) -> float:
    """The q-th percentile (0 to 100) by numpy's default 'linear' method; ValueError if empty."""
    return _sorted_percentile(sorted(values), q)


def _sorted_percentile(ordered: Sequence[float], q: float) -> float:
    if not ordered:
        raise ValueError("percentile of no values")
    if not 0.0 <= q <= 100.0:
        raise ValueError(f"percentile {q} is outside [0, 100]")
    h = (len(ordered) - 1) * q / 100.0
    below = math.floor(h)
    above = min(below + 1, len(ordered) - 1)
    fraction = h - below
    return ordered[below] + fraction * (ordered[above] - ordered[below])


def describe_ms(values_s: Iterable[float], metric: str) -> dict[str, float | None]:
    """mean, median, std, p90 and p99 of latencies given in seconds, in milliseconds, under the
    names `<statistic>_<metric>_ms`; None each when there are no values."""
    ordered = sorted(v * 1000.0 for v in values_s)
    names = [f"{s}_{metric}_ms" for s in LATENCY_STATISTICS]
    if not ordered:
        return dict.fromkeys(names, None)
    mean = math.fsum(ordered) / len(ordered)
    variance = math.fsum((v - mean) ** 2 for v in ordered) / len(ordered)
    figures = (
        mean,
        _sorted_percentile(ordered, 50.0),
        math.sqrt(variance),
        _sorted_percentile(ordered, 90.0),
        _sorted_percentile(ordered, 99.0),
    )
    return dict(zip(names, figures, strict=True))


def tpot_s(trace: RequestTrace) -> float | None:
    """Time per output token after the first; None for one output token or no first token."""
    ttft = trace.ttft_s
    e2el = trace.e2el_s
    if ttft is None or e2el is None or trace.output_tokens < 2:
        return None
    return (e2el - ttft) / (trace.output_tokens - 1)


def is_good(trace: RequestTrace, slo: SloLike) -> bool:
    """Whether a request completed and met every objective set."""
    if trace.status is not RequestStatus.OK:
        return False
    ttft = trace.ttft_s
    e2el = trace.e2el_s
    if slo.ttft_ms is not None and (ttft is None or ttft * 1000.0 > slo.ttft_ms):
        return False
    if slo.e2el_ms is not None and (e2el is None or e2el * 1000.0 > slo.e2el_ms):
        return False
    tpot = tpot_s(trace)
    # As vLLM: a request without a TPOT (one output token) counts as TPOT 0.
    return not (slo.tpot_ms is not None and tpot is not None and tpot * 1000.0 > slo.tpot_ms)


def windowed(traces: Iterable[RequestTrace], window: Window) -> list[RequestTrace]:
    """The requests that count (see Window.counts)."""
    return [t for t in traces if window.counts(t)]


def summarise(
    traces: Iterable[RequestTrace], window: Window, slos: Mapping[str, SloLike]
) -> dict[str, Figure]:
    """Every RESULT_FIELDS figure over the requests that count in the window.

    slos: each tenant's objectives, by the trace's tenant; a tenant missing here has no good
    requests.
    """
    traces = list(traces)
    counted = windowed(traces, window)
    completed = [t for t in counted if t.status is RequestStatus.OK]
    failed = len(counted) - len(completed)
    duration = window.length_s
    input_tokens = sum(t.prompt_tokens for t in completed)
    output_tokens = sum(t.output_tokens for t in completed)
    good = sum(1 for t in completed if t.tenant in slos and is_good(t, slos[t.tenant]))
    result: dict[str, Figure] = {
        "completed": len(completed),
        "failed": failed,
        "duration": duration,
        "total_input_tokens": input_tokens,
        "total_output_tokens": output_tokens,
        "request_throughput": len(completed) / duration,
        "request_goodput": good / duration,
        "output_throughput": output_tokens / duration,
        "total_token_throughput": (input_tokens + output_tokens) / duration,
    }
    latencies: dict[str, list[float]] = {
        "ttft": [v for t in completed if (v := t.ttft_s) is not None],
        "tpot": [v for t in completed if (v := tpot_s(t)) is not None],
        "itl": [gap for t in completed for gap in t.itl_s],
        "e2el": [v for t in completed if (v := t.e2el_s) is not None],
    }
    for metric in LATENCY_METRICS:
        result.update(describe_ms(latencies[metric], metric))
    delivered = sum(chunks_inside(t, window) for t in traces)
    result["delivered_output_throughput"] = delivered / duration
    return result


def chunk_times_s(trace: RequestTrace) -> list[float]:
    """When each text chunk of a request arrived (the first, then one per ITL gap)."""
    if trace.first_token_s is None:
        return []
    times = [trace.first_token_s]
    for gap in trace.itl_s:
        times.append(times[-1] + gap)
    return times


def chunks_inside(trace: RequestTrace, window: Window) -> int:
    """Text chunks of a request that arrived inside the window."""
    return sum(1 for t in chunk_times_s(trace) if window.holds(t))


def mean_and_peak(
    points: Iterable[tuple[float, float | None]], window: Window
) -> tuple[float | None, float | None]:
    """Mean and maximum of sampled (time, value) points inside the window; values that are None
    (no reading) are skipped; (None, None) when nothing is left."""
    values = [v for t, v in points if v is not None and window.holds(t)]
    if not values:
        return None, None
    return math.fsum(values) / len(values), max(values)


def rate(points: Iterable[tuple[float, float | None]], window: Window) -> float | None:
    """The mean rate of a counter sampled as (time, value) points: its increase between the
    first and the last reading inside the window over the time between them; None with fewer
    than two readings."""
    inside = [(t, v) for t, v in points if v is not None and window.holds(t)]
    if len(inside) < 2 or inside[-1][0] <= inside[0][0]:
        return None
    (t0, v0), (t1, v1) = inside[0], inside[-1]
    return (v1 - v0) / (t1 - t0)


def ratio(numerator: Figure, denominator: Figure) -> float | None:
    """numerator / denominator; None when either is missing or the denominator is 0."""
    if numerator is None or denominator is None or denominator == 0:
        return None
    return numerator / denominator
