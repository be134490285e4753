"""Admin changes as the state store keeps them: each an override on top of the config file.

An override says what one admin change did (add, remove or update a tenant, set the policy, add
or revoke a tenant's key), at which config version, and what the config file said, when the change was made, of each field it
touches (`file_fields`). At start-up the overrides are applied again, in version order, on top
of the pool as the file says it now (`replay`):
- an override whose fields the file has changed since it was stored is dropped: the file wins;
- so is one that no longer applies (a tenant no longer there, floors above a lowered budget,
  a key another tenant of the file now holds): validated exactly as the admin API validates.
Each drop comes with its reason, for the log and the store. Pure: no I/O.

Tenants' API keys are never part of an override: only their digests, and the scheme they were
made under (`key_scheme`, slotshift/keys.py). What the file said of a tenant holds its keys'
digests too. An override whose digests are of another scheme than the control plane's now (made
under a rotated secret, or unkeyed before keyed digests) cannot be checked or applied: a digest
is not converted without its key. `replay` sets it apart (`Replay.stale`) rather than apply or
drop it; the caller decides (controlplane/state_keeper.py). The one exception: an unkeyed
override that holds no digest of its own is replayed, its file fields digested unkeyed again
(the file's keys are at hand).
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
    with_key_added,
    with_key_revoked,
)
from slotshift.config import PoolConfig, TenantConfig, reveal
from slotshift.keys import UNKEYED_SCHEME, KeyDigester

OverrideKind = Literal[
    "add_tenant", "remove_tenant", "update_tenant", "set_policy", "add_key", "revoke_key"
]

KEY_KINDS: tuple[OverrideKind, ...] = ("add_key", "revoke_key")
"""The kinds that change only a tenant's keys (not its settings, nor its share)."""

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
    """add_tenant: the digests of the new tenant's API keys; add_key, revoke_key: the one key's
    digest."""
    key_scheme: str = UNKEYED_SCHEME
    """The scheme the digests here (key_digests, and those in file_fields) were made under
    (`KeyDigester.scheme`); changes stored before keyed digests are unkeyed."""
    allow_no_key: bool = False
    """revoke_key: the tenant may be left without a key."""
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
    stale: tuple[Override, ...] = ()
    """Overrides of another key-digest scheme, neither applied nor dropped (module docstring)."""


def file_fields_of(
    file_pool: PoolConfig,
    kind: OverrideKind,
    *,
    tenant: str = "",
    settings: Iterable[str] = (),
    clear: Iterable[str] = (),
    digester: KeyDigester,
) -> dict[str, str | None]:
    """What the config file (`file_pool`) says now of each field a change of `kind` touches
    (its keys as digests by `digester`): set_policy the policy; add_tenant and remove_tenant the
    tenant as a whole; update_tenant each setting set or cleared; add_key and revoke_key the
    tenant's keys (the tenant as a whole, for these two, when the file has no such tenant)."""
    if kind == "set_policy":
        return {"policy": _file_value(file_pool, "policy", digester)}
    whole = f"tenants/{tenant}"
    if kind in ("add_tenant", "remove_tenant") or _tenant(file_pool, tenant) is None:
        return {whole: _file_value(file_pool, whole, digester)}
    names = ["api_keys"] if kind in KEY_KINDS else [*settings, *clear]
    return {
        f"{whole}/{name}": _file_value(file_pool, f"{whole}/{name}", digester) for name in names
    }


def apply(
    pool: PoolConfig, digests: Digests, override: Override
) -> tuple[PoolConfig, dict[str, tuple[bytes, ...]], str]:
    """`pool` and its tenants' `digests` with `override` applied, and what changed in words
    (the trigger of the decision it causes). Raises ConfigChangeError (invalid on this pool) or
    UnknownTenantError (a tenant it names is not there), as the admin API does; for add_key
    KeyExistsError (the tenant holds it already), for revoke_key UnknownKeyError (it does not)
    and LastKeyError (config_change.py). A key change returns `pool` itself."""
    new_digests = dict(digests)
    if override.kind in KEY_KINDS:
        return pool, _keys_changed(pool, digests, override), _key_change_words(override)
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


