"""The telemetry agent: every interval, for each engine it watches, scrape the engine, read its
GPUs, report; all in-process.

An agent watches one engine or several (one per pool on the node, `agent.engines`). Per engine,
two supervised tasks run side by side: its sampler builds one report per interval, with that
engine's figures and its own GPUs' only, and publishes it; its stream carries the newest report
to the control plane, reconnecting on its own. Nothing is shared between engines but the NVML
reading (one reading of every GPU, from which each engine takes its own) and the HTTP server that
exposes the agent's metrics, so a failing scrape or a lost stream of one engine never holds up
another's reports. Sampling never waits for the control plane, so the first report after an
outage is a fresh one.
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
from slotshift.config import AgentConfig, AgentEngineConfig
from slotshift.v1 import telemetry_pb2
from telemetry_agent.agent_metrics import AgentMetrics, EngineMetrics
from telemetry_agent.engine_scraper import EngineScraper
from telemetry_agent.gpu import GpuMonitor, GpuReader, PynvmlReader
from telemetry_agent.gpu_selection import EngineGpus
from telemetry_agent.http_server import AgentHttpServer
from telemetry_agent.report import build_report
from telemetry_agent.report_stream import TelemetryStream

logger = logging.getLogger(__name__)

_STREAM_CLOSE_TIMEOUT_S = 2.0
"""Seconds the streams get to end cleanly on stop before they are cancelled."""


class _WatchedEngine:
    """One engine's parts: its scraper, its GPUs, its stream, its series and its latest report."""

    def __init__(
        self,
        engine: AgentEngineConfig,
        config: AgentConfig,
        *,
        clock: Clock,
        metrics: EngineMetrics,
        rng: random.Random | None,
        tracer: trace.Tracer,
    ) -> None:
        self.config = engine
        self.pool = engine.pool
        self.metrics = metrics
        self.scraper = EngineScraper(
            engine.metrics_url,
            timeout_s=config.scrape_timeout_s,
            clock=clock,
            tls=engine.metrics_tls,
        )
        self.gpus = EngineGpus(engine)
        self.stream = TelemetryStream(
            config.controlplane_target,
            pool=engine.pool,
            reconnect_initial_s=config.reconnect_initial_s,
            reconnect_max_s=config.reconnect_max_s,
            clock=clock,
            metrics=metrics,
            rng=rng,
            tracer=tracer,
            tls=config.controlplane_tls,
            token_file=config.controlplane_token_file,
        )
        self.last_report: telemetry_pb2.TelemetryReport | None = None

    def health(self) -> dict[str, object]:
        report = self.last_report
        return {
            "pool": self.pool,
            "metrics_url": self.config.metrics_url,
            "gpus": self.gpus.described,
            "controlplane_connected": self.stream.connected,
            "engine_scrape_ok": report is not None and report.engine.scrape_ok,
            "gpu_source": (
                telemetry_pb2.GpuSource.Name(report.gpu_source) if report is not None else None
            ),
        }


