"""Entry point of the telemetry agent service (the CLI calls run())."""

from __future__ import annotations

import asyncio
import logging

from slotshift.config import ConfigError, SlotshiftConfig
from telemetry_agent.agent import TelemetryAgent

logger = logging.getLogger(__name__)


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
    agent = TelemetryAgent(config.agent, agent_id=agent_id)
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
    logger.info("telemetry_agent stopped")
