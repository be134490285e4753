"""AdminService: changes a pool's tenants and policy at run time (proto/slotshift/v1/admin.proto).

Each change is built as a whole new pool config and validated (controlplane/core/config_change.py);
the running config is replaced only when the new one is valid. An accepted change bumps the pool's
config version, is pushed to the gateways (the tenant directory, then a new allocation) and is
decided on at once, so that the decision log records it (`trigger`: "config vN: ...").

A change is an override of the config file (controlplane/core/overrides.py): it is stored
(`record`: the state store, controlplane/state_keeper.py) before it applies, and answered only
once stored, so that a restart brings it back; a store that cannot take it fails the call with
UNAVAILABLE and nothing changes. Changes to one pool are made one at a time.

Mutating RPCs need the admin token as `authorization: Bearer TOKEN` metadata, compared in
constant time; with no token configured they are refused. API keys in requests are turned into
SHA-256 digests at once and never logged, traced or returned.
"""

from __future__ import annotations

import asyncio
import contextlib
import hmac
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Protocol

import grpc

from controlplane.core.config_change import (
    ConfigChangeError,
    UnknownTenantError,
    check_fleet_keys,
    check_new_keys,
)
from controlplane.core.overrides import Override, OverrideKind, apply, file_fields_of
from controlplane.runtime import PoolRuntime
from controlplane.service import convert
from controlplane.service.lookup import find_pool
from controlplane.store.base import ChangeConflict, StoreError
from slotshift.clock import Clock, SystemClock
from slotshift.config import PoolConfig
from slotshift.keys import BearerError, bearer_token, key_digest
from slotshift.v1 import admin_pb2, admin_pb2_grpc

logger = logging.getLogger(__name__)

_Context = grpc.aio.ServicerContext[object, object]


class ChangeRecorder(Protocol):
    """Where accepted changes are stored before they apply (controlplane/state_keeper.py)."""

    def __call__(self, change: Override) -> Awaitable[None]:
        """Store `change`; StoreError (ChangeConflict: its config version is taken) when it
        cannot be."""


