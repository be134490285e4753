"""Admin changes as the state store keeps them: each an override on top of the config file.

An override says what one admin change did (add, remove or update a tenant, set the policy), at
which config version, and what the config file said, when the change was made, of each field it
touches (`file_fields`). At start-up the overrides are applied again, in version order, on top
of the pool as the file says it now (`replay`):
- an override whose fields the file has changed since it was stored is dropped: the file wins;
- so is one that no longer applies (a tenant no longer there, floors above a lowered budget,
  a key another tenant of the file now holds): validated exactly as the admin API validates.
Each drop comes with its reason, for the log and the store. Pure: no I/O.

Tenants' API keys are never part of an override: only their SHA-256 digests.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal

from controlplane.core.config_change import (
    ConfigChangeError,
    UnknownTenantError,
    add_tenant,
    config_key_digests,
    remove_tenant,
    set_policy,
    update_tenant,
)
from slotshift.config import PoolConfig, TenantConfig, reveal
from slotshift.keys import key_digest

OverrideKind = Literal["add_tenant", "remove_tenant", "update_tenant", "set_policy"]

Digests = Mapping[str, tuple[bytes, ...]]
"""tenant -> the digests of its API keys."""


@dataclass(frozen=True, slots=True)
class Override:
    """One accepted admin change of one pool."""

    pool: str
    config_version: int
    """The pool's config version the change made (1 is the file's; the first change is 2)."""
    kind: OverrideKind
    tenant: str = ""
    """The tenant changed (empty for set_policy)."""
    settings: Mapping[str, float | int] = field(default_factory=dict)
    """add_tenant, update_tenant: the settings set (controlplane/core/config_change.py)."""
    clear: tuple[str, ...] = ()
    """update_tenant: the settings unset."""
    policy: str = ""
    """set_policy: the new policy."""
    key_digests: tuple[bytes, ...] = ()
    """add_tenant: the digests of the new tenant's API keys."""
    file_fields: Mapping[str, str | None] = field(default_factory=dict)
    """field (`policy`, `tenants/NAME`, `tenants/NAME/SETTING`) -> what the config file said of
    it when the change was made, as JSON text; None: the file had no such field (the tenant was
    not in it). See `file_fields_of`."""
    stored_at_wall_s: float = 0.0


@dataclass(frozen=True, slots=True)
class Dropped:
    """An override that no longer applies, and why."""

    override: Override
    reason: str


@dataclass(frozen=True, slots=True)
class Replay:
    """The overrides of one pool applied on top of its config file."""

    pool: PoolConfig
    key_digests: dict[str, tuple[bytes, ...]]
    applied: tuple[Override, ...]
    dropped: tuple[Dropped, ...]


def file_fields_of(
    file_pool: PoolConfig,
    kind: OverrideKind,
    *,
    tenant: str = "",
    settings: Iterable[str] = (),
    clear: Iterable[str] = (),
) -> dict[str, str | None]:
    """What the config file (`file_pool`) says now of each field a change of `kind` touches:
    set_policy the policy; add_tenant and remove_tenant the tenant as a whole; update_tenant
    each setting set or cleared (the tenant as a whole when the file has no such tenant)."""
    if kind == "set_policy":
        return {"policy": _file_value(file_pool, "policy")}
    whole = f"tenants/{tenant}"
    if kind in ("add_tenant", "remove_tenant") or _tenant(file_pool, tenant) is None:
        return {whole: _file_value(file_pool, whole)}
    names = [*settings, *clear]
    return {f"{whole}/{name}": _file_value(file_pool, f"{whole}/{name}") for name in names}


