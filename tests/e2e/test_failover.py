"""Failover with real processes: two `slotshift controlplane` replicas on one real PostgreSQL
(tests/postgres.py), the emulator and two gateways that know both replicas, under load. The
leader is killed with SIGKILL: no client request fails, the engine never holds more than the
budget (sampled), and the follower leads and has both gateways acknowledge its allocation within
two leader-lease TTLs."""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from slotshift.v1 import gateway_pb2, query_pb2, query_pb2_grpc
from tests.e2e.service_processes import ServiceProcesses, grpc_serving, http_ok, wait_ready
from tests.e2e.test_chaos import BUDGET, Load, driven_load
from tests.postgres import PostgresServer
from tests.support import free_port, wait_until

pytestmark = pytest.mark.e2e

LEADER_LEASE_TTL_S = 2.0
GATEWAY_SERVICE = gateway_pb2.DESCRIPTOR.services_by_name["GatewayService"].full_name


@dataclass
class Ports:
    engine: int = field(default_factory=free_port)
    replicas: dict[str, tuple[int, int]] = field(
        default_factory=lambda: {name: (free_port(), free_port()) for name in ("cp-a", "cp-b")}
    )
    gateways: tuple[int, int] = field(default_factory=lambda: (free_port(), free_port()))

    def target(self, replica: str) -> str:
        return f"127.0.0.1:{self.replicas[replica][0]}"


def _config(ports: Ports, dsn_file: Path) -> dict[str, Any]:
    targets = [ports.target(name) for name in ports.replicas]
    return {
        "pools": [
            {
                "name": "default",
                "budget_slots": BUDGET,
                "decision_period_s": 0.5,
                "engine_url": f"http://127.0.0.1:{ports.engine}",
                "tenants": [
                    {"name": "A", "api_keys": ["key-a"], "floor_slots": 2},
                    {"name": "B", "api_keys": ["key-b"], "floor_slots": 2},
                ],
            }
        ],
        "controlplane": {
            "gateway_lease_ttl_s": 1.5,
            "telemetry_stale_after_s": 1.0,
            "leader_lease_ttl_s": LEADER_LEASE_TTL_S,
            "state_store": {
                "kind": "postgresql",
                "postgresql_dsn_file": str(dsn_file),
                "decision_flush_interval_ms": 100,
            },
        },
        "gateway": {
            "controlplane_target": targets,
            "fallback_replicas": 2,
            "report_interval_s": 0.1,
            "reconnect_initial_s": 0.05,
            "reconnect_max_s": 0.2,
        },
        "engine_sim": {"port": ports.engine},
    }


@pytest.fixture
def ports() -> Ports:
    return Ports()


@pytest.fixture
def services(
    tmp_path: Path, ports: Ports, postgres_server: PostgresServer
) -> Iterator[ServiceProcesses]:
    dsn_file = tmp_path / "postgresql-dsn"
    dsn_file.write_text(postgres_server.new_database() + "\n")
    processes = ServiceProcesses(tmp_path, _config(ports, dsn_file))
    try:
        yield processes
    finally:
        processes.close()


def _leads(target: str) -> bool:
    """Whether the replica at `target` says SERVING for the gateways' stream."""
    with grpc.insecure_channel(target) as channel:
        try:
            reply = health_pb2_grpc.HealthStub(channel).Check(
                health_pb2.HealthCheckRequest(service=GATEWAY_SERVICE), timeout=1
            )
        except grpc.RpcError:
            return False
        return bool(reply.status == health_pb2.HealthCheckResponse.SERVING)


def start_replica(services: ServiceProcesses, ports: Ports, name: str) -> None:
    grpc_port, metrics_port = ports.replicas[name]
    services.start(
        name,
        "controlplane",
        "--set",
        f"controlplane.replica_id={name}",
        "--set",
        f"controlplane.grpc_port={grpc_port}",
        "--set",
        f"controlplane.metrics_port={metrics_port}",
    )
    wait_ready(lambda: grpc_serving(ports.target(name)), f"control-plane replica {name}")


