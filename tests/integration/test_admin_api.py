"""Integration, real servers on port 0: the admin API changes a running pool. An added tenant's
key works at the gateways within a moment and the tenant gets slots; updates show in the config
and the decision log; invalid changes name their field and change nothing; a removed tenant's key
is refused and its slots go to the others; mutating calls need the admin token."""

from __future__ import annotations

import logging
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from admission_gateway.gateway import AdmissionGateway
from controlplane.server import SERVICE_NAMES, ControlPlane
from slotshift.config import SlotshiftConfig, load_config
from slotshift.v1 import admin_pb2, admin_pb2_grpc, query_pb2, query_pb2_grpc
from tests.integration.stack import start_stack
from tests.support import TEST_KEY_DIGEST_SECRET, wait_until

BUDGET = 20
TOKEN = "test-admin-token"
AUTH = (("authorization", f"Bearer {TOKEN}"),)
MODEL = "Qwen/Qwen2.5-3B-Instruct"


@dataclass
class Stack:
    control_plane: ControlPlane
    gateways: list[AdmissionGateway]
    admin: admin_pb2_grpc.AdminServiceAsyncStub
    queries: query_pb2_grpc.AllocationServiceAsyncStub
    channel: grpc.aio.Channel


def _config(tmp_path: Path, engine_url: str, grpc_port: int, *, token: bool) -> SlotshiftConfig:
    """Loaded from a file, as the services load it: the token file is relative to it."""
    (tmp_path / "admin-token").write_text(f"{TOKEN}\n")
    (tmp_path / "key-digest-secret").write_text(f"{TEST_KEY_DIGEST_SECRET}\n")
    token_line = "  admin_token_file: admin-token\n" if token else ""
    (tmp_path / "slotshift.yaml").write_text(
        f"""
pools:
  - name: default
    budget_slots: {BUDGET}
    decision_period_s: 0.2
    engine_url: {engine_url}
    tenants:
      - {{name: A, api_keys: [key-a], floor_slots: 2}}
      - {{name: B, api_keys: [key-b], floor_slots: 2}}
tenant_keys:
  key_digest_secret_file: key-digest-secret
controlplane:
  grpc_port: {grpc_port}
  metrics_port: 0
  gateway_lease_ttl_s: 0.5   # a short start-up hold: slots move from the first moment
{token_line}gateway:
  port: 0
  controlplane_target: 127.0.0.1:{grpc_port}
  report_interval_s: 0.05
engine_sim:
  port: 0
"""
    )
    return load_config(tmp_path / "slotshift.yaml")


async def _start(tmp_path: Path, exits: AsyncExitStack, *, token: bool, gateways: int) -> Stack:
    started = await start_stack(
        exits, lambda url, port: _config(tmp_path, url, port, token=token), gateways=gateways
    )
    control_plane = started.control_plane
    channel = grpc.aio.insecure_channel(f"127.0.0.1:{control_plane.grpc_port}")
    exits.push_async_callback(channel.close, None)
    return Stack(
        control_plane,
        started.gateways,
        admin_pb2_grpc.AdminServiceStub(channel),
        query_pb2_grpc.AllocationServiceStub(channel),
        channel,
    )


@pytest.fixture
async def stack(tmp_path: Path) -> AsyncIterator[Stack]:
    async with AsyncExitStack() as exits:
        stack = await _start(tmp_path, exits, token=True, gateways=2)
        await wait_until(
            lambda: all(g.state.applied_version > 0 for g in stack.gateways), timeout_s=5
        )
        yield stack


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


async def _status(http: aiohttp.ClientSession, gateway: AdmissionGateway, key: str) -> int:
    """The status of a completion with `key` (which a gateway admits only within its limit)."""
    payload = {"model": MODEL, "prompt": "hi", "max_tokens": 2, "ignore_eos": True}
    async with http.post(
        f"{gateway.url}/v1/completions",
        json=payload,
        headers={"Authorization": f"Bearer {key}"},
    ) as response:
        await response.read()
        return response.status


