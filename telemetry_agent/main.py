"""Entry point of the telemetry agent service (the CLI calls run())."""

from __future__ import annotations

import asyncio
import logging

from slotshift.config import ConfigError, SlotshiftConfig
from slotshift.tracing import tracing_from_environment
from telemetry_agent.agent import TelemetryAgent

logger = logging.getLogger(__name__)

SERVICE_NAME = "slotshift-agent"
"""The service name its spans carry unless OTEL_SERVICE_NAME says otherwise."""


async def run(config: SlotshiftConfig, stop: asyncio.Event, *, agent_id: str | None = None) -> None:
    """Run the agent of config.agent until `stop` is set, then shut it down in order.

    agent_id overrides config.agent.agent_id (and the host name it defaults to).
    """
    try:
        config.pool(config.agent.pool)
    except KeyError as exc:
        known = ", ".join(pool.name for pool in config.pools)
        raise ConfigError(
            f"agent.pool {config.agent.pool!r} is not a configured pool ({known})"
        ) from exc
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
            "telemetry_agent ready: agent %s, pool %s, metrics http://%s:%d/metrics, "
            "engine %s, control plane %s, every %.2f s",
            agent.agent_id,
            config.agent.pool,
            config.agent.host,
            agent.metrics_port,
            config.agent.engine_metrics_url,
            config.agent.controlplane_target,
            config.agent.interval_s,
        )
        await stop.wait()
        logger.info("telemetry_agent stopping")
    finally:
        await agent.stop()