def apply(
    pool: PoolConfig, digests: Digests, override: Override
) -> tuple[PoolConfig, dict[str, tuple[bytes, ...]], str]:
    """`pool` and its tenants' `digests` with `override` applied, and what changed in words
    (the trigger of the decision it causes). Raises ConfigChangeError (invalid on this pool) or
    UnknownTenantError (a tenant it names is not there), as the admin API does."""
    new_digests = dict(digests)
    if override.kind == "add_tenant":
        _check_free(override.tenant, override.key_digests, digests)
        if not override.key_digests:
            raise ConfigChangeError("tenant.api_keys", "at least one key is needed to authenticate")
        changed = add_tenant(pool, override.tenant, override.settings)
        new_digests[override.tenant] = tuple(override.key_digests)
        what = f"added tenant {override.tenant}"
    elif override.kind == "remove_tenant":
        changed = remove_tenant(pool, override.tenant)
        new_digests.pop(override.tenant, None)
        what = f"removed tenant {override.tenant}"
    elif override.kind == "update_tenant":
        changed = update_tenant(pool, override.tenant, override.settings, override.clear)
        parts = [f"{k}={v}" for k, v in override.settings.items()]
        parts += [f"{k} cleared" for k in override.clear]
        what = f"updated tenant {override.tenant}: {', '.join(parts) or 'nothing'}"
    else:
        changed = set_policy(pool, override.policy)
        what = f"policy {pool.policy} -> {override.policy}"
    names = {t.name for t in changed.tenants}
    return changed, {t: d for t, d in new_digests.items() if t in names}, what


def replay(file_pool: PoolConfig, overrides: Sequence[Override]) -> Replay:
    """`overrides` (of `file_pool`'s pool) applied in config-version order on top of the file's
    pool and keys; those whose fields the file changed since, or that no longer apply, are left
    out with their reason (module docstring). The result is a valid pool: each step is."""
    pool = file_pool
    digests: dict[str, tuple[bytes, ...]] = config_key_digests(file_pool)
    applied: list[Override] = []
    dropped: list[Dropped] = []
    for override in sorted(overrides, key=lambda o: o.config_version):
        if override.pool != file_pool.name:
            raise ValueError(f"override of pool {override.pool!r} replayed on {file_pool.name!r}")
        changed = _changed_fields(file_pool, override)
        if changed:
            dropped.append(Dropped(override, f"the config file changed {'; '.join(changed)}"))
            continue
        try:
            pool, digests, _ = apply(pool, digests, override)
        except (ConfigChangeError, UnknownTenantError) as exc:
            dropped.append(Dropped(override, f"no longer applies: {exc}"))
            continue
        applied.append(override)
    return Replay(pool, digests, tuple(applied), tuple(dropped))


def _changed_fields(file_pool: PoolConfig, override: Override) -> list[str]:
    changed = []
    for name, then in override.file_fields.items():
        now = _file_value(file_pool, name)
        if now != then:
            changed.append(f"{name} (was {_shown(then)}, now {_shown(now)})")
    return changed


def _shown(value: str | None) -> str:
    return "absent" if value is None else value


def _check_free(tenant: str, new: Iterable[bytes], digests: Digests) -> None:
    taken = {d for other, ds in digests.items() if other != tenant for d in ds}
    if taken.intersection(new):
        raise ConfigChangeError("tenant.api_keys", "a key already identifies another tenant")


def _tenant(pool: PoolConfig, name: str) -> TenantConfig | None:
    return next((t for t in pool.tenants if t.name == name), None)


def _file_value(pool: PoolConfig, name: str) -> str | None:
    """The JSON text of field `name` (see Override.file_fields) of `pool`; None: absent."""
    parts = name.split("/")
    if parts == ["policy"]:
        return json.dumps(pool.policy)
    if parts[0] != "tenants" or len(parts) not in (2, 3):
        raise ValueError(f"not a field an override touches: {name!r}")
    tenant = _tenant(pool, parts[1])
    if tenant is None:
        return None
    if len(parts) == 3:
        return json.dumps(getattr(tenant, parts[2]))
    return json.dumps(_tenant_data(tenant), sort_keys=True)


def _tenant_data(tenant: TenantConfig) -> dict[str, Any]:
    """A tenant's settings with its keys as digests: a change of key in the file is a change."""
    data: dict[str, Any] = tenant.model_dump(mode="json", exclude={"api_keys", "api_keys_file"})
    data["api_key_digests"] = sorted(key_digest(reveal(k)).hex() for k in tenant.api_keys)
    return data
