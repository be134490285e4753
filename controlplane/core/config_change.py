"""Changes to a running pool's config (the admin API): each builds a whole new PoolConfig.

A change is validated exactly as the config file is (slotshift.config), so a pool changed at run
time obeys the same rules as one loaded at start-up: floors within the budget, ceilings that
leave the budget assignable, unique tenant names, known policies. A change that breaks a rule
raises ConfigChangeError naming the field at fault; the pool passed in is never modified (configs
are immutable).

Tenants' API keys are not part of the configs built here: the control plane keeps only their
digests (`slotshift.keys.KeyDigester`: HMAC-SHA-256 under the deployment's secret), which it
hands to the gateways. A key identifies one tenant in the whole fleet; a tenant holds at least
one key unless a revocation says otherwise.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Any

from pydantic import ValidationError

from slotshift.config import PoolConfig, reveal, revealed
from slotshift.keys import KeyDigester

TENANT_SETTINGS = (
    "floor_slots",
    "ceiling_slots",
    "weight",
    "lendable_percent",
    "borrowing_limit_percent",
    "ttft_slo_ms",
    "e2e_slo_ms",
)
"""The tenant settings the admin API may set."""

CLEARABLE_SETTINGS = ("ceiling_slots", "borrowing_limit_percent", "ttft_slo_ms", "e2e_slo_ms")
"""The settings that may be unset (their default is "none")."""


class ConfigChangeError(ValueError):
    """An invalid change; str() starts with the field at fault, e.g. `tenant.floor_slots: ...`."""

    def __init__(self, field: str, message: str) -> None:
        super().__init__(f"{field}: {message}")
        self.field = field


class UnknownTenantError(LookupError):
    """The change names a tenant the pool does not have."""

    def __init__(self, pool: PoolConfig, tenant: str) -> None:
        known = [t.name for t in pool.tenants]
        super().__init__(f"tenant: no tenant {tenant!r} in pool {pool.name!r} (known: {known})")


class KeyExistsError(ValueError):
    """The key to add identifies its tenant already (ALREADY_EXISTS at the admin API)."""


class UnknownKeyError(LookupError):
    """The key to revoke is not one of the tenant's (NOT_FOUND at the admin API)."""


class LastKeyError(ConfigChangeError):
    """The revocation would leave the tenant without a key, and its caller did not allow that
    (FAILED_PRECONDITION at the admin API)."""


def config_key_digests(pool: PoolConfig, digester: KeyDigester) -> dict[str, tuple[bytes, ...]]:
    """tenant -> digests (by `digester`) of the API keys its config gives it."""
    return {t.name: tuple(digester.digest(reveal(k)) for k in t.api_keys) for t in pool.tenants}


def check_key(key: str, *, field: str = "tenant.api_keys") -> None:
    """ConfigChangeError (naming `field`) if `key` is empty or holds white space: a key goes in
    `Authorization: Bearer KEY`, which the gateways split on white space."""
    if not key or any(c.isspace() for c in key):
        raise ConfigChangeError(field, "a key must be non-empty, without whitespace")


def check_new_keys(
    tenant: str,
    keys: Iterable[str],
    digests: Mapping[str, Iterable[bytes]],
    digester: KeyDigester,
) -> tuple[bytes, ...]:
    """The digests (by `digester`) of a new tenant's keys; ConfigChangeError if there is none,
    one is empty or malformed, or one already identifies another tenant (`digests`: tenant ->
    its digests)."""
    keys = list(keys)
    if not keys:
        raise ConfigChangeError("tenant.api_keys", "at least one key is needed to authenticate")
    for key in keys:
        check_key(key)
    new = tuple(digester.digest(key) for key in keys)
    taken = {d for other, ds in digests.items() if other != tenant for d in ds}
    if taken.intersection(new):
        raise ConfigChangeError("tenant.api_keys", "a key already identifies another tenant")
    return tuple(dict.fromkeys(new))


def with_key_added(
    tenant: str, digest: bytes, digests: Mapping[str, tuple[bytes, ...]]
) -> dict[str, tuple[bytes, ...]]:
    """`digests` (tenant -> its key digests, every tenant of a pool) with `digest` added to
    `tenant`'s, last. KeyError if the pool has no such tenant; KeyExistsError if the tenant holds
    the key already; ConfigChangeError (`api_key`) if it identifies another tenant."""
    held = digests[tenant]
    if digest in held:
        raise KeyExistsError(f"api_key: the key identifies tenant {tenant} already")
    if any(digest in ds for other, ds in digests.items() if other != tenant):
        raise ConfigChangeError("api_key", "the key already identifies another tenant")
    return {**digests, tenant: (*held, digest)}


