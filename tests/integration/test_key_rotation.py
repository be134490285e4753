"""Integration, real servers on port 0: a tenant's key rotated through the admin API. A key added
works at every gateway within a moment, a revoked one gets 401, and the tenant's other key never
fails meanwhile; the rotation neither makes a decision nor moves the tenant's share; it survives a
restart (SQLite beside the config); errors are NOT_FOUND, ALREADY_EXISTS, FAILED_PRECONDITION."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from contextlib import AsyncExitStack
from pathlib import Path

import aiohttp
import grpc
import pytest

from slotshift.v1 import admin_pb2
from tests.integration.test_admin_api import AUTH, Stack, _start, _statuses
from tests.support import wait_until


@pytest.fixture
async def http() -> AsyncIterator[aiohttp.ClientSession]:
    async with aiohttp.ClientSession() as session:
        yield session


async def _started(tmp_path: Path, exits: AsyncExitStack) -> Stack:
    stack = await _start(tmp_path, exits, token=True, gateways=2)
    await wait_until(lambda: all(g.state.applied_version > 0 for g in stack.gateways), timeout_s=5)
    return stack


async def _tenant_view(stack: Stack, name: str) -> admin_pb2.TenantConfigView:
    view = await stack.admin.GetPoolConfig(admin_pb2.GetPoolConfigRequest(pool="default"))
    return next(t for t in view.tenants if t.name == name)


async def _keep_asking(
    http: aiohttp.ClientSession, stack: Stack, key: str, seen: list[set[int]]
) -> None:
    """Ask every gateway with `key` until cancelled, keeping what each round answered."""
    while True:
        seen.append(await _statuses(http, stack, key))
        await asyncio.sleep(0.01)


async def test_a_rotated_key_works_and_a_revoked_one_is_refused_while_the_other_never_fails(
    tmp_path: Path, http: aiohttp.ClientSession
) -> None:
    async with AsyncExitStack() as exits:
        stack = await _started(tmp_path, exits)
        version = stack.control_plane.pools["default"].config_version
        seen: list[set[int]] = []
        asking = asyncio.create_task(_keep_asking(http, stack, "key-a", seen), name="ask-key-a")
        try:
            assert await _statuses(http, stack, "key-a-2") == {401}
            added = await stack.admin.AddKey(
                admin_pb2.AddKeyRequest(tenant="A", api_key="key-a-2"), metadata=AUTH
            )
            assert len(added.key_id) == 8
            assert "key-a-2" not in str(added)
            (config,) = added.configs
            tenant = next(t for t in config.tenants if t.name == "A")
            assert tenant.api_key_count == 2
            assert list(tenant.api_key_ids)[1] == added.key_id

            async def rotated_in() -> bool:
                return await _statuses(http, stack, "key-a-2") == {200}

            await wait_until(rotated_in, timeout_s=5, message="the added key works everywhere")
            revoked = await stack.admin.RevokeKey(
                admin_pb2.RevokeKeyRequest(tenant="A", api_key="key-a"), metadata=AUTH
            )
            assert revoked.key_id == tenant.api_key_ids[0]

            async def revoked_out() -> bool:
                return await _statuses(http, stack, "key-a") == {401}

            await wait_until(revoked_out, timeout_s=5, message="the revoked key is refused")
        finally:
            asking.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await asking
        # key-a answered 200 everywhere until its revocation, then 401 everywhere: never a
        # failure while it was the tenant's key.
        assert seen[0] == {200}
        first_refused = next((i for i, s in enumerate(seen) if 401 in s), len(seen))
        assert all(s == {200} for s in seen[:first_refused])
        assert all(s <= {200, 401} for s in seen)
        assert await _statuses(http, stack, "key-a-2") == {200}
        state = stack.control_plane.pools["default"]
        # No decision is made for a key (only the periodic ones), the config version moved
        # twice.
        assert not [r for r in state.decisions.newest(1000) if r.trigger.startswith("config")]
        assert state.config_version == version + 2

    # A restart brings the rotation back from the state store.
    async with AsyncExitStack() as exits:
        stack = await _started(tmp_path, exits)
        tenant = await _tenant_view(stack, "A")
        assert tenant.api_key_count == 1
        assert list(tenant.api_key_ids) == [revoked_id_of(added.key_id, tenant)]

        async def restored() -> bool:
            return await _statuses(http, stack, "key-a-2") == {200} and await _statuses(
                http, stack, "key-a"
            ) == {401}

        await wait_until(restored, timeout_s=5, message="the rotation survives the restart")


def revoked_id_of(added_id: str, tenant: admin_pb2.TenantConfigView) -> str:
    """The one key id left after the rotation: the added key's."""
    assert added_id in tenant.api_key_ids
    return added_id


