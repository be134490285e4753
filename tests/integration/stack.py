"""The emulator, a control plane and three gateways in one process on port 0, started in order
(each needs the one before it: the gateways the control plane's port, everything the engine's
URL) and stopped in reverse."""

from __future__ import annotations

from collections.abc import Callable
from contextlib import AsyncExitStack
from dataclasses import dataclass

from admission_gateway.gateway import AdmissionGateway
from controlplane.server import ControlPlane
from engine_sim.server import EngineSim
from slotshift.config import SlotshiftConfig

GATEWAYS = 3


@dataclass
class Stack:
    config: SlotshiftConfig
    engine: EngineSim
    control_plane: ControlPlane
    gateways: list[AdmissionGateway]


async def start_stack(
    exits: AsyncExitStack, config: Callable[[str, int], SlotshiftConfig]
) -> Stack:
    """`config(engine_url, grpc_port)` is called twice: for the engine and the control plane
    (whose ports are not known yet), then with both for the gateways."""
    base = config("http://127.0.0.1:1", 0)
    engine = EngineSim(base.engine_sim)
    await engine.start()
    exits.push_async_callback(engine.stop)
    control_plane = ControlPlane(base)
    await control_plane.start()
    exits.push_async_callback(control_plane.stop)
    final = config(engine.url, control_plane.grpc_port)
    gateways = []
    for index in range(GATEWAYS):
        gateway = AdmissionGateway(final, gateway_id=f"gw-{index}")
        await gateway.start()
        exits.push_async_callback(gateway.stop)
        gateways.append(gateway)
    return Stack(final, engine, control_plane, gateways)
