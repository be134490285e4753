"""Entry point of an admission gateway process (the CLI calls `run`)."""

from __future__ import annotations

import asyncio
import logging

from opentelemetry import trace

from admission_gateway.gateway import AdmissionGateway
from slotshift.config import SlotshiftConfig
from slotshift.tracing import tracing_from_environment

logger = logging.getLogger(__name__)

SERVICE_NAME = "slotshift-gateway"
"""The service name its spans carry unless OTEL_SERVICE_NAME says otherwise."""


async def run(
    config: SlotshiftConfig,
    stop: asyncio.Event,
    *,
    gateway_id: str | None = None,
    port: int | None = None,
) -> None:
    """Serve until `stop` is set, then drain and shut down. ConfigError, before it serves, when
    a file the config names cannot be read (the CLI says it in one line and exits with 2).

    gateway_id: this gateway's name towards the control plane (default: host name and port).
    port: overrides config.gateway.port (0 picks a free one).
    """
    tracing = tracing_from_environment(SERVICE_NAME)
    try:
        await _serve(config, stop, tracing.provider, gateway_id=gateway_id, port=port)
    finally:
        await tracing.shutdown()


async def _serve(
    config: SlotshiftConfig,
    stop: asyncio.Event,
    tracer_provider: trace.TracerProvider,
    *,
    gateway_id: str | None,
    port: int | None,
) -> None:
    gateway = AdmissionGateway(
        config, gateway_id=gateway_id, port=port, tracer_provider=tracer_provider
    )
    await gateway.start()
    try:
        logger.info(
            "admission gateway ready on %s (gateway %s, pools %s, control plane %s)",
            gateway.url,
            gateway.gateway_id,
            ", ".join(f"{p.name} at {p.engine_url}" for p in config.fronted_pools()),
            config.gateway.controlplane_target,
        )
        await stop.wait()
        logger.info("admission gateway %s shutting down", gateway.gateway_id)
    finally:
        await gateway.stop()
