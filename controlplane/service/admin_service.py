"""AdminService: changes a pool's tenants and policy at run time (proto/slotshift/v1/admin.proto).

Each change is built as a whole new pool config and validated (controlplane/core/config_change.py);
the running config is replaced only when the new one is valid. An accepted change bumps the pool's
config version, is pushed to the gateways (the tenant directory, then a new allocation) and is
decided on at once, so that the decision log records it (`trigger`: "config vN: ...").

Mutating RPCs need the admin token as `authorization: Bearer TOKEN` metadata, compared in
constant time; with no token configured they are refused. API keys in requests are turned into
SHA-256 digests at once and never logged, traced or returned.
"""

from __future__ import annotations

import contextlib
import hmac
import logging
from collections.abc import Callable, Mapping

import grpc

from controlplane.core.config_change import (
    ConfigChangeError,
    UnknownTenantError,
    add_tenant,
    check_new_keys,
    remove_tenant,
    set_policy,
    update_tenant,
)
from controlplane.runtime import PoolRuntime
from controlplane.service import convert
from controlplane.service.lookup import find_pool
from slotshift.config import PoolConfig
from slotshift.keys import BearerError, bearer_token, key_digest
from slotshift.v1 import admin_pb2, admin_pb2_grpc

logger = logging.getLogger(__name__)

_Context = grpc.aio.ServicerContext[object, object]
_Change = tuple[PoolConfig, Mapping[str, tuple[bytes, ...]], str]
"""A validated change: the new config, every tenant's key digests, and what changed in words."""


class PoolAdminService(admin_pb2_grpc.AdminServiceServicer):
    """The admin API over the pools' runtimes (controlplane/runtime.py), which apply the changes.

    admin_token: the token mutating calls must present; None refuses them all.
    """

    def __init__(
        self,
        runtimes: Mapping[str, PoolRuntime],
        *,
        admin_token: str | None,
    ) -> None:
        self._runtimes = runtimes
        self._token_digest = None if admin_token is None else key_digest(admin_token)

    async def AddTenant(
        self, request: admin_pb2.AddTenantRequest, context: _Context
    ) -> admin_pb2.ConfigChangeResponse:
        runtime = await self._authorized_runtime(request.pool, context)
        state = runtime.state

        def change() -> _Change:
            name = _required("tenant", request.tenant)
            digests = check_new_keys(name, request.api_keys, state.key_digests)
            pool = add_tenant(state.pool, name, convert.settings_from_proto(request.settings))
            return pool, {**state.key_digests, name: digests}, f"added tenant {name}"

        return await self._apply(runtime, change, context)

    async def RemoveTenant(
        self, request: admin_pb2.RemoveTenantRequest, context: _Context
    ) -> admin_pb2.ConfigChangeResponse:
        runtime = await self._authorized_runtime(request.pool, context)
        state = runtime.state

        def change() -> _Change:
            name = _required("tenant", request.tenant)
            pool = remove_tenant(state.pool, name)
            return pool, state.key_digests, f"removed tenant {name}"

        return await self._apply(runtime, change, context)

    async def UpdateTenant(
        self, request: admin_pb2.UpdateTenantRequest, context: _Context
    ) -> admin_pb2.ConfigChangeResponse:
        runtime = await self._authorized_runtime(request.pool, context)
        state = runtime.state

        def change() -> _Change:
            name = _required("tenant", request.tenant)
            settings = convert.settings_from_proto(request.settings)
            pool = update_tenant(state.pool, name, settings, request.clear)
            changed = [f"{k}={v}" for k, v in settings.items()]
            changed += [f"{k} cleared" for k in request.clear]
            what = f"updated tenant {name}: {', '.join(changed) or 'nothing'}"
            return pool, state.key_digests, what

        return await self._apply(runtime, change, context)

    async def SetPolicy(
        self, request: admin_pb2.SetPolicyRequest, context: _Context
    ) -> admin_pb2.ConfigChangeResponse:
        runtime = await self._authorized_runtime(request.pool, context)
        state = runtime.state

        def change() -> _Change:
            policy = _required("policy", request.policy)
            pool = set_policy(state.pool, policy)
            return pool, state.key_digests, f"policy {state.pool.policy} -> {policy}"

        return await self._apply(runtime, change, context)

    async def GetPoolConfig(
        self, request: admin_pb2.GetPoolConfigRequest, context: _Context
    ) -> admin_pb2.PoolConfigView:
        state = (await self._runtime(request.pool, context)).state
        return convert.pool_config_to_proto(state.pool, state.config_version, state.key_digests)

    async def _apply(
        self, runtime: PoolRuntime, change: Callable[[], _Change], context: _Context
    ) -> admin_pb2.ConfigChangeResponse:
        state = runtime.state
        try:
            pool, digests, what = change()
        except ConfigChangeError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
            raise  # abort raises; this tells the type checker
        except UnknownTenantError as exc:
            await context.abort(grpc.StatusCode.NOT_FOUND, str(exc))
            raise
        record = runtime.change_config(pool, digests, what)
        return admin_pb2.ConfigChangeResponse(
            config=convert.pool_config_to_proto(pool, state.config_version, state.key_digests),
            decision_id=record.id,
            allocation_version=state.allocation.version,
        )

    async def _authorized_runtime(self, pool: str, context: _Context) -> PoolRuntime:
        await self._authorize(context)
        return await self._runtime(pool, context)

    async def _authorize(self, context: _Context) -> None:
        if self._token_digest is None:
            await context.abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                "the admin API is off: no admin token is configured (put one in a file and set "
                "controlplane.admin_token_file to its path)",
            )
            return
        presented = ""
        for key, value in context.invocation_metadata() or ():
            if key.lower() == "authorization" and isinstance(value, str):
                with contextlib.suppress(BearerError):
                    presented = bearer_token(value)
        if not hmac.compare_digest(key_digest(presented), self._token_digest):
            await context.abort(
                grpc.StatusCode.UNAUTHENTICATED,
                "authorization: send the admin token as 'authorization: Bearer TOKEN' metadata",
            )

    async def _runtime(self, name: str, context: _Context) -> PoolRuntime:
        return await find_pool(self._runtimes, name, context)


def _required(field: str, value: str) -> str:
    if not value:
        raise ConfigChangeError(field, "required")
    return value
