"""`slotshift controlplane`: run the control plane until told to stop."""

from __future__ import annotations

import asyncio

from controlplane.server import ControlPlane
from slotshift.config import SlotshiftConfig
from slotshift.tracing import tracing_from_environment

SERVICE_NAME = "slotshift-controlplane"
"""The service name its spans carry unless OTEL_SERVICE_NAME says otherwise."""


async def run(config: SlotshiftConfig, stop: asyncio.Event) -> None:
    tracing = tracing_from_environment(SERVICE_NAME)
    try:
        control_plane = ControlPlane(config, tracer_provider=tracing.provider)
        await control_plane.start()
        try:
            await stop.wait()
        finally:
            await control_plane.stop()
    finally:
        await tracing.shutdown()
