"""`slotshift controlplane`: run the control plane until told to stop."""

from __future__ import annotations

import asyncio
import gc

from controlplane.server import ControlPlane
from slotshift.config import SlotshiftConfig
from slotshift.tracing import tracing_from_environment

GC_THRESHOLD = (10_000, 20, 20)
"""The collector's thresholds (CPython's default is (700, 10, 10)). The control plane holds every
gateway's figures, a few objects per tenant per gateway, and makes and drops as many with each
full report: at 10,000 tenants the default's collections took about a quarter of a decision's
time (194 -> 151 ms per decision in process with these)."""

SERVICE_NAME = "slotshift-controlplane"
"""The service name its spans carry unless OTEL_SERVICE_NAME says otherwise."""


async def run(config: SlotshiftConfig, stop: asyncio.Event) -> None:
    gc.set_threshold(*GC_THRESHOLD)
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