def replay(file_pool: PoolConfig, overrides: Sequence[Override], digester: KeyDigester) -> Replay:
    """`overrides` (of `file_pool`'s pool) applied in config-version order on top of the file's
    pool and keys (digested by `digester`); those whose fields the file changed since, or that
    no longer apply, are left out with their reason, and those of another key-digest scheme are
    set apart (module docstring). The result is a valid pool: each step is."""
    pool = file_pool
    digests: dict[str, tuple[bytes, ...]] = config_key_digests(file_pool, digester)
    applied: list[Override] = []
    dropped: list[Dropped] = []
    stale: list[Override] = []
    for override in sorted(overrides, key=lambda o: o.config_version):
        if override.pool != file_pool.name:
            raise ValueError(f"override of pool {override.pool!r} replayed on {file_pool.name!r}")
        checker = _digester_for(override, digester)
        if checker is None:
            stale.append(override)
            continue
        changed = _changed_fields(file_pool, override, checker)
        if changed:
            dropped.append(Dropped(override, f"the config file changed {'; '.join(changed)}"))
            continue
        try:
            pool, digests, _ = apply(pool, digests, override)
        except (ConfigChangeError, UnknownTenantError) as exc:
            dropped.append(Dropped(override, f"no longer applies: {exc}"))
            continue
        applied.append(override)
    return Replay(pool, digests, tuple(applied), tuple(dropped), tuple(stale))


def holds_digests(override: Override) -> bool:
    """Whether `override` holds key digests: of its own, or of the file's keys in a field of
    what the file said (a tenant as a whole, or its keys)."""
    if override.key_digests:
        return True
    return any(
        then is not None and (name.count("/") == 1 or name.endswith("/api_keys"))
        for name, then in override.file_fields.items()
    )


def _digester_for(override: Override, current: KeyDigester) -> KeyDigester | None:
    """The digester to check `override` with: the current one, when its scheme is the
    override's or the override holds no digest; the unkeyed one for an unkeyed override whose
    only digests are of the file's keys; None when none can (a stale override)."""
    if override.key_scheme == current.scheme or not holds_digests(override):
        return current
    if override.key_scheme == UNKEYED_SCHEME and not override.key_digests:
        return KeyDigester.unkeyed()
    return None


def _keys_changed(
    pool: PoolConfig, digests: Digests, override: Override
) -> dict[str, tuple[bytes, ...]]:
    if len(override.key_digests) != 1:
        raise ConfigChangeError("api_key", "a key change names exactly one key")
    if _tenant(pool, override.tenant) is None:
        raise UnknownTenantError(pool, override.tenant)
    current = {t.name: tuple(digests.get(t.name, ())) for t in pool.tenants}
    (digest,) = override.key_digests
    if override.kind == "add_key":
        return with_key_added(override.tenant, digest, current)
    return with_key_revoked(override.tenant, digest, current, allow_no_key=override.allow_no_key)


def _key_change_words(override: Override) -> str:
    verb = "added to" if override.kind == "add_key" else "revoked from"
    return f"a key {verb} tenant {override.tenant}"


def _changed_fields(file_pool: PoolConfig, override: Override, digester: KeyDigester) -> list[str]:
    changed = []
    for name, then in override.file_fields.items():
        now = _file_value(file_pool, name, digester)
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


def _file_value(pool: PoolConfig, name: str, digester: KeyDigester) -> str | None:
    """The JSON text of field `name` (see Override.file_fields) of `pool`, its keys as digests
    by `digester`; None: absent."""
    parts = name.split("/")
    if parts == ["policy"]:
        return json.dumps(pool.policy)
    if parts[0] != "tenants" or len(parts) not in (2, 3):
        raise ValueError(f"not a field an override touches: {name!r}")
    tenant = _tenant(pool, parts[1])
    if tenant is None:
        return None
    if parts[2:] == ["api_keys"]:
        return json.dumps(_key_digests(tenant, digester))
    if len(parts) == 3:
        return json.dumps(getattr(tenant, parts[2]))
    return json.dumps(_tenant_data(tenant, digester), sort_keys=True)


def _tenant_data(tenant: TenantConfig, digester: KeyDigester) -> dict[str, Any]:
    """A tenant's settings with its keys as digests: a change of key in the file is a change."""
    data: dict[str, Any] = tenant.model_dump(mode="json", exclude={"api_keys", "api_keys_file"})
    data["api_key_digests"] = _key_digests(tenant, digester)
    return data


def _key_digests(tenant: TenantConfig, digester: KeyDigester) -> list[str]:
    return sorted(digester.digest(reveal(k)).hex() for k in tenant.api_keys)