@pytest.fixture
async def load(ports: Ports, services: ServiceProcesses) -> AsyncIterator[Load]:
    services.start("engine", "engine-sim")
    wait_ready(lambda: http_ok(f"http://127.0.0.1:{ports.engine}/health"), "the emulator")
    start_replica(services, ports, "cp-a")
    wait_ready(lambda: _leads(ports.target("cp-a")), "cp-a to lead")
    start_replica(services, ports, "cp-b")
    assert not _leads(ports.target("cp-b")), "the second replica follows"
    for index, port in enumerate(ports.gateways):
        services.start(
            f"gateway-{index}", "gateway", "--port", str(port), "--gateway-id", f"gw-{index}"
        )
        wait_ready(lambda port=port: http_ok(f"http://127.0.0.1:{port}/ready"), f"gateway {index}")
    # A cold start keeps the budget only when every gateway connects within the restart hold
    # (a gateway lease, 1.5 s here, from the election): one that connects later runs on its
    # fallback split meanwhile, while the other may already be granted its part. Two replicas
    # and two gateways starting one after another on a loaded machine can take longer than
    # that, so the load starts once both gateways are on the leader.

    async def both_connected() -> bool:
        allocation = await _allocation(ports.target("cp-a"))
        return {g.gateway_id for g in allocation.gateways} == {"gw-0", "gw-1"}

    await wait_until(both_connected, timeout_s=20, message="both gateways on cp-a")
    urls = tuple(f"http://127.0.0.1:{port}" for port in ports.gateways)
    async with driven_load((urls[0], urls[1]), f"http://127.0.0.1:{ports.engine}") as state:
        yield state


async def _allocation(target: str) -> Any:
    async with grpc.aio.insecure_channel(target) as channel:
        stub = query_pb2_grpc.AllocationServiceStub(channel)
        return await stub.GetAllocation(query_pb2.GetAllocationRequest(pool="default"), timeout=2)


def _acknowledging(target: str, *, newer_than: int = 0) -> Callable[[], Awaitable[bool]]:
    """A condition: both gateways enforce `target`'s allocations (versions above `newer_than`).
    A gateway does once it has applied a version that `target` had sent it, now or at an
    earlier poll: under load a newer version is mostly on its way (a version goes only to the
    gateways whose part it changes, several a second), so "applied the newest sent" holds only
    in the moments between updates."""
    first_sent: dict[str, int] = {}

    async def check() -> bool:
        allocation = await _allocation(target)
        parts = {g.gateway_id: (g.applied_version, g.part_version) for g in allocation.gateways}
        for gateway, (_, part) in parts.items():
            if part > newer_than and gateway not in first_sent:
                first_sent[gateway] = part
        return set(parts) == {"gw-0", "gw-1"} and all(
            gateway in first_sent and first_sent[gateway] <= applied
            for gateway, (applied, _) in parts.items()
        )

    return check


async def test_the_follower_takes_over_a_killed_leader_under_load(
    ports: Ports, services: ServiceProcesses, load: Load
) -> None:
    leader, follower = ports.target("cp-a"), ports.target("cp-b")
    await wait_until(lambda: min(load.ok.values()) > 20, timeout_s=30, message="load flowing")
    await wait_until(_acknowledging(leader), timeout_s=10, message="gateways on cp-a")
    before = await _allocation(leader)
    services.kill("cp-a")
    killed = time.monotonic()

    on_follower = _acknowledging(follower, newer_than=before.version)

    async def taken_over() -> bool:
        return await asyncio.to_thread(_leads, follower) and await on_follower()

    await wait_until(
        taken_over,
        timeout_s=6 * LEADER_LEASE_TTL_S,
        message="both gateways acknowledging an allocation of cp-b",
    )
    took_s = time.monotonic() - killed
    print(f"failover: the gateways acknowledged cp-b's allocation {took_s:.2f} s after the kill")
    assert took_s <= 2 * LEADER_LEASE_TTL_S
    served = dict(load.ok)
    await wait_until(
        lambda: all(load.ok[g] > served[g] + 20 for g in (0, 1)),
        timeout_s=20,
        message="both gateways serving under the new leader",
    )
    allocation = await _allocation(follower)
    assert sum(t.limit_slots for t in allocation.tenants) == BUDGET
    assert load.failed == {0: [], 1: []}, "no client request may fail because the leader died"
    assert "controlplane leads, epoch 2" in services.log("cp-b")
