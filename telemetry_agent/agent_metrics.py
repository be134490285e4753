"""The agent's own Prometheus metrics, in a registry of its own (one per agent instance).

Every series carries the `pool` of the engine it is about: an agent may watch several engines,
and their figures are never summed or averaged into one series here.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from slotshift.v1 import telemetry_pb2
from telemetry_agent.engine_scraper import SCRAPE_ERROR_REASONS

LatestReports = Callable[[], Iterable[telemetry_pb2.TelemetryReport]]
"""Returns the report built most recently for each engine that has one."""


@dataclass(frozen=True)
class EngineMetrics:
    """One engine's series (the children for its pool): what its sampler and stream update."""

    scrapes: Counter
    scrape_errors: Callable[[str], Counter]
    """The error counter of one reason (one of SCRAPE_ERROR_REASONS)."""
    last_scrape_duration: Gauge
    reports_sent: Counter
    reports_superseded: Counter
    controlplane_connected: Gauge
    gpu_available: Gauge


class AgentMetrics:
    """Counters and gauges that say, per engine (label `pool`), whether the agent sees it and
    reaches the control plane for it; with `latest_reports`, also the engine and GPU figures of
    each engine's latest report."""

    def __init__(self, latest_reports: LatestReports | None = None) -> None:
        self.registry = CollectorRegistry()
        if latest_reports is not None:
            self.registry.register(_ReportCollector(latest_reports))
        self._scrapes = Counter(
            "slotshift_agent_scrapes_total",
            "Scrapes of the engine's /metrics, successful or not.",
            ["pool"],
            registry=self.registry,
        )
        self._scrape_errors = Counter(
            "slotshift_agent_scrape_errors_total",
            "Scrapes of the engine's /metrics that failed, by reason.",
            ["pool", "reason"],
            registry=self.registry,
        )
        self._last_scrape_duration = Gauge(
            "slotshift_agent_last_scrape_duration_seconds",
            "How long the latest scrape of the engine's /metrics took.",
            ["pool"],
            registry=self.registry,
        )
        self._reports_sent = Counter(
            "slotshift_agent_reports_sent_total",
            "Telemetry reports written to the control plane's stream.",
            ["pool"],
            registry=self.registry,
        )
        self._reports_superseded = Counter(
            "slotshift_agent_reports_superseded_total",
            "Reports replaced by a newer one before they could be sent (control plane away).",
            ["pool"],
            registry=self.registry,
        )
        self._controlplane_connected = Gauge(
            "slotshift_agent_controlplane_connected",
            "1 while the engine's telemetry stream to the control plane is open, else 0.",
            ["pool"],
            registry=self.registry,
        )
        self._gpu_available = Gauge(
            "slotshift_agent_gpu_available",
            "1 when the engine's latest report carried GPU figures measured through NVML, else 0 "
            "(figures modelled by the engine emulator count as 0).",
            ["pool"],
            registry=self.registry,
        )

    def engine(self, pool: str) -> EngineMetrics:
        """The series of the engine of `pool`, created at 0 (so that rate() sees the first
        error and the first report)."""
        errors = {
            reason: self._scrape_errors.labels(pool=pool, reason=reason)
            for reason in SCRAPE_ERROR_REASONS
        }
        return EngineMetrics(
            scrapes=self._scrapes.labels(pool=pool),
            scrape_errors=errors.__getitem__,
            last_scrape_duration=self._last_scrape_duration.labels(pool=pool),
            reports_sent=self._reports_sent.labels(pool=pool),
            reports_superseded=self._reports_superseded.labels(pool=pool),
            controlplane_connected=self._controlplane_connected.labels(pool=pool),
            gpu_available=self._gpu_available.labels(pool=pool),
        )


class _ReportCollector(Collector):
    """The figures of each engine's latest report, read at scrape time; a figure a report lacks
    (failed scrape, no GPU) is absent rather than zero."""

    def __init__(self, latest_reports: LatestReports) -> None:
        self._latest_reports = latest_reports

    def collect(self) -> Iterator[GaugeMetricFamily]:
        running = GaugeMetricFamily(
            "slotshift_agent_engine_requests_running",
            "Requests in the engine's running batch (vllm:num_requests_running), last scrape.",
            labels=["pool"],
        )
        waiting = GaugeMetricFamily(
            "slotshift_agent_engine_requests_waiting",
            "Requests queued inside the engine (vllm:num_requests_waiting), last scrape.",
            labels=["pool"],
        )
        kv_cache = GaugeMetricFamily(
            "slotshift_agent_engine_kv_cache_usage_ratio",
            "Fraction of the engine's KV cache in use (vllm:kv_cache_usage_perc), last scrape.",
            labels=["pool"],
        )
        utilization = GaugeMetricFamily(
            "slotshift_agent_gpu_utilization_ratio",
            "GPU utilisation, 0 to 1, from NVML (or the emulator's model), last reading.",
            labels=["pool", "gpu"],
        )
        memory_used = GaugeMetricFamily(
            "slotshift_agent_gpu_memory_used_bytes",
            "GPU memory in use, last reading.",
            labels=["pool", "gpu"],
        )
        memory_total = GaugeMetricFamily(
            "slotshift_agent_gpu_memory_total_bytes",
            "GPU memory in all, last reading.",
            labels=["pool", "gpu"],
        )
        for report in self._latest_reports():
            engine = report.engine
            pool = report.pool
            if engine.scrape_ok:
                running.add_metric([pool], engine.num_requests_running)
                waiting.add_metric([pool], engine.num_requests_waiting)
                kv_cache.add_metric([pool], engine.kv_cache_usage_perc)
            for gpu in report.gpus:
                labels = [pool, str(gpu.index)]
                utilization.add_metric(labels, gpu.utilization_pct / 100)
                memory_used.add_metric(labels, gpu.memory_used_bytes)
                memory_total.add_metric(labels, gpu.memory_total_bytes)
        yield from (running, waiting, kv_cache, utilization, memory_used, memory_total)