async def _statuses(http: aiohttp.ClientSession, stack: Stack, key: str) -> set[int]:
    """What every gateway answers `key` on /v1/models (authenticated, never queued)."""
    statuses = set()
    for gateway in stack.gateways:
        async with http.get(
            f"{gateway.url}/v1/models", headers={"Authorization": f"Bearer {key}"}
        ) as response:
            await response.read()
            statuses.add(response.status)
    return statuses


async def _config_version(stack: Stack) -> int:
    view = await stack.admin.GetPoolConfig(admin_pb2.GetPoolConfigRequest(pool="default"))
    return view.config_version


async def _gateway_targets(stack: Stack) -> dict[str, int]:
    """tenant -> the sum of its targets over the gateways, as the control plane publishes it."""
    allocation = await stack.queries.GetAllocation(query_pb2.GetAllocationRequest(pool="default"))
    totals: dict[str, int] = {}
    for gateway in allocation.gateways:
        for limit in gateway.tenants:
            totals[limit.tenant] = totals.get(limit.tenant, 0) + limit.target_slots
    return totals


async def test_an_added_tenant_authenticates_and_gets_slots(
    stack: Stack, http: aiohttp.ClientSession, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.DEBUG)
    assert await _statuses(http, stack, "key-c") == {401}
    reply = await stack.admin.AddTenant(
        admin_pb2.AddTenantRequest(
            pool="default",
            tenant="C",
            api_keys=["key-c"],
            settings=admin_pb2.TenantSettings(floor_slots=3, weight=2.0, ttft_slo_ms=400),
        ),
        metadata=AUTH,
    )
    assert reply.config.config_version == 2
    tenant_c = reply.config.tenants[-1]
    assert (tenant_c.name, tenant_c.floor_slots, tenant_c.weight) == ("C", 3, 2.0)
    assert tenant_c.ttft_slo_ms == 400 and not tenant_c.HasField("ceiling_slots")
    assert tenant_c.api_key_count == 1

    async def accepted() -> bool:
        return await _statuses(http, stack, "key-c") == {200}

    await wait_until(accepted, timeout_s=5, message="the gateways to accept C's key")
    assert await _statuses(http, stack, "key-a") == {200}
    # C's requests are admitted, not only authenticated.
    assert await _status(http, stack.gateways[0], "key-c") == 200
    allocation = await stack.queries.GetAllocation(query_pb2.GetAllocationRequest(pool="default"))
    limits = {t.tenant: t.limit_slots for t in allocation.tenants}
    assert set(limits) == {"A", "B", "C"} and sum(limits.values()) == BUDGET
    assert limits["C"] >= 3
    assert await _gateway_targets(stack) == limits
    decisions = await stack.queries.GetDecisions(
        query_pb2.GetDecisionsRequest(pool="default", limit=500)
    )
    recorded = [d for d in decisions.decisions if d.id == reply.decision_id]
    assert [d.trigger for d in recorded] == ["config v2: added tenant C"]
    # The key is never returned, logged or kept in the clear.
    assert b"key-c" not in reply.SerializeToString()
    assert "key-c" not in caplog.text
    assert "C" in stack.control_plane.pools["default"].key_digests