def with_key_revoked(
    tenant: str,
    digest: bytes,
    digests: Mapping[str, tuple[bytes, ...]],
    *,
    allow_no_key: bool,
) -> dict[str, tuple[bytes, ...]]:
    """`digests` without `digest` among `tenant`'s. KeyError if the pool has no such tenant;
    UnknownKeyError if the tenant does not hold the key; LastKeyError if it is the tenant's last
    and not `allow_no_key` (a tenant without a key stays in the pool, its settings and share
    with it, but no request authenticates as it)."""
    held = digests[tenant]
    if digest not in held:
        raise UnknownKeyError(f"api_key: tenant {tenant} holds no such key")
    kept = tuple(d for d in held if d != digest)
    if not kept and not allow_no_key:
        raise LastKeyError(
            "api_key",
            f"it is tenant {tenant}'s last key: add another first, remove the tenant, or set "
            "allow_no_key to leave it without one",
        )
    return {**digests, tenant: kept}


def check_fleet_keys(
    tenant: str, new: Iterable[bytes], fleet: Mapping[str, Iterable[bytes]]
) -> None:
    """A tenant is one name and one set of keys in every pool it is in (the gateways find the
    tenant from the key before the pool): ConfigChangeError when `tenant` holds other keys in
    another pool (`fleet`: tenant -> its digests over every pool), or a new key identifies
    another tenant anywhere."""
    new = set(new)
    held = fleet.get(tenant)
    if held is not None and set(held) != new:
        raise ConfigChangeError(
            "tenant.api_keys",
            f"tenant {tenant} holds other keys in another pool: give it the same keys in every "
            "pool it is in",
        )
    taken = {d for other, ds in fleet.items() if other != tenant for d in ds}
    if taken.intersection(new):
        raise ConfigChangeError("tenant.api_keys", "a key already identifies another tenant")


def add_tenant(pool: PoolConfig, name: str, settings: Mapping[str, Any]) -> PoolConfig:
    """`pool` with a new tenant (without API keys: see check_new_keys)."""
    _check_settings(settings)
    if any(t.name == name for t in pool.tenants):
        raise ConfigChangeError("tenant.name", f"pool {pool.name!r} already has a tenant {name!r}")
    data = _dump(pool)
    data["tenants"].append({"name": name, **settings})
    return _validated(data, blame=list(settings))


def remove_tenant(pool: PoolConfig, name: str) -> PoolConfig:
    """`pool` without tenant `name`."""
    _index_of(pool, name)
    data = _dump(pool)
    data["tenants"] = [t for t in data["tenants"] if t["name"] != name]
    if not data["tenants"]:
        raise ConfigChangeError("tenant", f"{name!r} is the last tenant; a pool needs one")
    return _validated(data, blame=[])


def update_tenant(
    pool: PoolConfig, name: str, settings: Mapping[str, Any], clear: Iterable[str] = ()
) -> PoolConfig:
    """`pool` with tenant `name`'s `settings` changed and the `clear` settings unset."""
    _check_settings(settings)
    clear = list(clear)
    for setting in clear:
        if setting not in CLEARABLE_SETTINGS:
            raise ConfigChangeError(
                "clear", f"{setting!r} cannot be cleared (only {list(CLEARABLE_SETTINGS)})"
            )
        if setting in settings:
            raise ConfigChangeError("clear", f"{setting!r} is both set and cleared")
    index = _index_of(pool, name)
    data = _dump(pool)
    data["tenants"][index].update(settings)
    data["tenants"][index].update(dict.fromkeys(clear))
    return _validated(data, blame=[*settings, *clear])


def set_policy(pool: PoolConfig, policy: str) -> PoolConfig:
    """`pool` with allocation policy `policy`."""
    data = _dump(pool)
    data["policy"] = policy
    return _validated(data, blame=[])


def _check_settings(settings: Mapping[str, Any]) -> None:
    for setting in settings:
        if setting not in TENANT_SETTINGS:
            raise ConfigChangeError(f"tenant.{setting}", "not a setting the admin API changes")


def _index_of(pool: PoolConfig, name: str) -> int:
    for index, tenant in enumerate(pool.tenants):
        if tenant.name == name:
            return index
    raise UnknownTenantError(pool, name)


def _dump(pool: PoolConfig) -> dict[str, Any]:
    # Secrets are revealed only to be validated again into the new config, never shown.
    data: dict[str, Any] = revealed(pool.model_dump(mode="python"))
    return data


def _validated(data: dict[str, Any], *, blame: list[str]) -> PoolConfig:
    try:
        return PoolConfig.model_validate(data)
    except ValidationError as exc:
        error = exc.errors()[0]
        raise ConfigChangeError(
            _field_of(error["loc"], error["msg"], blame), error["msg"]
        ) from None


def _field_of(loc: tuple[int | str, ...], message: str, blame: list[str]) -> str:
    """The field to name for a validation error at `loc`.

    Errors of a single field name it (`tenant.weight`, `policy`); errors of the pool or a tenant
    as a whole (floors above the budget, floor above ceiling) name the setting the message is
    about, preferring the ones the change touched (`blame`).
    """
    if loc and loc[0] == "tenants":
        if len(loc) >= 3:
            return "tenant." + ".".join(str(part) for part in loc[2:])
    elif loc:
        return ".".join(str(part) for part in loc)
    candidates = [*blame, *TENANT_SETTINGS, "name"]
    mentioned = [setting for setting in candidates if setting in message]
    return f"tenant.{mentioned[0]}" if mentioned else "tenant"
