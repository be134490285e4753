"""Fixtures for the gateway tests: a fake engine, gateways on port 0, an HTTP client."""

from __future__ import annotations

from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import aiohttp
import pytest_asyncio

from admission_gateway.gateway import AdmissionGateway
from slotshift.config import SlotshiftConfig
from tests.unit.admission_gateway.fake_engine import FakeEngine

KEYS = {"A": "key-a", "B": "key-b"}

StartGateway = Callable[..., Awaitable[AdmissionGateway]]


def make_config(engine_url: str, **gateway: Any) -> SlotshiftConfig:
    """Pool `p`: 8 slots, tenants A and B of equal weight; one replica, so 4 slots each."""
    settings: dict[str, Any] = {
        "pool": "p",
        "host": "127.0.0.1",
        "port": 0,
        # Nothing listens on port 1: the gateway stays on its fallback split.
        "controlplane_target": "127.0.0.1:1",
        "fallback_replicas": 1,
        "drain_timeout_s": 2.0,
        "reconnect_initial_s": 0.05,
        "reconnect_max_s": 0.2,
        "report_interval_s": 0.05,
    }
    settings.update(gateway)
    return SlotshiftConfig.model_validate(
        {
            "pools": [
                {
                    "name": "p",
                    "budget_slots": 8,
                    "engine_url": engine_url,
                    "tenants": [
                        {"name": "A", "api_keys": [KEYS["A"]]},
                        {"name": "B", "api_keys": [KEYS["B"]]},
                    ],
                }
            ],
            "gateway": settings,
        }
    )


def with_preemptible(config: SlotshiftConfig, tenants: tuple[str, ...]) -> SlotshiftConfig:
    """`config` with the named tenants of its pool preemptible."""
    if not tenants:
        return config
    pool = config.pools[0]
    changed = [
        t.model_copy(update={"preemptible": True}) if t.name in tenants else t for t in pool.tenants
    ]
    return config.model_copy(update={"pools": [pool.model_copy(update={"tenants": changed})]})


def auth(tenant: str) -> dict[str, str]:
    return {"Authorization": f"Bearer {KEYS[tenant]}"}


@pytest_asyncio.fixture
async def engine() -> AsyncIterator[FakeEngine]:
    fake = FakeEngine()
    await fake.start()
    yield fake
    for gate in (fake.gate, fake.tokenize_gate):
        if gate is not None:
            gate.set()
    await fake.stop()


@pytest_asyncio.fixture
async def start_gateway(engine: FakeEngine) -> AsyncIterator[StartGateway]:
    """Start a gateway in front of `engine`; keyword arguments override gateway settings."""
    started: list[AdmissionGateway] = []

    async def start(
        *, engine_url: str | None = None, preemptible: tuple[str, ...] = (), **gateway: Any
    ) -> AdmissionGateway:
        config = with_preemptible(make_config(engine_url or engine.url, **gateway), preemptible)
        instance = AdmissionGateway(config, gateway_id="gw-test")
        await instance.start()
        started.append(instance)
        return instance

    yield start
    if engine.gate is not None:
        engine.gate.set()
    for instance in started:
        await instance.stop()


@pytest_asyncio.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session