async def test_updates_show_in_the_config_and_the_decision_log(stack: Stack) -> None:
    reply = await stack.admin.UpdateTenant(
        admin_pb2.UpdateTenantRequest(
            pool="default",
            tenant="A",
            settings=admin_pb2.TenantSettings(floor_slots=12, weight=3.0, e2e_slo_ms=900),
        ),
        metadata=AUTH,
    )
    view = await stack.admin.GetPoolConfig(admin_pb2.GetPoolConfigRequest(pool="default"))
    assert view == reply.config
    assert view.config_version == 2
    tenant_a = view.tenants[0]
    assert (tenant_a.floor_slots, tenant_a.weight, tenant_a.e2e_slo_ms) == (12, 3.0, 900)
    allocation = await stack.queries.GetAllocation(query_pb2.GetAllocationRequest(pool="default"))
    limits = {t.tenant: t.limit_slots for t in allocation.tenants}
    assert limits["A"] >= 12 and sum(limits.values()) == BUDGET
    floors = {t.tenant: t.floor_slots for t in allocation.tenants}
    assert floors == {"A": 12, "B": 2}
    decisions = await stack.queries.GetDecisions(
        query_pb2.GetDecisionsRequest(pool="default", limit=500)
    )
    triggers = {d.id: d.trigger for d in decisions.decisions}
    assert triggers[reply.decision_id] == (
        "config v2: updated tenant A: floor_slots=12, weight=3.0, e2e_slo_ms=900.0"
    )
    cleared = await stack.admin.UpdateTenant(
        admin_pb2.UpdateTenantRequest(pool="default", tenant="A", clear=["e2e_slo_ms"]),
        metadata=AUTH,
    )
    assert not cleared.config.tenants[0].HasField("e2e_slo_ms")
    assert cleared.config.config_version == 3
    policy = await stack.admin.SetPolicy(
        admin_pb2.SetPolicyRequest(pool="default", policy="slo"), metadata=AUTH
    )
    assert (policy.config.policy, policy.config.config_version) == ("slo", 4)
    decisions = await stack.queries.GetDecisions(
        query_pb2.GetDecisionsRequest(pool="default", limit=500)
    )
    newest_by_id = {d.id: d for d in decisions.decisions}
    assert newest_by_id[policy.decision_id].policy == "slo"


@pytest.mark.parametrize(
    ("call", "code", "field"),
    [
        (
            admin_pb2.UpdateTenantRequest(
                pool="default", tenant="A", settings=admin_pb2.TenantSettings(floor_slots=19)
            ),
            grpc.StatusCode.INVALID_ARGUMENT,
            "tenant.floor_slots: ",
        ),
        (
            admin_pb2.UpdateTenantRequest(
                pool="default", tenant="A", settings=admin_pb2.TenantSettings(floor_slots=-1)
            ),
            grpc.StatusCode.INVALID_ARGUMENT,
            "tenant.floor_slots: ",
        ),
        (
            admin_pb2.UpdateTenantRequest(
                pool="default", tenant="A", settings=admin_pb2.TenantSettings(weight=-2)
            ),
            grpc.StatusCode.INVALID_ARGUMENT,
            "tenant.weight: ",
        ),
        (
            admin_pb2.UpdateTenantRequest(
                pool="default", tenant="Z", settings=admin_pb2.TenantSettings(weight=2)
            ),
            grpc.StatusCode.NOT_FOUND,
            "tenant: ",
        ),
        (
            admin_pb2.AddTenantRequest(pool="default", tenant="B", api_keys=["key-x"]),
            grpc.StatusCode.INVALID_ARGUMENT,
            "tenant.name: ",
        ),
        (
            admin_pb2.AddTenantRequest(pool="default", tenant="C", api_keys=["key-a"]),
            grpc.StatusCode.INVALID_ARGUMENT,
            "tenant.api_keys: ",
        ),
        (
            admin_pb2.AddTenantRequest(pool="nowhere", tenant="C", api_keys=["key-c"]),
            grpc.StatusCode.NOT_FOUND,
            "pool: ",
        ),
        (
            admin_pb2.RemoveTenantRequest(pool="default", tenant="Z"),
            grpc.StatusCode.NOT_FOUND,
            "tenant: ",
        ),
        (
            admin_pb2.SetPolicyRequest(pool="default", policy="fastest"),
            grpc.StatusCode.INVALID_ARGUMENT,
            "policy: ",
        ),
    ],
)
async def test_invalid_changes_name_the_field_and_change_nothing(
    stack: Stack, call: object, code: grpc.StatusCode, field: str
) -> None:
    before = await stack.admin.GetPoolConfig(admin_pb2.GetPoolConfigRequest(pool="default"))
    version_before = stack.control_plane.pools["default"].allocation.tenant_limits
    method = {
        admin_pb2.UpdateTenantRequest: stack.admin.UpdateTenant,
        admin_pb2.AddTenantRequest: stack.admin.AddTenant,
        admin_pb2.RemoveTenantRequest: stack.admin.RemoveTenant,
        admin_pb2.SetPolicyRequest: stack.admin.SetPolicy,
    }[type(call)]
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await method(call, metadata=AUTH)  # type: ignore[operator]
    assert raised.value.code() == code
    assert (raised.value.details() or "").startswith(field)
    assert await stack.admin.GetPoolConfig(admin_pb2.GetPoolConfigRequest(pool="default")) == before
    assert before.config_version == 1
    assert stack.control_plane.pools["default"].allocation.tenant_limits == version_before


