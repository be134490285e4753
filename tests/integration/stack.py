"""The emulator, a control plane and gateways (three unless asked) in one process on port 0,
started in order (each needs the one before it: the gateways the control plane's port,
everything the engine's URL) and stopped in reverse."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from contextlib import AsyncExitStack
from dataclasses import dataclass
from typing import TypeVar

from pydantic import SecretStr

from admission_gateway.gateway import AdmissionGateway
from controlplane.server import ControlPlane
from engine_sim.server import EngineSim
from slotshift.config import SlotshiftConfig
from telemetry_agent.gpu import GpuDeviceReading, GpuReadError
from tests.stream_tokens import StreamTokens
from tests.support import TEST_KEY_DIGEST_SECRET

GATEWAYS = 3


class NoGpu:
    """A GpuReader for a machine without NVML (the agent reports no GPU figures, and says so)."""

    def open(self) -> None:
        raise GpuReadError("no NVML in this test")

    def read_devices(self) -> list[GpuDeviceReading]:
        raise GpuReadError("no NVML in this test")

    def close(self) -> None:
        return None


def keyed(config: SlotshiftConfig) -> SlotshiftConfig:
    """`config` with the tests' key-digest secret where it sets none and does not opt out: the
    stacks digest keys keyed, as every shipped config does."""
    settings = config.tenant_keys
    if settings.key_digest_secret is not None or settings.unkeyed_key_digests:
        return config
    secret = SecretStr(TEST_KEY_DIGEST_SECRET)
    tenant_keys = settings.model_copy(update={"key_digest_secret": secret})
    return config.model_copy(update={"tenant_keys": tenant_keys})


@dataclass
class Stack:
    config: SlotshiftConfig
    engine: EngineSim
    control_plane: ControlPlane
    gateways: list[AdmissionGateway]


async def start_stack(
    exits: AsyncExitStack,
    config: Callable[[str, int], SlotshiftConfig],
    *,
    gateways: int = GATEWAYS,
) -> Stack:
    """`config(engine_url, grpc_port)` is called for the engine (neither is known yet), for the
    control plane (the engine's URL known), then with both for the gateways. The streams are
    authenticated with fresh tokens (tests/stream_tokens.py) unless the config sets its own
    stream_auth; `Stack.config` names them."""
    tokens = StreamTokens.for_stack(exits)
    config = _with_tokens(config, tokens)
    engine = EngineSim(config("http://127.0.0.1:1", 0).engine_sim)
    await engine.start()
    exits.push_async_callback(engine.stop)
    control_plane = ControlPlane(keyed(config(engine.url, 0)))
    await control_plane.start()
    exits.push_async_callback(control_plane.stop)
    final = keyed(config(engine.url, control_plane.grpc_port))
    started = []
    for index in range(gateways):
        gateway = AdmissionGateway(final, gateway_id=f"gw-{index}")
        await gateway.start()
        exits.push_async_callback(gateway.stop)
        started.append(gateway)
    return Stack(final, engine, control_plane, started)


@dataclass
class Fleet:
    config: SlotshiftConfig
    engines: dict[str, EngineSim]
    """pool -> its emulator."""
    control_plane: ControlPlane
    gateways: list[AdmissionGateway]


async def start_fleet(
    exits: AsyncExitStack,
    config: Callable[[dict[str, str], int], SlotshiftConfig],
    models: Mapping[str, str],
    *,
    gateways: int = 1,
) -> Fleet:
    """An emulator per pool of `models` (pool -> the model it serves), a control plane and
    `gateways` gateways fronting them, in that order; `config(engine urls by pool, grpc_port)`
    is called as start_stack calls its config (and given stream tokens as there)."""
    tokens = StreamTokens.for_stack(exits)
    config = _with_tokens(config, tokens)
    unknown = {pool: "http://127.0.0.1:1" for pool in models}
    engines = {}
    for pool, model in models.items():
        settings = config(unknown, 0).engine_sim.model_copy(update={"model_name": model})
        engines[pool] = EngineSim(settings)
        await engines[pool].start()
        exits.push_async_callback(engines[pool].stop)
    urls = {pool: engine.url for pool, engine in engines.items()}
    control_plane = ControlPlane(keyed(config(urls, 0)))
    await control_plane.start()
    exits.push_async_callback(control_plane.stop)
    final = keyed(config(urls, control_plane.grpc_port))
    started = []
    for index in range(gateways):
        gateway = AdmissionGateway(final, gateway_id=f"gw-{index}")
        await gateway.start()
        exits.push_async_callback(gateway.stop)
        started.append(gateway)
    return Fleet(final, engines, control_plane, started)


_Where = TypeVar("_Where")


def _with_tokens(
    config: Callable[[_Where, int], SlotshiftConfig], tokens: StreamTokens
) -> Callable[[_Where, int], SlotshiftConfig]:
    return lambda where, port: tokens.apply(config(where, port))
