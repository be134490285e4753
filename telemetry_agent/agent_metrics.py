"""The agent's own Prometheus metrics, in a registry of its own (one per agent instance)."""

from __future__ import annotations

from prometheus_client import CollectorRegistry, Counter, Gauge

from telemetry_agent.engine_scraper import SCRAPE_ERROR_REASONS


class AgentMetrics:
    """Counters and gauges that say whether the agent sees its engine and reaches the control
    plane."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry()
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