async def test_a_removed_tenant_is_refused_and_its_slots_go_to_the_others(
    stack: Stack, http: aiohttp.ClientSession
) -> None:
    assert await _status(http, stack.gateways[0], "key-b") == 200
    reply = await stack.admin.RemoveTenant(
        admin_pb2.RemoveTenantRequest(pool="default", tenant="B"), metadata=AUTH
    )
    assert [t.name for t in reply.config.tenants] == ["A"]

    async def refused() -> bool:
        return await _statuses(http, stack, "key-b") == {401}

    await wait_until(refused, timeout_s=5, message="the gateways to refuse B's key")

    async def all_to_a() -> bool:
        return await _gateway_targets(stack) == {"A": BUDGET}

    await wait_until(all_to_a, timeout_s=5, message="B's slots to go to A")
    assert await _status(http, stack.gateways[0], "key-a") == 200
    await wait_until(
        lambda: all(g.admission("B").limit_slots == 0 for g in stack.gateways),
        timeout_s=5,
        message="B's limit to be 0 at every gateway",
    )
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await stack.admin.RemoveTenant(
            admin_pb2.RemoveTenantRequest(pool="default", tenant="A"), metadata=AUTH
        )
    assert raised.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert (raised.value.details() or "").startswith("tenant: 'A' is the last tenant")


@pytest.mark.parametrize(
    "metadata",
    [(), (("authorization", "Bearer wrong-token"),), (("authorization", TOKEN),)],
    ids=["missing", "wrong", "no-bearer"],
)
async def test_changes_need_the_admin_token(
    stack: Stack, metadata: tuple[tuple[str, str], ...]
) -> None:
    request = admin_pb2.SetPolicyRequest(pool="default", policy="static")
    with pytest.raises(grpc.aio.AioRpcError) as raised:
        await stack.admin.SetPolicy(request, metadata=metadata)
    assert raised.value.code() == grpc.StatusCode.UNAUTHENTICATED
    assert (raised.value.details() or "").startswith("authorization: ")
    assert await _config_version(stack) == 1


async def test_the_admin_service_is_served_reflected_and_healthy(stack: Stack) -> None:
    assert "slotshift.v1.AdminService" in SERVICE_NAMES
    health = health_pb2_grpc.HealthStub(stack.channel)
    reply = await health.Check(health_pb2.HealthCheckRequest(service="slotshift.v1.AdminService"))
    assert reply.status == health_pb2.HealthCheckResponse.SERVING


async def test_without_a_token_configured_changes_are_refused(tmp_path: Path) -> None:
    async with AsyncExitStack() as exits:
        stack = await _start(tmp_path, exits, token=False, gateways=0)
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await stack.admin.RemoveTenant(
                admin_pb2.RemoveTenantRequest(pool="default", tenant="B"), metadata=AUTH
            )
        assert raised.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "controlplane.admin_token_file" in (raised.value.details() or "")
        assert await _config_version(stack) == 1
