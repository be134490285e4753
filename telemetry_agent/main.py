"""Entry point of the telemetry agent service (the CLI calls run())."""

from __future__ import annotations

import asyncio
import logging

from slotshift.config import AgentEngineConfig, ConfigError, SlotshiftConfig
from slotshift.tracing import tracing_from_environment
from telemetry_agent.agent import TelemetryAgent

logger = logging.getLogger(__name__)

SERVICE_NAME = "slotshift-agent"
"""The service name its spans carry unless OTEL_SERVICE_NAME says otherwise."""


async def run(config: SlotshiftConfig, stop: asyncio.Event, *, agent_id: str | None = None) -> None:
    """Run the agent of config.agent until `stop` is set, then shut it down in order.

    agent_id overrides config.agent.agent_id (and the host name it defaults to). ConfigError,
    before anything starts, when an engine's pool is not a configured pool, and as it starts
    when a file the config names cannot be read (the CLI says it in one line and exits with 2).
    """
    known = [pool.name for pool in config.pools]
    unknown = [e.pool for e in config.agent.watched_engines if e.pool not in known]
    if unknown:
        raise ConfigError(
            f"agent: pool(s) {', '.join(map(repr, unknown))} of the watched engines are not "
            f"configured pools ({', '.join(known)})"
        )
    tracing = tracing_from_environment(SERVICE_NAME)
    try:
        await _serve(
            config,
            stop,
            TelemetryAgent(config.agent, agent_id=agent_id, tracer_provider=tracing.provider),
        )
    finally:
        await tracing.shutdown()
    logger.info("telemetry_agent stopped")


async def _serve(config: SlotshiftConfig, stop: asyncio.Event, agent: TelemetryAgent) -> None:
    await agent.start()
    try:
        logger.info(
            "telemetry_agent ready: agent %s, metrics http://%s:%d/metrics, control plane %s, "
            "every %.2f s; engines: %s",
            agent.agent_id,
            config.agent.host,
            agent.metrics_port,
            config.agent.controlplane_target,
            config.agent.interval_s,
            "; ".join(
                f"pool {e.pool} at {e.metrics_url} on {_gpus_described(e)}"
                for e in config.agent.watched_engines
            ),
        )
        await stop.wait()
        logger.info("telemetry_agent stopping")
    finally:
        await agent.stop()


def _gpus_described(engine: AgentEngineConfig) -> str:
    if engine.gpus_file is not None:
        return f"the GPUs of {engine.gpus_file}"
    if engine.gpus is None:
        return "every GPU"
    return f"GPU(s) {engine.gpus}" if engine.gpus else "no GPU"