class PoolAdminService(admin_pb2_grpc.AdminServiceServicer):
    """The admin API over the pools' runtimes (controlplane/runtime.py), which apply the changes.

    admin_token: the token mutating calls must present; None refuses them all.
    record: stores each accepted change before it applies; None: changes live in memory only.
    file_pools: the pools as the config file says (what each change records of the fields it
    touches); by default the runtimes' pools as they are when the service is made.
    """

    def __init__(
        self,
        runtimes: Mapping[str, PoolRuntime],
        *,
        admin_token: str | None,
        record: ChangeRecorder | None = None,
        file_pools: Mapping[str, PoolConfig] | None = None,
        clock: Clock | None = None,
    ) -> None:
        self._runtimes = runtimes
        self._token_digest = None if admin_token is None else key_digest(admin_token)
        self._record = record
        self._file_pools = (
            dict(file_pools)
            if file_pools is not None
            else {name: runtime.state.pool for name, runtime in runtimes.items()}
        )
        self._clock = clock or SystemClock()
        self._locks = {name: asyncio.Lock() for name in runtimes}

    async def AddTenant(
        self, request: admin_pb2.AddTenantRequest, context: _Context
    ) -> admin_pb2.ConfigChangeResponse:
        runtime = await self._authorized_runtime(request.pool, context)

        def change() -> Override:
            name = _required("tenant", request.tenant)
            digests = check_new_keys(name, request.api_keys, runtime.state.key_digests)
            check_fleet_keys(name, digests, self._fleet_digests(runtime))
            settings = convert.settings_from_proto(request.settings)
            return self._override(
                runtime, "add_tenant", tenant=name, settings=settings, key_digests=digests
            )

        return await self._apply(runtime, change, context)

    def _fleet_digests(self, changing: PoolRuntime) -> dict[str, set[bytes]]:
        """tenant -> the digests of its keys in every pool but `changing`'s."""
        fleet: dict[str, set[bytes]] = {}
        for runtime in self._runtimes.values():
            if runtime is changing:
                continue
            for tenant, digests in runtime.state.key_digests.items():
                fleet.setdefault(tenant, set()).update(digests)
        return fleet

    async def RemoveTenant(
        self, request: admin_pb2.RemoveTenantRequest, context: _Context
    ) -> admin_pb2.ConfigChangeResponse:
        runtime = await self._authorized_runtime(request.pool, context)

        def change() -> Override:
            name = _required("tenant", request.tenant)
            return self._override(runtime, "remove_tenant", tenant=name)

        return await self._apply(runtime, change, context)

    async def UpdateTenant(
        self, request: admin_pb2.UpdateTenantRequest, context: _Context
    ) -> admin_pb2.ConfigChangeResponse:
        runtime = await self._authorized_runtime(request.pool, context)

        def change() -> Override:
            name = _required("tenant", request.tenant)
            settings = convert.settings_from_proto(request.settings)
            return self._override(
                runtime,
                "update_tenant",
                tenant=name,
                settings=settings,
                clear=tuple(request.clear),
            )

        return await self._apply(runtime, change, context)

    async def SetPolicy(
        self, request: admin_pb2.SetPolicyRequest, context: _Context
    ) -> admin_pb2.ConfigChangeResponse:
        runtime = await self._authorized_runtime(request.pool, context)

        def change() -> Override:
            policy = _required("policy", request.policy)
            return self._override(runtime, "set_policy", policy=policy)

        return await self._apply(runtime, change, context)

    def _override(
        self,
        runtime: PoolRuntime,
        kind: OverrideKind,
        *,
        tenant: str = "",
        settings: Mapping[str, float | int] | None = None,
        clear: tuple[str, ...] = (),
        policy: str = "",
        key_digests: tuple[bytes, ...] = (),
    ) -> Override:
        """The change as an override of the config file, at the pool's next config version."""
        settings = dict(settings or {})
        state = runtime.state
        return Override(
            pool=state.pool.name,
            config_version=state.config_version + 1,
            kind=kind,
            tenant=tenant,
            settings=settings,
            clear=clear,
            policy=policy,
            key_digests=key_digests,
            file_fields=file_fields_of(
                self._file_pools.get(state.pool.name, state.pool),
                kind,
                tenant=tenant,
                settings=settings,
                clear=clear,
            ),
            stored_at_wall_s=self._clock.wall(),
        )

    async def GetPoolConfig(
        self, request: admin_pb2.GetPoolConfigRequest, context: _Context
    ) -> admin_pb2.PoolConfigView:
        state = (await self._runtime(request.pool, context)).state
        return convert.pool_config_to_proto(state.pool, state.config_version, state.key_digests)

    async def _apply(
        self, runtime: PoolRuntime, change: Callable[[], Override], context: _Context
    ) -> admin_pb2.ConfigChangeResponse:
        state = runtime.state
        # One change of a pool at a time: each is built on the config the one before made, and
        # stored under the version after it.
        async with self._locks[runtime.name]:
            try:
                override = change()
                pool, digests, what = apply(state.pool, state.key_digests, override)
            except ConfigChangeError as exc:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
                raise  # abort raises; this tells the type checker
            except UnknownTenantError as exc:
                await context.abort(grpc.StatusCode.NOT_FOUND, str(exc))
                raise
            if self._record is not None:
                try:
                    await self._record(override)
                except ChangeConflict as exc:
                    logger.error("pool %s: change not stored: %s", runtime.name, exc)
                    await context.abort(
                        grpc.StatusCode.ABORTED,
                        f"config version {override.config_version} of pool {runtime.name} is "
                        "stored already (changed elsewhere): nothing changed; read the config "
                        "and try again",
                    )
                    raise
                except StoreError as exc:
                    logger.error("pool %s: change not stored: %s", runtime.name, exc)
                    await context.abort(
                        grpc.StatusCode.UNAVAILABLE,
                        "the state store cannot take the change: nothing changed; try again",
                    )
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