class TelemetryAgent:
    """One agent watching the engines of config.watched_engines, each for its own pool.
    start() then stop(); start on port 0 in tests.

    agent_id overrides the configured one; with neither, the host name is used. gpu_reader
    replaces NVML (tests pass a fake); clock and rng make time and jitter reproducible.
    tracer_provider: where the spans of its streams go (each report sent); no-op by default.
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
        self.metrics = AgentMetrics(latest_reports=self._latest_reports)
        provider = tracer_provider if tracer_provider is not None else trace.NoOpTracerProvider()
        tracer = provider.get_tracer("slotshift.telemetry_agent")
        self._engines = [
            _WatchedEngine(
                engine,
                config,
                clock=self._clock,
                metrics=self.metrics.engine(engine.pool),
                rng=rng,
                tracer=tracer,
            )
            for engine in config.watched_engines
        ]
        self._gpus = GpuMonitor(gpu_reader or PynvmlReader())
        self._http = AgentHttpServer(
            self.metrics.registry,
            self._health,
            host=config.host,
            port=config.metrics_port,
            token_file=config.metrics_token_file,
        )
        self._supervisor = Supervisor(f"telemetry_agent[{self.agent_id}]")
        self._serving = False

    @property
    def pools(self) -> tuple[str, ...]:
        """The pools of the engines watched, in config order."""
        return tuple(engine.pool for engine in self._engines)

    @property
    def last_reports(self) -> Mapping[str, telemetry_pb2.TelemetryReport]:
        """Per pool, the report built most recently for its engine (sent or not); a pool whose
        engine has not been sampled yet is absent."""
        return {
            engine.pool: engine.last_report
            for engine in self._engines
            if engine.last_report is not None
        }

    def _latest_reports(self) -> list[telemetry_pb2.TelemetryReport]:
        # Read at each scrape of the agent's /metrics.
        return list(self.last_reports.values())

    @property
    def metrics_port(self) -> int:
        """The port of /metrics and /health, once started."""
        if self._http.bound_port is None:
            raise RuntimeError("the agent has not started")
        return self._http.bound_port

    @property
    def controlplane_connected(self) -> bool:
        """Whether every engine's telemetry stream is open now."""
        return all(engine.stream.connected for engine in self._engines)

    def stream_connected(self, pool: str) -> bool:
        """Whether the telemetry stream of the engine of `pool` is open now; KeyError for a pool
        this agent does not watch."""
        return self._engine(pool).stream.connected

    async def start(self) -> None:
        """Open the HTTP endpoint, then start sampling and streaming, two tasks per engine.
        A start that fails (OSError: the port; ConfigError: the metrics token's file) closes
        what it opened and raises."""
        for engine in self._engines:
            await engine.stream.load_credentials()
        for engine in self._engines:
            await engine.scraper.open()
        try:
            await self._http.start()
        except BaseException:
            # The scrapers' HTTP sessions are open: a failed start must not leave them behind.
            await self._close_scrapers()
            raise
        self._serving = True
        for engine in self._engines:
            self._supervisor.spawn(f"stream[{engine.pool}]", engine.stream.run())
            self._supervisor.spawn(f"sampler[{engine.pool}]", self._sample_forever(engine))

    async def stop(self) -> None:
        """Stop sampling, end the streams cleanly, release NVML and the HTTP endpoint."""
        self._serving = False
        self._supervisor.begin_stop()
        await asyncio.gather(
            *(engine.stream.finish(_STREAM_CLOSE_TIMEOUT_S) for engine in self._engines)
        )
        await self._supervisor.stop()
        await self._close_scrapers()
        await self._gpus.close()
        await self._http.stop()

    async def sample_once(self, pool: str) -> telemetry_pb2.TelemetryReport:
        """Scrape the engine of `pool`, read its GPUs, build its report, publish it to its
        stream, and return it; KeyError for a pool this agent does not watch."""
        return await self._sample(self._engine(pool))

    def _engine(self, pool: str) -> _WatchedEngine:
        for engine in self._engines:
            if engine.pool == pool:
                return engine
        raise KeyError(pool)

    async def _close_scrapers(self) -> None:
        for engine in self._engines:
            await engine.scraper.close()

    async def _sample(self, engine: _WatchedEngine) -> telemetry_pb2.TelemetryReport:
        observed_at_s = self._clock.wall()
        scrape = await engine.scraper.scrape()
        engine.metrics.scrapes.inc()
        engine.metrics.last_scrape_duration.set(scrape.duration_s)
        if scrape.error_reason is not None:
            engine.metrics.scrape_errors(scrape.error_reason).inc()
        gpu = await engine.gpus.select(await self._gpus.read())
        engine.metrics.gpu_available.set(1 if gpu.available else 0)
        report = build_report(
            pool=engine.pool,
            agent_id=self.agent_id,
            observed_at_s=observed_at_s,
            gpu=gpu,
            engine=scrape,
        )
        engine.last_report = report
        engine.stream.publish(report)
        return report

    async def _sample_forever(self, engine: _WatchedEngine) -> None:
        while True:
            started = self._clock.monotonic()
            await self._sample(engine)
            elapsed_s = self._clock.monotonic() - started
            await asyncio.sleep(max(0.0, self._config.interval_s - elapsed_s))

    def _health(self) -> tuple[bool, Mapping[str, object]]:
        return self._serving, {
            "agent_id": self.agent_id,
            "controlplane_connected": self.controlplane_connected,
            "engines": [engine.health() for engine in self._engines],
        }
