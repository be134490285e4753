"""AdminService: changes a pool's tenants and policy at run time (proto/slotshift/v1/admin.proto).

Each change is built as a whole new pool config and validated (controlplane/core/config_change.py);
the running config is replaced only when the new one is valid. An accepted change bumps the pool's
config version, is pushed to the gateways (the tenant directory, then a new allocation) and is
decided on at once, so that the decision log records it (`trigger`: "config vN: ...").

A change is an override of the config file (controlplane/core/overrides.py): it is stored
(`record`: the state store, controlplane/state_keeper.py) before it applies, and answered only
once stored, so that a restart brings it back; a store that cannot take it fails the call with
UNAVAILABLE and nothing changes. Changes to one pool are made one at a time.

A tenant's keys are one set across the fleet: AddKey and RevokeKey change them in every pool
the tenant is in, pool by pool (each pool's change stored before it applies), without a decision
and without touching the tenant's settings or share. A call that fails half-way (the store
down) leaves some pools changed; calling it again finishes it (pools already as asked are left
as they are).

A pool that is a replica in a replica group (`replica_group`, slotshift/config/replica_groups.py)
takes its tenants from the group, divided among the members: AddTenant, RemoveTenant and
UpdateTenant on it are refused with FAILED_PRECONDITION (change the group's tenants in the
config file and reload it), since a change made on one member alone would leave the members
disagreeing about the group. SetPolicy and the key changes apply as on any pool.

Mutating RPCs need the admin token as `authorization: Bearer TOKEN` metadata, compared in
constant time (controlplane/service/read_auth.py); with no token configured they are refused.
GetPoolConfig is a read: open, or behind the query tokens (`controlplane.query_token_file`,
checked by ReadGate before the call reaches this service). API keys in requests are digested at
once (`key_digester`, slotshift/keys.py) and never logged, traced or returned; only key ids are.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Awaitable, Callable, Mapping
from typing import Protocol

import grpc

from controlplane.core.config_change import (
    ConfigChangeError,
    KeyExistsError,
    LastKeyError,
    UnknownKeyError,
    UnknownTenantError,
    check_fleet_keys,
    check_key,
    check_new_keys,
)
from controlplane.core.overrides import Override, OverrideKind, apply, file_fields_of
from controlplane.pool_state import PoolState
from controlplane.runtime import PoolRuntime
from controlplane.service import convert
from controlplane.service.lookup import find_pool
from controlplane.service.read_auth import BearerTokens
from controlplane.store.base import ChangeConflict, StoreError
from slotshift.clock import Clock, SystemClock
from slotshift.config import PoolConfig
from slotshift.keys import KeyDigester
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
    key_digester: how API keys are digested (tenant_keys), as the pools' digests were.
    record: stores each accepted change before it applies; None: changes live in memory only.
    file_pools: the pools as the config file says (what each change records of the fields it
    touches), read at each change (a config reload replaces them); by default the runtimes'
    pools as they are when the service is made.
    """

    def __init__(
        self,
        runtimes: Mapping[str, PoolRuntime],
        *,
        admin_token: str | None,
        key_digester: KeyDigester,
        record: ChangeRecorder | None = None,
        file_pools: Mapping[str, PoolConfig] | None = None,
        clock: Clock | None = None,
    ) -> None:
        self._runtimes = runtimes
        self._admin_tokens = None if admin_token is None else BearerTokens([admin_token])
        self._digester = key_digester
        self._record = record
        # Not copied: a config reload replaces the file's pools in it (controlplane/server.py).
        self._file_pools = (
            file_pools
            if file_pools is not None
            else {name: runtime.state.pool for name, runtime in runtimes.items()}
        )
        self._clock = clock or SystemClock()

    async def AddTenant(
        self, request: admin_pb2.AddTenantRequest, context: _Context
    ) -> admin_pb2.ConfigChangeResponse:
        runtime = await self._authorized_runtime(request.pool, context)
        await self._refuse_group_member(runtime, context)

        def change() -> Override:
            name = _required("tenant", request.tenant)
            digests = check_new_keys(
                name, request.api_keys, runtime.state.key_digests, self._digester
            )
            check_fleet_keys(name, digests, self._fleet_digests(runtime))
            settings = convert.settings_from_proto(request.settings)
            return self._override(
                runtime, "add_tenant", tenant=name, settings=settings, key_digests=digests
            )

        return await self._apply(runtime, change, context)

    def _fleet_digests(self, *changing: PoolRuntime) -> dict[str, set[bytes]]:
        """tenant -> the digests of its keys in every pool but the `changing` ones."""
        fleet: dict[str, set[bytes]] = {}
        for runtime in self._runtimes.values():
            if any(runtime is c for c in changing):
                continue
            for tenant, digests in runtime.state.key_digests.items():
                fleet.setdefault(tenant, set()).update(digests)
        return fleet

    async def RemoveTenant(
        self, request: admin_pb2.RemoveTenantRequest, context: _Context
    ) -> admin_pb2.ConfigChangeResponse:
        runtime = await self._authorized_runtime(request.pool, context)
        await self._refuse_group_member(runtime, context)

        def change() -> Override:
            name = _required("tenant", request.tenant)
            return self._override(runtime, "remove_tenant", tenant=name)

        return await self._apply(runtime, change, context)

    async def UpdateTenant(
        self, request: admin_pb2.UpdateTenantRequest, context: _Context
    ) -> admin_pb2.ConfigChangeResponse:
        runtime = await self._authorized_runtime(request.pool, context)
        await self._refuse_group_member(runtime, context)

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
        allow_no_key: bool = False,
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
            key_scheme=self._digester.scheme,
            allow_no_key=allow_no_key,
            file_fields=file_fields_of(
                self._file_pools.get(state.pool.name, state.pool),
                kind,
                tenant=tenant,
                settings=settings,
                clear=clear,
                digester=self._digester,
            ),
            stored_at_wall_s=self._clock.wall(),
        )

    async def GetPoolConfig(
        self, request: admin_pb2.GetPoolConfigRequest, context: _Context
    ) -> admin_pb2.PoolConfigView:
        return self._view((await self._runtime(request.pool, context)).state)

    def _view(self, state: PoolState) -> admin_pb2.PoolConfigView:
        return convert.pool_config_to_proto(
            state.pool, state.config_version, state.key_digests, self._digester.key_id
        )

    async def AddKey(
        self, request: admin_pb2.AddKeyRequest, context: _Context
    ) -> admin_pb2.KeyChangeResponse:
        await self._authorize(context)
        try:
            tenant = _required("tenant", request.tenant)
            check_key(request.api_key, field="api_key")
        except ConfigChangeError as exc:
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
            raise
        digest = self._digester.digest(request.api_key)
        return await self._change_keys(tenant, "add_key", digest, context)

    async def RevokeKey(
        self, request: admin_pb2.RevokeKeyRequest, context: _Context
    ) -> admin_pb2.KeyChangeResponse:
        await self._authorize(context)
        which = request.WhichOneof("key")
        if not request.tenant or which is None:
            missing = "tenant" if not request.tenant else "api_key or key_id"
            await context.abort(grpc.StatusCode.INVALID_ARGUMENT, f"{missing}: required")
        runtimes = await self._runtimes_of(request.tenant, context)
        if which == "api_key":
            digest = self._digester.digest(request.api_key)
        else:
            digest = await self._digest_of_id(request.tenant, request.key_id, runtimes, context)
        return await self._change_keys(
            request.tenant, "revoke_key", digest, context, allow_no_key=request.allow_no_key
        )

    async def _runtimes_of(self, tenant: str, context: _Context) -> list[PoolRuntime]:
        """The runtimes of the pools `tenant` is in, by pool name; NOT_FOUND when none."""
        runtimes = [
            self._runtimes[name]
            for name in sorted(self._runtimes)
            if tenant in self._runtimes[name].state.key_digests
        ]
        if not runtimes:
            await context.abort(grpc.StatusCode.NOT_FOUND, f"tenant: no tenant {tenant!r}")
        return runtimes

    async def _digest_of_id(
        self, tenant: str, key_id: str, runtimes: list[PoolRuntime], context: _Context
    ) -> bytes:
        """The digest of `tenant`'s key whose id is `key_id`; NOT_FOUND when it holds none,
        FAILED_PRECONDITION when two of its keys share the id (revoke by the key then)."""
        wanted = key_id.strip().lower()
        found = {
            d
            for runtime in runtimes
            for d in runtime.state.key_digests.get(tenant, ())
            if self._digester.key_id(d) == wanted
        }
        if not found:
            await context.abort(
                grpc.StatusCode.NOT_FOUND, f"key_id: tenant {tenant} holds no key {key_id!r}"
            )
        if len(found) > 1:
            await context.abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"key_id: two of tenant {tenant}'s keys have id {key_id!r}: revoke by api_key",
            )
        return found.pop()

    async def _change_keys(
        self,
        tenant: str,
        kind: OverrideKind,
        digest: bytes,
        context: _Context,
        *,
        allow_no_key: bool = False,
    ) -> admin_pb2.KeyChangeResponse:
        """Add (`add_key`) or revoke (`revoke_key`) the key of `digest` in every pool `tenant`
        is in, each pool's change stored before it applies, under that pool's lock (taken in
        pool-name order). Pools where the tenant already holds (add) or no longer holds
        (revoke) the key are left as they are; ALREADY_EXISTS / NOT_FOUND when that is all of
        them. Every pool's change is validated before any is stored."""
        runtimes = await self._runtimes_of(tenant, context)
        async with contextlib.AsyncExitStack() as locks:
            for runtime in runtimes:
                await locks.enter_async_context(runtime.changing)
            changes: list[tuple[PoolRuntime, Override, dict[str, tuple[bytes, ...]], str]] = []
            skipped: list[Exception] = []
            for runtime in runtimes:
                state = runtime.state
                try:
                    override = self._override(
                        runtime,
                        kind,
                        tenant=tenant,
                        key_digests=(digest,),
                        allow_no_key=allow_no_key,
                    )
                    _, digests, what = apply(state.pool, state.key_digests, override)
                except (KeyExistsError, UnknownKeyError) as exc:
                    skipped.append(exc)
                    continue
                except UnknownTenantError as exc:
                    await context.abort(grpc.StatusCode.NOT_FOUND, str(exc))
                    raise
                except LastKeyError as exc:
                    await context.abort(grpc.StatusCode.FAILED_PRECONDITION, str(exc))
                    raise
                except ConfigChangeError as exc:
                    await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
                    raise
                changes.append((runtime, override, digests, what))
            if not changes:
                code = (
                    grpc.StatusCode.ALREADY_EXISTS
                    if kind == "add_key"
                    else grpc.StatusCode.NOT_FOUND
                )
                await context.abort(code, str(skipped[0]))
            if kind == "add_key":
                # The tenant's keys after the change, the same in every pool it is in.
                after = {d for _, _, digests, _ in changes for d in digests[tenant]}
                try:
                    check_fleet_keys(tenant, after, self._fleet_digests(*runtimes))
                except ConfigChangeError as exc:
                    await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
                    raise
            done: list[str] = []
            for runtime, override, digests, what in changes:
                await self._store(runtime, override, context, changed_already=done)
                runtime.change_keys(digests, what)
                done.append(runtime.name)
        return admin_pb2.KeyChangeResponse(
            key_id=self._digester.key_id(digest),
            configs=[self._view(runtime.state) for runtime in runtimes],
        )

    async def _store(
        self,
        runtime: PoolRuntime,
        override: Override,
        context: _Context,
        *,
        changed_already: list[str] | None = None,
    ) -> None:
        """Store `override` before it applies; the call fails (ABORTED: its version is taken,
        UNAVAILABLE: the store is down) when it cannot be, and it must not apply then.
        `changed_already`: the pools this call changed before (a key change), which the
        message names."""
        if self._record is None:
            return
        done = (
            f"pools {', '.join(changed_already)} changed already, pool {runtime.name} not: call "
            "again to finish"
            if changed_already
            else "nothing changed"
        )
        try:
            await self._record(override)
        except ChangeConflict as exc:
            logger.error("pool %s: change not stored: %s", runtime.name, exc)
            await context.abort(
                grpc.StatusCode.ABORTED,
                f"config version {override.config_version} of pool {runtime.name} is "
                f"stored already (changed elsewhere): {done}; read the config and try again",
            )
            raise
        except StoreError as exc:
            logger.error("pool %s: change not stored: %s", runtime.name, exc)
            await context.abort(
                grpc.StatusCode.UNAVAILABLE,
                f"the state store cannot take the change: {done}; try again",
            )
            raise

    async def _apply(
        self, runtime: PoolRuntime, change: Callable[[], Override], context: _Context
    ) -> admin_pb2.ConfigChangeResponse:
        state = runtime.state
        # One change of a pool at a time (a config reload's too): each is built on the config
        # the one before made, and stored under the version after it.
        async with runtime.changing:
            try:
                override = change()
                pool, digests, what = apply(state.pool, state.key_digests, override)
            except ConfigChangeError as exc:
                await context.abort(grpc.StatusCode.INVALID_ARGUMENT, str(exc))
                raise  # abort raises; this tells the type checker
            except UnknownTenantError as exc:
                await context.abort(grpc.StatusCode.NOT_FOUND, str(exc))
                raise
            await self._store(runtime, override, context)
            record = runtime.change_config(pool, digests, what)
        return admin_pb2.ConfigChangeResponse(
            config=self._view(state),
            decision_id=record.id,
            allocation_version=state.allocation.version,
        )

    async def _refuse_group_member(self, runtime: PoolRuntime, context: _Context) -> None:
        """FAILED_PRECONDITION when the pool's tenants are its replica group's."""
        group = runtime.state.pool.replica_group
        if group is not None:
            await context.abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"pool {runtime.name} is a replica in replica group {group}: its tenants are "
                "the group's, divided among the group's pools; change them in the config "
                "file's replica_groups and reload it",
            )

    async def _authorized_runtime(self, pool: str, context: _Context) -> PoolRuntime:
        await self._authorize(context)
        return await self._runtime(pool, context)

    async def _authorize(self, context: _Context) -> None:
        if self._admin_tokens is None:
            await context.abort(
                grpc.StatusCode.FAILED_PRECONDITION,
                "the admin API is off: no admin token is configured (put one in a file and set "
                "controlplane.admin_token_file to its path)",
            )
            return
        if not self._admin_tokens.admits(context.invocation_metadata()):
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
