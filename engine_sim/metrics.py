"""The emulator's Prometheus metrics: vLLM V1's names, types, help texts, labels and buckets.

Names and buckets follow vllm/v1/metrics/loggers.py (PrometheusStatLogger). prometheus_client
appends `_total` to counter samples, so counters are declared without it, exactly as vLLM declares
them, and expose `vllm:prompt_tokens_total` etc. The `slotshift_sim_gpu_*` gauges stand in for the
NVML readings an emulated engine has no GPU for; their help texts say they are emulated. The
`slotshift_engine_*` series are the emulator's own witnesses, which vLLM has no metric for: the
high-water mark of requests inside the engine (the budget, checked exactly) and aborted requests
(vLLM 0.32 counts an abort in no metric).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, generate_latest

from engine_sim.engine_core import FinishedRequest, FinishReason, ScheduledStep, StepOutcome

ENGINE_INDEX = "0"
"""The `engine` label of a single-engine (no data parallelism) vLLM server."""

TTFT_BUCKETS_S = (
    0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0,
    20.0, 40.0, 80.0, 160.0, 640.0, 2560.0,
)  # fmt: skip
INTER_TOKEN_LATENCY_BUCKETS_S = (
    0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0,
    40.0, 80.0,
)  # fmt: skip
REQUEST_LATENCY_BUCKETS_S = (
    0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0, 40.0, 50.0, 60.0, 120.0,
    240.0, 480.0, 960.0, 1920.0, 7680.0,
)  # fmt: skip


PEAK_IN_ENGINE = "slotshift_engine_peak_requests"
"""The gauge of the high-water mark of requests inside the engine."""

ABORTED_REQUESTS = "slotshift_engine_aborted_requests"
"""The counter of aborted requests (a scrape shows it with `_total`)."""


@dataclass(frozen=True)
class LiveReadings:
    """Functions the gauges read at scrape time, so a scrape always sees the current state."""

    num_running: Callable[[], float]
    num_waiting: Callable[[], float]
    kv_cache_usage: Callable[[], float]
    """0 to 1."""
    gpu_utilization_percent: Callable[[], float]
    gpu_memory_used_bytes: Callable[[], float]
    gpu_memory_total_bytes: Callable[[], float]
    peak_in_engine: Callable[[], float]
    """The high-water mark of requests running plus waiting (EngineCore.peak_in_engine)."""


class EngineMetrics:
    """One emulated engine's metrics, in a registry of its own."""

    def __init__(self, model_name: str, live: LiveReadings) -> None:
        self.registry = CollectorRegistry()
        labelnames = ["model_name", "engine"]
        labels = (model_name, ENGINE_INDEX)

        def gauge(name: str, documentation: str, read: Callable[[], float]) -> None:
            Gauge(name, documentation, labelnames, registry=self.registry).labels(
                *labels
            ).set_function(read)

        gauge(
            "vllm:num_requests_running",
            "Number of requests in model execution batches.",
            live.num_running,
        )
        gauge(
            "vllm:num_requests_waiting",
            "Number of requests waiting to be processed.",
            live.num_waiting,
        )
        gauge(
            "vllm:kv_cache_usage_perc",
            "KV-cache usage. 1 means 100 percent usage.",
            live.kv_cache_usage,
        )
        gauge(
            "slotshift_sim_gpu_utilization_percent",
            "Emulated GPU utilization in percent: share of recent wall time the emulated engine "
            "spent in steps (no real GPU is measured).",
            live.gpu_utilization_percent,
        )
        gauge(
            "slotshift_sim_gpu_memory_used_bytes",
            "Emulated GPU memory in use: model weights plus KV-cache blocks in use "
            "(no real GPU is measured).",
            live.gpu_memory_used_bytes,
        )
        gauge(
            "slotshift_sim_gpu_memory_total_bytes",
            "Emulated GPU memory capacity (no real GPU is measured).",
            live.gpu_memory_total_bytes,
        )
        gauge(
            PEAK_IN_ENGINE,
            "Most requests inside the engine (running plus waiting) at once, taken at every "
            "request's arrival and every step's schedule, since start or the last "
            "POST /sim/reset-peak.",
            live.peak_in_engine,
        )

        def counter(name: str, documentation: str) -> Counter:
            return Counter(name, documentation, labelnames, registry=self.registry).labels(*labels)

        self._preemptions = counter(
            "vllm:num_preemptions", "Cumulative number of preemption from the engine."
        )
        self._prompt_tokens = counter("vllm:prompt_tokens", "Number of prefill tokens processed.")
        self._generation_tokens = counter(
            "vllm:generation_tokens", "Number of generation tokens processed."
        )
        self._prefix_cache_queries = counter(
            "vllm:prefix_cache_queries",
            "Prefix cache queries, in terms of number of queried tokens.",
        )
        self._prefix_cache_hits = counter(
            "vllm:prefix_cache_hits", "Prefix cache hits, in terms of number of cached tokens."
        )
        self._aborted = counter(
            ABORTED_REQUESTS,
            "Requests aborted inside the engine: their client went away (a paused request "
            "included) or the emulator stopped.",
        )
        success = Counter(
            "vllm:request_success",
            "Count of successfully processed requests.",
            [*labelnames, "finished_reason"],
            registry=self.registry,
        )
        # Every reason is exposed from the start (at 0), as vLLM does.
        self._success = {reason: success.labels(*labels, reason.value) for reason in FinishReason}

        def histogram(name: str, documentation: str, buckets: tuple[float, ...]) -> Histogram:
            return Histogram(
                name, documentation, labelnames, registry=self.registry, buckets=buckets
            ).labels(*labels)

        self._ttft = histogram(
            "vllm:time_to_first_token_seconds",
            "Histogram of time to first token in seconds.",
            TTFT_BUCKETS_S,
        )
        self._inter_token_latency = histogram(
            "vllm:inter_token_latency_seconds",
            "Histogram of inter-token latency in seconds.",
            INTER_TOKEN_LATENCY_BUCKETS_S,
        )
        self._e2e = histogram(
            "vllm:e2e_request_latency_seconds",
            "Histogram of e2e request latency in seconds.",
            REQUEST_LATENCY_BUCKETS_S,
        )
        self._queue_time = histogram(
            "vllm:request_queue_time_seconds",
            "Histogram of time spent in WAITING phase for request.",
            REQUEST_LATENCY_BUCKETS_S,
        )

    def record_schedule(self, step: ScheduledStep) -> None:
        """Count a scheduled step's preemptions and prefix-cache lookups."""
        if step.preemptions:
            self._preemptions.inc(step.preemptions)
        if step.prefix_cache_queries:
            self._prefix_cache_queries.inc(step.prefix_cache_queries)
        if step.prefix_cache_hits:
            self._prefix_cache_hits.inc(step.prefix_cache_hits)

    def record_abort(self) -> None:
        """Count a request aborted inside the engine (in no vLLM metric: see AsyncEngine.abort)."""
        self._aborted.inc()

    def record_step(self, outcome: StepOutcome) -> None:
        """Count a completed step's tokens and finished requests."""
        if outcome.prompt_tokens:
            self._prompt_tokens.inc(outcome.prompt_tokens)
        if outcome.tokens:
            self._generation_tokens.inc(len(outcome.tokens))
        for token in outcome.tokens:
            if token.index == 0:
                self._ttft.observe(token.interval_s)
            else:
                self._inter_token_latency.observe(token.interval_s)
        for finished in outcome.finished:
            self._record_finished(finished)

    def _record_finished(self, finished: FinishedRequest) -> None:
        """Count a request that ran to its end (stop or length)."""
        self._success[finished.reason].inc()
        self._e2e.observe(finished.e2e_s)
        if finished.queued_s is not None:  # typed optional; set for every request that ran
            self._queue_time.observe(finished.queued_s)

    def exposition(self) -> bytes:
        """The text format a scrape returns."""
        return generate_latest(self.registry)
