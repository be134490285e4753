"""`slotshift controlplane`: run the control plane until told to stop."""

from __future__ import annotations

import asyncio

from controlplane.server import ControlPlane
from slotshift.config import SlotshiftConfig


async def run(config: SlotshiftConfig, stop: asyncio.Event) -> None:
    control_plane = ControlPlane(config)
    await control_plane.start()
    try:
        await stop.wait()
    finally:
        await control_plane.stop()
