"""Integration, a real control plane on port 0 and a real config file: the file rewritten and
reloaded (the method, and the watch), GetPoolConfig and GetAllocation follow, the stored admin
changes stay on top (the file winning over one whose field it changed), a restart continues at
the reloaded version; an invalid file, or one that needs a restart, keeps the running config and
is counted."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest
import yaml

from controlplane.server import ControlPlane
from slotshift.config import ConfigSource
from slotshift.v1 import admin_pb2, admin_pb2_grpc, query_pb2, query_pb2_grpc
from tests.stream_tokens import StreamTokens
from tests.support import TEST_KEY_DIGEST_SECRET, wait_until

TOKEN = "reload-admin-token"
AUTH = (("authorization", f"Bearer {TOKEN}"),)
RELOADS = "slotshift_controlplane_config_reloads_total"


def _document(*, interval_s: float, **tenant_b: Any) -> dict[str, Any]:
    return {
        "pools": [
            {
                "name": "default",
                "budget_slots": 20,
                "decision_period_s": 0.2,
                "tenants": [
                    {"name": "A", "api_keys": ["key-a"], "floor_slots": 2},
                    {"name": "B", "api_keys": ["key-b"], "floor_slots": 2, **tenant_b},
                ],
            }
        ],
        "tenant_keys": {"key_digest_secret_file": "key-digest-secret"},
        "controlplane": {
            "grpc_port": 0,
            "metrics_port": 0,
            "admin_token_file": "admin-token",
            "config_reload_interval_s": interval_s,
        },
    }


@dataclass
class Running:
    control_plane: ControlPlane
    admin: admin_pb2_grpc.AdminServiceAsyncStub
    queries: query_pb2_grpc.AllocationServiceAsyncStub
    path: Path

    def write(self, document: dict[str, Any]) -> None:
        self.path.write_text(yaml.safe_dump(document))

    async def view(self) -> admin_pb2.PoolConfigView:
        return await self.admin.GetPoolConfig(admin_pb2.GetPoolConfigRequest(pool="default"))

    async def limits(self) -> dict[str, int]:
        reply = await self.queries.GetAllocation(query_pb2.GetAllocationRequest(pool="default"))
        return {t.tenant: t.limit_slots for t in reply.tenants}

    def reloads(self, result: str) -> float:
        value = self.control_plane.metrics.registry.get_sample_value(RELOADS, {"result": result})
        assert value is not None, f"{RELOADS}{{result={result}}} is exported from the start"
        return value


async def _start(exits: AsyncExitStack, folder: Path, document: dict[str, Any]) -> Running:
    (folder / "admin-token").write_text(TOKEN + "\n")
    (folder / "key-digest-secret").write_text(TEST_KEY_DIGEST_SECRET + "\n")
    path = folder / "slotshift.yaml"
    if not path.exists():
        path.write_text(yaml.safe_dump(document))
    tokens = StreamTokens.for_stack(exits)
    source = ConfigSource(path, tokens.settings())
    control_plane = ControlPlane(source.load(), source=source)
    await control_plane.start()
    exits.push_async_callback(control_plane.stop)
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{control_plane.grpc_port}")
    exits.push_async_callback(channel.close, None)
    return Running(
        control_plane,
        admin_pb2_grpc.AdminServiceStub(channel),
        query_pb2_grpc.AllocationServiceStub(channel),
        path,
    )


@pytest.fixture
async def running(tmp_path: Path) -> AsyncIterator[Running]:
    async with AsyncExitStack() as exits:
        yield await _start(exits, tmp_path, _document(interval_s=0))


async def test_a_reload_applies_the_file_under_the_stored_changes(
    running: Running, tmp_path: Path
) -> None:
    await running.admin.UpdateTenant(
        admin_pb2.UpdateTenantRequest(
            pool="default", tenant="A", settings=admin_pb2.TenantSettings(floor_slots=3)
        ),
        metadata=AUTH,
    )
    document = _document(interval_s=0, weight=3.0)
    document["pools"][0]["tenants"].append({"name": "C", "api_keys": ["key-c"], "floor_slots": 4})
    running.write(document)

    outcome = await running.control_plane.reload_config("test")
    assert (outcome.result, outcome.changed_pools) == ("applied", ("default",))
    view = await running.view()
    tenants = {t.name: t for t in view.tenants}
    assert view.config_version == 3, "1 the file, 2 the admin change, 3 the reload"
    assert tenants["B"].weight == 3.0
    assert tenants["C"].floor_slots == 4 and tenants["C"].api_key_count == 1
    assert tenants["A"].floor_slots == 3, "the stored admin change stays on top"
    limits = await running.limits()
    assert set(limits) == {"A", "B", "C"} and sum(limits.values()) == 20
    assert limits["C"] >= 4
    decisions = await running.queries.GetDecisions(
        query_pb2.GetDecisionsRequest(pool="default", limit=50)
    )
    triggers = [d.trigger for d in decisions.decisions]
    assert any(
        t.startswith("config v3: config file reloaded (test): ")
        and "tenant B: weight 1.0 -> 3.0" in t
        and "tenant C added" in t
        for t in triggers
    ), triggers
    keeper = running.control_plane.keeper
    assert keeper is not None
    assert (await keeper.store.counters("default")).config_version == 3

    # The same file again: nothing runs differently, no new version.
    again = await running.control_plane.reload_config("test")
    assert again.result == "unchanged"
    assert (await running.view()).config_version == 3
    assert running.reloads("applied") == 1 and running.reloads("unchanged") == 1

    # Invalid: floors above the budget. Refused, counted, the running config kept.
    bad = _document(interval_s=0, floor_slots=30)
    running.write(bad)
    refused = await running.control_plane.reload_config("test")
    assert refused.result == "invalid"
    assert "floor_slots" in refused.message and str(running.path) in refused.message
    running.path.write_text("pools: [unclosed\n")
    assert (await running.control_plane.reload_config("test")).result == "invalid"
    assert running.reloads("invalid") == 2
    after = await running.view()
    assert after.config_version == 3
    assert {t.name for t in after.tenants} == {"A", "B", "C"}

    # A port is not changed live: refused, the running config kept.
    moved = dict(document, controlplane={**document["controlplane"], "grpc_port": 1})
    running.write(moved)
    needs = await running.control_plane.reload_config("test")
    assert needs.result == "needs_restart" and "controlplane.grpc_port" in needs.message
    assert running.reloads("needs_restart") == 1
    assert (await running.view()).config_version == 3

    # A restart on the reloaded file runs what ran, at the version the reload made.
    running.write(document)
    await running.control_plane.stop()
    async with AsyncExitStack() as exits:
        restarted = await _start(exits, tmp_path, document)
        view = await restarted.view()
        assert view.config_version == 3
        assert {t.name: t.floor_slots for t in view.tenants} == {"A": 3, "B": 2, "C": 4}


async def test_the_file_wins_over_a_stored_change_of_the_field_it_changed(
    running: Running,
) -> None:
    await running.admin.UpdateTenant(
        admin_pb2.UpdateTenantRequest(
            pool="default", tenant="B", settings=admin_pb2.TenantSettings(floor_slots=5)
        ),
        metadata=AUTH,
    )
    running.write(_document(interval_s=0, floor_slots=6))
    assert (await running.control_plane.reload_config("test")).result == "applied"
    assert {t.name: t.floor_slots for t in (await running.view()).tenants}["B"] == 6
    keeper = running.control_plane.keeper
    assert keeper is not None
    (stored,) = await keeper.store.changes("default")
    assert stored.dropped_reason is not None
    assert "tenants/B/floor_slots (was 2, now 6)" in stored.dropped_reason
    # The next admin change records what the new file says of its field.
    changed = await running.admin.UpdateTenant(
        admin_pb2.UpdateTenantRequest(
            pool="default", tenant="B", settings=admin_pb2.TenantSettings(weight=2.0)
        ),
        metadata=AUTH,
    )
    assert changed.config.config_version == 4
    assert (await keeper.live_changes("default"))[0].file_fields == {"tenants/B/weight": "1.0"}


async def test_the_watch_reloads_a_changed_file(tmp_path: Path) -> None:
    async with AsyncExitStack() as exits:
        running = await _start(exits, tmp_path, _document(interval_s=0.05))
        running.write(_document(interval_s=0.05, weight=4.0))

        async def weight_of_b() -> float:
            return {t.name: t.weight for t in (await running.view()).tenants}["B"]

        await wait_until(lambda: _equals(weight_of_b(), 4.0), timeout_s=10, message="reload")
        assert (await running.view()).config_version == 2
        assert running.reloads("applied") == 1
        # A key file it names is watched too: a key added there is a key change.
        keys = tmp_path / "b-keys"
        keys.write_text("key-b2\n")
        running.write(_document(interval_s=0.05, weight=4.0, api_keys_file="b-keys"))
        await wait_until(lambda: _key_count_of_b(running, 2), timeout_s=10, message="a key")
        keys.write_text("key-b2\nkey-b3\n")
        await wait_until(lambda: _key_count_of_b(running, 3), timeout_s=10, message="a key")


async def _equals(value: Any, expected: Any) -> bool:
    return bool(await value == expected)


async def _key_count_of_b(running: Running, count: int) -> bool:
    return {t.name: t.api_key_count for t in (await running.view()).tenants}["B"] == count
