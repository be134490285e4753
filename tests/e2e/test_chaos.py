"""Chaos, with real processes and real signals: the control plane, a gateway or the agent is
killed with SIGKILL under load. The pool never holds more than its budget, clients of surviving
gateways see no failure, and the system heals within the times the config promises."""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import pytest

from slotshift.v1 import query_pb2, query_pb2_grpc
from slotshift_tools.engine_probe import requests_inside
from tests.e2e.service_processes import ServiceProcesses, grpc_serving, http_ok, wait_ready
from tests.support import free_port, wait_until

pytestmark = pytest.mark.e2e

BUDGET = 16
PERIOD_S = 0.5
LEASE_TTL_S = 1.5
MODEL = "Qwen/Qwen2.5-3B-Instruct"


@dataclass
class Ports:
    engine: int = field(default_factory=free_port)
    grpc: int = field(default_factory=free_port)
    cp_metrics: int = field(default_factory=free_port)
    agent_metrics: int = field(default_factory=free_port)
    gateways: tuple[int, int] = field(default_factory=lambda: (free_port(), free_port()))

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.grpc}"

    def gateway_url(self, index: int) -> str:
        return f"http://127.0.0.1:{self.gateways[index]}"


def _config(ports: Ports) -> dict[str, Any]:
    return {
        "pools": [
            {
                "name": "default",
                "budget_slots": BUDGET,
                "decision_period_s": PERIOD_S,
                "engine_url": f"http://127.0.0.1:{ports.engine}",
                "tenants": [
                    {"name": "A", "api_keys": ["key-a"], "floor_slots": 2},
                    {"name": "B", "api_keys": ["key-b"], "floor_slots": 2},
                ],
            }
        ],
        "controlplane": {
            "grpc_port": ports.grpc,
            "metrics_port": ports.cp_metrics,
            "gateway_lease_ttl_s": LEASE_TTL_S,
            "telemetry_stale_after_s": 1.0,
        },
        "gateway": {
            "controlplane_target": ports.target,
            "fallback_replicas": 2,
            "report_interval_s": 0.1,
            "reconnect_initial_s": 0.05,
            "reconnect_max_s": 0.2,
        },
        "agent": {
            "controlplane_target": ports.target,
            "engine_metrics_url": f"http://127.0.0.1:{ports.engine}/metrics",
            "metrics_port": ports.agent_metrics,
            "interval_s": 0.2,
            "reconnect_max_s": 0.2,
        },
        "engine_sim": {"port": ports.engine},
    }


@pytest.fixture
def ports() -> Ports:
    return Ports()


@pytest.fixture
def services(tmp_path: Path, ports: Ports) -> Iterator[ServiceProcesses]:
    processes = ServiceProcesses(tmp_path, _config(ports))
    try:
        yield processes
    finally:
        processes.close()


def start_controlplane(services: ServiceProcesses, ports: Ports) -> None:
    services.start("controlplane", "controlplane")
    wait_ready(lambda: grpc_serving(ports.target), "the control plane")


def start_stack(services: ServiceProcesses, ports: Ports) -> None:
    services.start("engine", "engine-sim")
    wait_ready(lambda: http_ok(f"http://127.0.0.1:{ports.engine}/health"), "the emulator")
    start_controlplane(services, ports)
    for index, port in enumerate(ports.gateways):
        services.start(
            f"gateway-{index}", "gateway", "--port", str(port), "--gateway-id", f"gw-{index}"
        )
        wait_ready(lambda port=port: http_ok(f"http://127.0.0.1:{port}/ready"), f"gateway {index}")


@dataclass
class Load:
    """Closed-loop clients per (tenant key, gateway); counts outcomes per gateway."""

    ok: dict[int, int] = field(default_factory=lambda: {0: 0, 1: 0})
    failed: dict[int, list[str]] = field(default_factory=lambda: {0: [], 1: []})
    in_engine: list[int] = field(default_factory=list)
    stop: asyncio.Event = field(default_factory=asyncio.Event)


async def _client(
    session: aiohttp.ClientSession, load: Load, url: str, gateway: int, key: str
) -> None:
    payload = {"model": MODEL, "prompt": "chaos", "max_tokens": 48, "ignore_eos": True}
    while not load.stop.is_set():
        try:
            async with session.post(
                f"{url}/v1/completions", json=payload, headers={"Authorization": f"Bearer {key}"}
            ) as response:
                await response.read()
                if response.status == 200:
                    load.ok[gateway] += 1
                else:
                    load.failed[gateway].append(f"HTTP {response.status}")
        except aiohttp.ClientError as exc:
            load.failed[gateway].append(type(exc).__name__)
            await asyncio.sleep(0.05)


async def _sample_engine(session: aiohttp.ClientSession, load: Load, engine_url: str) -> None:
    while not load.stop.is_set():
        async with session.get(f"{engine_url}/metrics") as response:
            load.in_engine.append(requests_inside(await response.text()))
        await asyncio.sleep(0.01)