async def test_key_changes_refuse_what_they_cannot_do(tmp_path: Path) -> None:
    async with AsyncExitStack() as exits:
        stack = await _started(tmp_path, exits)
        cases = [
            (admin_pb2.AddKeyRequest(tenant="nobody", api_key="k"), grpc.StatusCode.NOT_FOUND),
            (admin_pb2.AddKeyRequest(tenant="A", api_key="key-a"), grpc.StatusCode.ALREADY_EXISTS),
            (
                admin_pb2.AddKeyRequest(tenant="A", api_key="key-b"),
                grpc.StatusCode.INVALID_ARGUMENT,
            ),
            (admin_pb2.AddKeyRequest(tenant="A", api_key="a b"), grpc.StatusCode.INVALID_ARGUMENT),
            (admin_pb2.AddKeyRequest(tenant="A", api_key=""), grpc.StatusCode.INVALID_ARGUMENT),
        ]
        for request, code in cases:
            with pytest.raises(grpc.aio.AioRpcError) as raised:
                await stack.admin.AddKey(request, metadata=AUTH)
            assert raised.value.code() == code, request
            assert "key-b" not in (raised.value.details() or "")
        revocations = [
            (admin_pb2.RevokeKeyRequest(tenant="A", api_key="never"), grpc.StatusCode.NOT_FOUND),
            (admin_pb2.RevokeKeyRequest(tenant="A", key_id="00000000"), grpc.StatusCode.NOT_FOUND),
            (admin_pb2.RevokeKeyRequest(tenant="A", api_key="key-b"), grpc.StatusCode.NOT_FOUND),
            (admin_pb2.RevokeKeyRequest(tenant="x", api_key="key-a"), grpc.StatusCode.NOT_FOUND),
            (
                admin_pb2.RevokeKeyRequest(tenant="A", api_key="key-a"),
                grpc.StatusCode.FAILED_PRECONDITION,
            ),
            (admin_pb2.RevokeKeyRequest(tenant="A"), grpc.StatusCode.INVALID_ARGUMENT),
        ]
        for revocation, code in revocations:
            with pytest.raises(grpc.aio.AioRpcError) as raised:
                await stack.admin.RevokeKey(revocation, metadata=AUTH)
            assert raised.value.code() == code, revocation
        with pytest.raises(grpc.aio.AioRpcError) as raised:
            await stack.admin.AddKey(admin_pb2.AddKeyRequest(tenant="A", api_key="new"))
        assert raised.value.code() == grpc.StatusCode.UNAUTHENTICATED
        tenant = await _tenant_view(stack, "A")
        assert tenant.api_key_count == 1
        # By id, and with allow_no_key the last key may go: the tenant stays, keyless.
        response = await stack.admin.RevokeKey(
            admin_pb2.RevokeKeyRequest(
                tenant="A", key_id=tenant.api_key_ids[0].upper(), allow_no_key=True
            ),
            metadata=AUTH,
        )
        assert response.key_id == tenant.api_key_ids[0]
        tenant = await _tenant_view(stack, "A")
        assert (tenant.api_key_count, list(tenant.api_key_ids)) == (0, [])
