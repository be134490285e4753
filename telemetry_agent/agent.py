"""The telemetry agent: every interval, scrape the engine, read the GPUs, report; all in-process.

Three parts run side by side: the sampler (a supervised task) builds one report per interval
and publishes it; the stream (another task) carries the newest report to the control plane,
reconnecting on its own; the HTTP server exposes the agent's metrics. Sampling never waits for
the control plane, so the first report after an outage is a fresh one.
"""

from __future__ import annotations

import asyncio
import logging
import random
import socket
from collections.abc import Mapping

from opentelemetry import trace

from slotshift.aiotasks import Supervisor
from slotshift.clock import Clock, SystemClock
from slotshift.config import AgentConfig
from slotshift.v1 import telemetry_pb2
from telemetry_agent.agent_metrics import AgentMetrics
from telemetry_agent.engine_scraper import EngineScraper
from telemetry_agent.gpu import GpuMonitor, GpuReader, PynvmlReader
from telemetry_agent.http_server import AgentHttpServer
from telemetry_agent.report import build_report
from telemetry_agent.report_stream import TelemetryStream

logger = logging.getLogger(__name__)

_STREAM_CLOSE_TIMEOUT_S = 2.0
"""Seconds the stream gets to end cleanly on stop before it is cancelled."""


class TelemetryAgent:
    """One agent watching one engine for one pool. start() then stop(); start on port 0 in tests.

    agent_id overrides the configured one; with neither, the host name is used. gpu_reader
    replaces NVML (tests pass a fake); clock and rng make time and jitter reproducible.
    tracer_provider: where the spans of its stream go (each report sent); no-op by default.
    """

    def __init__(
        self,
        config: AgentConfig,
        *,
        agent_id: str | None = None,
        gpu_reader: GpuReader | None = None,
        clock: Clock | None = None,
        rng: random.Random | None = None,
        tracer_provider: trace.TracerProvider | None = None,
    ) -> None:
        self._config = config
        self.agent_id = agent_id or config.agent_id or socket.gethostname()
        self._clock: Clock = clock or SystemClock()
        self.last_report: telemetry_pb2.TelemetryReport | None = None
        """The report built most recently (sent or not)."""
        self.metrics = AgentMetrics(latest_report=lambda: self.last_report)
        provider = tracer_provider if tracer_provider is not None else trace.NoOpTracerProvider()
        self._scraper = EngineScraper(
            config.engine_metrics_url, timeout_s=config.scrape_timeout_s, clock=self._clock
        )
        self._gpus = GpuMonitor(gpu_reader or PynvmlReader())
        self._stream = TelemetryStream(
            config.controlplane_target,
            reconnect_initial_s=config.reconnect_initial_s,
            reconnect_max_s=config.reconnect_max_s,
            clock=self._clock,
            metrics=self.metrics,
            rng=rng,
            tracer=provider.get_tracer("slotshift.telemetry_agent"),
            tls=config.controlplane_tls,
        )
        self._http = AgentHttpServer(
            self.metrics.registry, self._health, host=config.host, port=config.metrics_port
        )
        self._supervisor = Supervisor(f"telemetry_agent[{self.agent_id}]")
        self._serving = False

    @property
    def metrics_port(self) -> int:
        """The port of /metrics and /health, once started."""
        if self._http.bound_port is None:
            raise RuntimeError("the agent has not started")
        return self._http.bound_port

    @property
    def controlplane_connected(self) -> bool:
        """Whether the telemetry stream is open now."""
        return self._stream.connected

    async def start(self) -> None:
        """Open the HTTP endpoint, then start sampling and streaming."""
        await self._stream.load_credentials()
        await self._scraper.open()
        try:
            await self._http.start()
        except OSError:
            await self._scraper.close()
            raise
        self._serving = True
        self._supervisor.spawn("stream", self._stream.run())
        self._supervisor.spawn("sampler", self._sample_forever())

    async def stop(self) -> None:
        """Stop sampling, end the stream cleanly, release NVML and the HTTP endpoint."""
        self._serving = False
        self._supervisor.begin_stop()
        await self._stream.finish(_STREAM_CLOSE_TIMEOUT_S)
        await self._supervisor.stop()
        await self._scraper.close()
        await self._gpus.close()
        await self._http.stop()

    async def _sample_once(self) -> telemetry_pb2.TelemetryReport:
        """Scrape, read the GPUs, build the report, publish it to the stream, and return it."""
        observed_at_s = self._clock.wall()
        engine = await self._scraper.scrape()
        self.metrics.scrapes.inc()
        self.metrics.last_scrape_duration.set(engine.duration_s)
        if engine.error_reason is not None:
            self.metrics.scrape_errors.labels(reason=engine.error_reason).inc()
        gpu = await self._gpus.read()
        self.metrics.gpu_available.set(1 if gpu.available else 0)
        report = build_report(
            pool=self._config.pool,
            agent_id=self.agent_id,
            observed_at_s=observed_at_s,
            gpu=gpu,
            engine=engine,
        )
        self.last_report = report
        self._stream.publish(report)
        return report

    async def _sample_forever(self) -> None:
        while True:
            started = self._clock.monotonic()
            await self._sample_once()
            elapsed_s = self._clock.monotonic() - started
            await asyncio.sleep(max(0.0, self._config.interval_s - elapsed_s))

    def _health(self) -> tuple[bool, Mapping[str, object]]:
        report = self.last_report
        return self._serving, {
            "pool": self._config.pool,
            "agent_id": self.agent_id,
            "controlplane_connected": self._stream.connected,
            "engine_scrape_ok": report is not None and report.engine.scrape_ok,
            "gpu_source": (
                telemetry_pb2.GpuSource.Name(report.gpu_source) if report is not None else None
            ),
        }
