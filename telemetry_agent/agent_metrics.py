"""The agent's own Prometheus metrics, in a registry of its own (one per agent instance)."""

from __future__ import annotations

from collections.abc import Callable, Iterator

from prometheus_client import CollectorRegistry, Counter, Gauge
from prometheus_client.core import GaugeMetricFamily
from prometheus_client.registry import Collector

from slotshift.v1 import telemetry_pb2
from telemetry_agent.engine_scraper import SCRAPE_ERROR_REASONS

LatestReport = Callable[[], telemetry_pb2.TelemetryReport | None]
"""Returns the report built most recently, if any."""


class AgentMetrics:
    """Counters and gauges that say whether the agent sees its engine and reaches the control
    plane; with `latest_report`, also the engine and GPU figures of the latest report."""

    def __init__(self, latest_report: LatestReport | None = None) -> None:
        self.registry = CollectorRegistry()
        if latest_report is not None:
            self.registry.register(_ReportCollector(latest_report))
        self.scrapes = Counter(
            "slotshift_agent_scrapes_total",
            "Scrapes of the engine's /metrics, successful or not.",
            registry=self.registry,
        )
        self.scrape_errors = Counter(
            "slotshift_agent_scrape_errors_total",
            "Scrapes of the engine's /metrics that failed, by reason.",
            ["reason"],
            registry=self.registry,
        )
        for reason in SCRAPE_ERROR_REASONS:
            # Present from the start at 0, so that rate() sees the first error.
            self.scrape_errors.labels(reason=reason)
        self.last_scrape_duration = Gauge(
            "slotshift_agent_last_scrape_duration_seconds",
            "How long the latest scrape of the engine's /metrics took.",
            registry=self.registry,
        )
        self.reports_sent = Counter(
            "slotshift_agent_reports_sent_total",
            "Telemetry reports written to the control plane's stream.",
            registry=self.registry,
        )
        self.reports_superseded = Counter(
            "slotshift_agent_reports_superseded_total",
            "Reports replaced by a newer one before they could be sent (control plane away).",
            registry=self.registry,
        )
        self.controlplane_connected = Gauge(
            "slotshift_agent_controlplane_connected",
            "1 while the telemetry stream to the control plane is open, else 0.",
            registry=self.registry,
        )
        self.gpu_available = Gauge(
            "slotshift_agent_gpu_available",
            "1 when the latest report carried GPU figures measured through NVML, else 0 "
            "(figures modelled by the engine emulator count as 0).",
            registry=self.registry,
        )


class _ReportCollector(Collector):
    """The figures of the latest report, read at scrape time; a figure the report lacks (failed
    scrape, no GPU) is absent rather than zero."""

    def __init__(self, latest_report: LatestReport) -> None:
        self._latest_report = latest_report

    def collect(self) -> Iterator[GaugeMetricFamily]:
        report = self._latest_report()
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
        if report is not None:
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
