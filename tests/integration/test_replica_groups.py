"""Integration, real servers on port 0 in one process: a replica group of two emulators serving
one model (budgets 8 and 4), its two tenants stated once, behind one gateway. Each replica
gives each tenant its share by the group's weights within its own budget, with the group's
floors divided by budget; both tenants are served on both replicas, no engine ever holds more
than its own budget, and the admin API refuses a tenant change on a member."""

from __future__ import annotations

import asyncio
import functools
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from pathlib import Path

import grpc
import openai
import pytest

from slotshift.config import SlotshiftConfig, parse_config, resolve_path
from slotshift.v1 import admin_pb2, admin_pb2_grpc
from tests.integration.stack import Fleet, start_fleet
from tests.support import wait_until

pytestmark = pytest.mark.integration

KEY_A = "sk-group-tenant-a-7e41b9"
KEY_B = "sk-group-tenant-b-c20d5f"
TOKEN = "admin-token-replica-groups-0b7d"
AUTH = (("authorization", f"Bearer {TOKEN}"),)
MODEL = "small"
POOLS = {"small-a": MODEL, "small-b": MODEL}
BUDGETS = {"small-a": 8, "small-b": 4}
# Nominal shares by weight 3 : 1 within each budget; floors 4 and 2 divided by 8 : 4.
SHARES = {"small-a": {"A": 6, "B": 2}, "small-b": {"A": 3, "B": 1}}
FLOORS = {"small-a": {"A": 3, "B": 1}, "small-b": {"A": 1, "B": 1}}


def _config(token_file: str, urls: dict[str, str], grpc_port: int) -> SlotshiftConfig:
    return parse_config(
        {
            "replica_groups": [
                {
                    "name": "small",
                    "tenants": [
                        {"name": "A", "api_keys": [KEY_A], "weight": 3, "floor_slots": 4},
                        {"name": "B", "api_keys": [KEY_B], "weight": 1, "floor_slots": 2},
                    ],
                }
            ],
            "pools": [
                {
                    "name": pool,
                    "replica_group": "small",
                    "models": [MODEL],
                    "budget_slots": BUDGETS[pool],
                    "policy": "static",
                    "engine_url": urls[pool],
                }
                for pool in POOLS
            ],
            "controlplane": {
                "grpc_port": grpc_port,
                "metrics_port": 0,
                "admin_token_file": token_file,
            },
            "gateway": {
                "pools": list(POOLS),
                "port": 0,
                "controlplane_target": f"127.0.0.1:{grpc_port}",
                "report_interval_s": 0.05,
            },
            "engine_sim": {"port": 0},
        }
    )


@pytest.fixture
async def fleet(tmp_path: Path) -> AsyncIterator[Fleet]:
    token_file = resolve_path("admin-token", tmp_path)
    await asyncio.to_thread(Path(token_file).write_text, f"{TOKEN}\n")
    async with AsyncExitStack() as exits:

        def config(urls: dict[str, str], grpc_port: int) -> SlotshiftConfig:
            return _config(token_file, urls, grpc_port)

        yield await start_fleet(exits, config, POOLS)


async def test_a_groups_tenants_get_their_shares_on_both_replicas(fleet: Fleet) -> None:
    gateway = fleet.gateways[0]

    def shares_held(pool: str) -> bool:
        decided = dict(fleet.control_plane.pools[pool].allocation.tenant_limits)
        tenants = gateway.states[pool].tenants
        enforced = {t: s.admission.limit_slots for t, s in tenants.items()}
        return decided == enforced == SHARES[pool]

    for pool in POOLS:
        state = fleet.control_plane.pools[pool]
        assert {t.name: t.floor_slots for t in state.pool.tenants} == FLOORS[pool]
        await wait_until(
            functools.partial(shares_held, pool),
            message=f"{pool}: the group's shares decided and enforced",
        )

    served = {"A": 0, "B": 0}
    stop = asyncio.Event()

    async def user(client: openai.AsyncOpenAI, tenant: str) -> None:
        while not stop.is_set():
            await client.completions.create(
                model=MODEL, prompt="hi", max_tokens=16, extra_body={"ignore_eos": True}
            )
            served[tenant] += 1

    async with (
        openai.AsyncOpenAI(base_url=gateway.url + "/v1", api_key=KEY_A, max_retries=0) as a,
        openai.AsyncOpenAI(base_url=gateway.url + "/v1", api_key=KEY_B, max_retries=0) as b,
        asyncio.TaskGroup() as users,
    ):
        # More users than each tenant's shares together (A 9, B 3): every replica is full,
        # each tenant at its share there.
        for index in range(20):
            tenant, client = ("A", a) if index < 14 else ("B", b)
            users.create_task(user(client, tenant), name=f"user-{tenant}-{index}")
        await wait_until(
            lambda: all(
                gateway.states[pool].tenants[t].admission.in_flight == share
                for pool in POOLS
                for t, share in SHARES[pool].items()
            ),
            message="each tenant runs its share on each replica",
        )
        await wait_until(lambda: min(served.values()) >= 10, message="both tenants served")
        stop.set()
    for pool, engine in fleet.engines.items():
        assert engine.completed_count > 0, f"{pool} served"
        assert engine.peak_in_server <= BUDGETS[pool], f"{pool} held more than its budget"


@pytest.mark.parametrize(
    "call",
    [
        pytest.param(admin_pb2.AddTenantRequest(pool="small-a", tenant="C"), id="add"),
        pytest.param(admin_pb2.RemoveTenantRequest(pool="small-b", tenant="B"), id="remove"),
        pytest.param(
            admin_pb2.UpdateTenantRequest(
                pool="small-a", tenant="A", settings=admin_pb2.TenantSettings(floor_slots=5)
            ),
            id="update",
        ),
    ],
)
async def test_a_tenant_change_on_a_member_is_refused_naming_the_group(
    fleet: Fleet, call: object
) -> None:
    async with grpc.aio.insecure_channel(f"127.0.0.1:{fleet.control_plane.grpc_port}") as ch:
        admin = admin_pb2_grpc.AdminServiceStub(ch)
        method = {
            admin_pb2.AddTenantRequest: admin.AddTenant,
            admin_pb2.RemoveTenantRequest: admin.RemoveTenant,
            admin_pb2.UpdateTenantRequest: admin.UpdateTenant,
        }[type(call)]
        pool = call.pool  # type: ignore[attr-defined]
        before = await admin.GetPoolConfig(admin_pb2.GetPoolConfigRequest(pool=pool))
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await method(call, metadata=AUTH)  # type: ignore[operator]
        assert raised.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert "replica group small" in (raised.value.details() or "")
        assert "replica_groups" in (raised.value.details() or "")
        after = await admin.GetPoolConfig(admin_pb2.GetPoolConfigRequest(pool=pool))
        assert after == before
        assert {t.name for t in after.tenants} == {"A", "B"}