@contextlib.asynccontextmanager
async def driven_load(gateway_urls: tuple[str, str], engine_url: str) -> AsyncIterator[Load]:
    """Eight closed-loop clients per tenant key and gateway, and the engine sampled, while the
    block runs; then the engine must never have held more than the budget."""
    state = Load()
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
        tasks = [
            asyncio.create_task(
                _client(session, state, gateway_urls[g], g, key), name=f"client-{g}-{key}-{i}"
            )
            for g in (0, 1)
            for key in ("key-a", "key-b")
            for i in range(8)
        ]
        tasks.append(
            asyncio.create_task(_sample_engine(session, state, engine_url), name="sample-engine")
        )
        try:
            yield state
        finally:
            state.stop.set()
            await asyncio.gather(*tasks)
    assert state.in_engine, "the engine was never sampled"
    assert max(state.in_engine) <= BUDGET, f"engine held {max(state.in_engine)} > budget {BUDGET}"


@pytest.fixture
async def load(ports: Ports, services: ServiceProcesses) -> AsyncIterator[Load]:
    start_stack(services, ports)
    urls = (ports.gateway_url(0), ports.gateway_url(1))
    async with driven_load(urls, f"http://127.0.0.1:{ports.engine}") as state:
        yield state


async def _allocation(ports: Ports) -> Any:
    async with grpc.aio.insecure_channel(ports.target) as channel:
        stub = query_pb2_grpc.AllocationServiceStub(channel)
        return await stub.GetAllocation(query_pb2.GetAllocationRequest(pool="default"), timeout=2)


async def test_gateways_keep_serving_through_a_control_plane_kill_and_resync(
    ports: Ports, services: ServiceProcesses, load: Load
) -> None:
    await wait_until(lambda: min(load.ok.values()) > 20, timeout_s=20, message="load flowing")
    before = await _allocation(ports)
    services.kill("controlplane")
    served_at_kill = dict(load.ok)
    await wait_until(
        lambda: all(load.ok[g] > served_at_kill[g] + 20 for g in (0, 1)),
        timeout_s=20,
        message="both gateways serving on their last allocation without the control plane",
    )
    start_controlplane(services, ports)
    restarted = time.monotonic()

    async def resynced() -> bool:
        # A version goes only to the gateways whose part it changed: each gateway is in sync
        # when it enforces the newest part sent to it, not necessarily the pool's newest version.
        allocation = await _allocation(ports)
        parts = {g.gateway_id: (g.part_version, g.applied_version) for g in allocation.gateways}
        return sorted(parts) == ["gw-0", "gw-1"] and all(
            before.version < part <= applied for part, applied in parts.values()
        )

    await wait_until(
        resynced, timeout_s=10, message="both gateways resynced with the new control plane"
    )
    assert time.monotonic() - restarted <= 2 * PERIOD_S + 1.0
    allocation = await _allocation(ports)
    assert sum(t.limit_slots for t in allocation.tenants) == BUDGET
    assert load.failed == {0: [], 1: []}, (
        "no client request may fail because the control plane died"
    )


async def test_a_killed_gateways_share_returns_within_its_lease(
    ports: Ports, services: ServiceProcesses, load: Load
) -> None:
    await wait_until(lambda: min(load.ok.values()) > 20, timeout_s=20, message="load flowing")
    services.kill("gateway-1")
    killed = time.monotonic()

    async def survivor_holds_the_budget() -> bool:
        allocation = await _allocation(ports)
        if [g.gateway_id for g in allocation.gateways] != ["gw-0"]:
            return False
        limits = allocation.gateways[0].tenants
        return sum(t.limit_slots for t in limits) == BUDGET and all(
            t.limit_slots == t.target_slots for t in limits
        )

    await wait_until(
        survivor_holds_the_budget, timeout_s=15, message="gw-0 to hold the whole budget"
    )
    assert time.monotonic() - killed <= LEASE_TTL_S + 2 * PERIOD_S + 1.0
    assert load.failed[0] == [], "the surviving gateway's clients must not notice"


async def test_decisions_go_on_without_the_agent_and_say_the_telemetry_is_stale(
    ports: Ports, services: ServiceProcesses, load: Load
) -> None:
    services.start("agent", "agent")
    agent_health = f"http://127.0.0.1:{ports.agent_metrics}/health"
    await wait_until(
        lambda: asyncio.to_thread(http_ok, agent_health), timeout_s=60, message="the agent"
    )
    async with grpc.aio.insecure_channel(ports.target) as channel:
        stub = query_pb2_grpc.AllocationServiceStub(channel)

        async def newest() -> query_pb2.Decision:
            reply = await stub.GetDecisions(query_pb2.GetDecisionsRequest(pool="default", limit=1))
            return reply.decisions[0]

        async def fresh() -> bool:
            return (await newest()).telemetry.fresh

        await wait_until(fresh, timeout_s=30, message="a decision with fresh telemetry")
        services.kill("agent")

        async def stale() -> bool:
            decision = await newest()
            return not decision.telemetry.fresh and decision.telemetry.age_s > 1.0

        await wait_until(stale, timeout_s=10, message="decisions marked stale")
        last = (await newest()).id
        await wait_until(
            lambda: _later(newest, last),
            timeout_s=5,
            message="decisions going on without telemetry",
        )
    assert load.failed == {0: [], 1: []}


async def _later(newest: Any, last: int) -> bool:
    return bool((await newest()).id > last)
