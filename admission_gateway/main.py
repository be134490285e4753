"""Entry point of an admission gateway process (the CLI calls `run`)."""

from __future__ import annotations

import asyncio
import logging

from admission_gateway.gateway import AdmissionGateway
from slotshift.config import SlotshiftConfig

logger = logging.getLogger(__name__)


async def run(
    config: SlotshiftConfig,
    stop: asyncio.Event,
    *,
    gateway_id: str | None = None,
    port: int | None = None,
) -> None:
    """Serve until `stop` is set, then drain and shut down.

    gateway_id: this gateway's name towards the control plane (default: host name and port).
    port: overrides config.gateway.port (0 picks a free one).
    """
    gateway = AdmissionGateway(config, gateway_id=gateway_id, port=port)
    await gateway.start()
    try:
        logger.info(
            "admission gateway ready on %s (gateway %s, pool %s, engine %s, control plane %s)",
            gateway.url,
            gateway.gateway_id,
            config.gateway.pool,
            config.pool(config.gateway.pool).engine_url,
            config.gateway.controlplane_target,
        )
        await stop.wait()
        logger.info("admission gateway %s shutting down", gateway.gateway_id)
    finally:
        await gateway.stop()
