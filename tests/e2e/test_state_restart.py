"""State that survives a restart, with real processes: admin changes made through the admin API,
then the control plane (and the gateway) killed with SIGKILL and started again. The added
tenant, its key (a fresh gateway authenticates it), the updated setting, the policy and the
decision history are all there, and versions continue above the old ones; with the SQLite
store and with a real PostgreSQL server (tests/postgres.py)."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
import grpc
import pytest

from slotshift.v1 import admin_pb2, admin_pb2_grpc, query_pb2, query_pb2_grpc
from tests.e2e.service_processes import ServiceProcesses, grpc_serving, http_ok, wait_ready
from tests.postgres import PostgresServer
from tests.support import free_port, wait_until

pytestmark = pytest.mark.e2e

TOKEN = "restart-admin-token"
AUTH = (("authorization", f"Bearer {TOKEN}"),)


@dataclass
class Ports:
    engine: int = field(default_factory=free_port)
    grpc: int = field(default_factory=free_port)
    metrics: int = field(default_factory=free_port)
    gateway: int = field(default_factory=free_port)

    @property
    def target(self) -> str:
        return f"127.0.0.1:{self.grpc}"


def _config(ports: Ports, store: dict[str, Any]) -> dict[str, Any]:
    return {
        "pools": [
            {
                "name": "default",
                "budget_slots": 12,
                "decision_period_s": 0.3,
                "engine_url": f"http://127.0.0.1:{ports.engine}",
                "tenants": [
                    {"name": "A", "api_keys": ["key-a"], "floor_slots": 2},
                    {"name": "B", "api_keys": ["key-b"], "floor_slots": 2},
                ],
            }
        ],
        "controlplane": {
            "grpc_port": ports.grpc,
            "metrics_port": ports.metrics,
            "gateway_lease_ttl_s": 1.0,
            "admin_token_file": "admin-token",
            "state_store": {**store, "decision_flush_interval_ms": 50},
        },
        "gateway": {
            "port": ports.gateway,
            "controlplane_target": ports.target,
            "report_interval_s": 0.1,
            "reconnect_initial_s": 0.05,
            "reconnect_max_s": 0.2,
        },
        "engine_sim": {"port": ports.engine},
    }


@pytest.fixture(params=["sqlite", "postgresql"])
def store(request: pytest.FixtureRequest, tmp_path: Path) -> dict[str, Any]:
    """The config's state_store section: SQLite beside the config file (the default), or a
    fresh database on the test PostgreSQL server, its DSN in a file."""
    if request.param == "sqlite":
        return {}
    server: PostgresServer = request.getfixturevalue("postgres_server")
    (tmp_path / "postgresql-dsn").write_text(server.new_database() + "\n")
    return {"kind": "postgresql", "postgresql_dsn_file": "postgresql-dsn"}


@pytest.fixture
def ports() -> Ports:
    return Ports()


@pytest.fixture
def services(tmp_path: Path, ports: Ports, store: dict[str, Any]) -> Iterator[ServiceProcesses]:
    (tmp_path / "admin-token").write_text(TOKEN + "\n")
    processes = ServiceProcesses(tmp_path, _config(ports, store))
    try:
        yield processes
    finally:
        processes.close()


@pytest.fixture
async def channel(ports: Ports) -> AsyncIterator[grpc.aio.Channel]:
    async with grpc.aio.insecure_channel(ports.target) as opened:
        yield opened


def _start_controlplane(services: ServiceProcesses, ports: Ports) -> None:
    services.start("controlplane", "controlplane")
    wait_ready(lambda: grpc_serving(ports.target), "the control plane")


def _start_gateway(services: ServiceProcesses, ports: Ports) -> None:
    services.start("gateway", "gateway", "--gateway-id", "gw-0")
    wait_ready(lambda: http_ok(f"http://127.0.0.1:{ports.gateway}/ready"), "the gateway")


async def _authenticates(http: aiohttp.ClientSession, ports: Ports, key: str) -> bool:
    async with http.get(
        f"http://127.0.0.1:{ports.gateway}/v1/models",
        headers={"Authorization": f"Bearer {key}"},
    ) as response:
        await response.read()
        return response.status == 200


async def _history(queries: query_pb2_grpc.AllocationServiceAsyncStub) -> list[Any]:
    reply = await queries.GetDecisions(
        query_pb2.GetDecisionsRequest(pool="default", since_version=1, limit=10_000)
    )
    return list(reply.decisions)


async def test_admin_changes_history_and_versions_survive_a_kill(
    services: ServiceProcesses, ports: Ports, channel: grpc.aio.Channel
) -> None:
    services.start("engine", "engine-sim")
    wait_ready(lambda: http_ok(f"http://127.0.0.1:{ports.engine}/health"), "the emulator")
    _start_controlplane(services, ports)
    _start_gateway(services, ports)
    admin = admin_pb2_grpc.AdminServiceStub(channel)
    queries = query_pb2_grpc.AllocationServiceStub(channel)
    await admin.AddTenant(
        admin_pb2.AddTenantRequest(
            pool="default",
            tenant="C",
            api_keys=["key-c"],
            settings=admin_pb2.TenantSettings(floor_slots=2),
        ),
        metadata=AUTH,
    )
    await admin.UpdateTenant(
        admin_pb2.UpdateTenantRequest(
            pool="default", tenant="A", settings=admin_pb2.TenantSettings(floor_slots=3)
        ),
        metadata=AUTH,
    )
    changed = await admin.SetPolicy(
        admin_pb2.SetPolicyRequest(pool="default", policy="slo"), metadata=AUTH
    )
    assert changed.config.config_version == 4
    async with aiohttp.ClientSession() as http:
        await wait_until(lambda: _authenticates(http, ports, "key-c"), timeout_s=10)
        # A few decisions under the new policy, then what the first run published.
        await wait_until(lambda: _decisions_since(queries, changed.decision_id, 3), timeout_s=10)
        before = await _history(queries)
        published = (
            await queries.GetAllocation(query_pb2.GetAllocationRequest(pool="default"))
        ).version
        # Read from the store (GetDecisions with since_version flushes first): written.
        triggers = [d.trigger for d in before]
        assert any("added tenant C" in t for t in triggers), triggers
        assert any("policy demand -> slo" in t for t in triggers), triggers

        services.kill("controlplane")
        services.kill("gateway")
        _start_controlplane(services, ports)
        _start_gateway(services, ports)

        view = await admin.GetPoolConfig(admin_pb2.GetPoolConfigRequest(pool="default"))
        tenants = {t.name: t for t in view.tenants}
        assert set(tenants) == {"A", "B", "C"}
        assert tenants["A"].floor_slots == 3
        assert view.policy == "slo"
        assert view.config_version == 4
        # A gateway that started after the restart knows C's key only from the control plane.
        await wait_until(lambda: _authenticates(http, ports, "key-c"), timeout_s=10)
        assert await _authenticates(http, ports, "key-a")
        assert not await _authenticates(http, ports, "key-unknown")

    after = await _history(queries)
    old_ids = [d.id for d in before]
    assert [d.id for d in after][: len(old_ids)] == old_ids, "the history before the kill"
    old = {d.id: d for d in before}
    for decision in after[: len(old_ids)]:
        assert decision == old[decision.id], "read back whole, as it was"
    newer = after[len(old_ids) :]
    assert newer, "decisions after the restart"
    assert min(d.id for d in newer) > max(old_ids)
    assert min(d.version for d in newer) > published, "versions continue above the old ones"
    allocation = await queries.GetAllocation(query_pb2.GetAllocationRequest(pool="default"))
    assert allocation.version > published
    assert "restored from the state store: config v4 (3 stored changes applied" in services.log(
        "controlplane"
    )


async def _decisions_since(
    queries: query_pb2_grpc.AllocationServiceAsyncStub, decision_id: int, count: int
) -> bool:
    reply = await queries.GetDecisions(
        query_pb2.GetDecisionsRequest(pool="default", after_decision_id=decision_id, limit=count)
    )
    return len(reply.decisions) >= count
