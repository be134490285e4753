"""A config file reloaded while the control plane runs: what it may change, and per pool what
the running config becomes. Pure: no I/O (controlplane/config_reload.py reads the file and the
stored changes, and applies the result).

What reloads live (docs/operations.md, "Reload the config file"): every field of every pool
(tenants added, removed or changed, their keys, the policy and its settings, the budget, the
decision period), applied like an admin change. What needs a restart: the `controlplane` and
`tenant_keys` sections (ports, TLS, the state store, tokens, the key-digest secret: each is bound
to something opened or digested at start) and the set of pools (each pool's runtime, metrics and
streams are built at start). The other services' sections (gateway, agent, engine_sim,
local_stack) are not the control plane's: a change there is theirs to pick up.

Per pool, the precedence is the one a restart applies (controlplane/core/overrides.py): the new
file is the base, the stored admin changes apply on top, and one whose fields the file changed
is dropped: the file wins.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from controlplane.core.overrides import Dropped, Override, replay
from controlplane.core.replica_loss import TenantBounds, with_bounds
from slotshift.config import PoolConfig, SlotshiftConfig, TenantConfig
from slotshift.keys import KeyDigester

RESTART_SECTIONS = ("controlplane", "tenant_keys")
"""The sections of the file a running control plane cannot take: a change there needs a
restart (module docstring)."""

_KEY_FIELDS = frozenset({"api_keys", "api_keys_file"})
"""A tenant's fields that say which keys it holds (shown as "keys", never by value)."""

PoolAction = Literal["none", "keys", "config"]
"""What a reload does to a running pool: nothing (no new version), a change of its tenants'
keys only (no decision, as the admin API's AddKey), or a new config decided on at once."""


ReloadResult = Literal["applied", "unchanged", "invalid", "needs_restart", "store_error"]
"""How a reload ended (controlplane/config_reload.py): applied: some pool took the new file (on a
follower: the file was taken as the base); unchanged: the file is valid and nothing runs
differently; invalid, needs_restart: refused, the running config kept; store_error: the state
store failed, the pools done before it reloaded."""

RELOAD_RESULTS: tuple[ReloadResult, ...] = (
    "applied",
    "unchanged",
    "invalid",
    "needs_restart",
    "store_error",
)


@dataclass(frozen=True, slots=True)
class PoolReload:
    """One pool's part of a reload (plan_pool)."""

    action: PoolAction
    pool: PoolConfig
    """What the pool runs after the reload (the running config when `action` is "none")."""
    key_digests: dict[str, tuple[bytes, ...]]
    """tenant -> its key digests after the reload."""
    file_changes: tuple[str, ...]
    """What the file changed of the pool, in words (pool_changes); empty: the file's pool is as
    it was, and nothing is touched."""
    dropped: tuple[Dropped, ...] = ()
    """Stored admin changes the new file overtook or that no longer apply on it."""
    stale: tuple[Override, ...] = ()
    """Stored changes of another key-digest scheme: neither applied nor dropped (a restart
    decides those, controlplane/state_keeper.py)."""


def restart_needed(running: SlotshiftConfig, loaded: SlotshiftConfig) -> list[str]:
    """What `loaded` changes that a running control plane (on `running`) cannot take, in words
    (`controlplane.grpc_port`, `pools: pool X added`); empty when it can take all of it."""
    problems: list[str] = []
    for section in RESTART_SECTIONS:
        before, after = getattr(running, section), getattr(loaded, section)
        for name in type(before).model_fields:
            if getattr(before, name) != getattr(after, name):
                problems.append(f"{section}.{name}")
    names_before = {p.name for p in running.pools}
    names_after = {p.name for p in loaded.pools}
    problems += [f"pools: pool {n} added" for n in sorted(names_after - names_before)]
    problems += [f"pools: pool {n} removed" for n in sorted(names_before - names_after)]
    return problems


def pool_changes(before: PoolConfig, after: PoolConfig) -> list[str]:
    """What `after` changes of `before` (the same pool), in words, keys never shown: `tenant C
    added`, `tenant A: weight 1.0 -> 3.0`, `tenant B: keys`, `budget_slots 20 -> 24`; empty when
    they are equal."""
    changes: list[str] = []
    for name in type(before).model_fields:
        if name != "tenants" and getattr(before, name) != getattr(after, name):
            changes.append(_field_change(name, getattr(before, name), getattr(after, name)))
    old = {t.name: t for t in before.tenants}
    new = {t.name: t for t in after.tenants}
    changes += [f"tenant {n} added" for n in new if n not in old]
    changes += [f"tenant {n} removed" for n in old if n not in new]
    for name, tenant in new.items():
        if name in old and old[name] != tenant:
            changes.append(f"tenant {name}: {', '.join(_tenant_changes(old[name], tenant))}")
    kept_order = [n for n in old if n in new]
    if not changes and kept_order != [n for n in new if n in old]:
        changes.append("tenants reordered")
    return changes


def plan_pool(
    *,
    running: PoolConfig,
    running_digests: Mapping[str, tuple[bytes, ...]],
    file_before: PoolConfig,
    file_after: PoolConfig,
    stored: Sequence[Override],
    digester: KeyDigester,
    bounds: Mapping[str, TenantBounds] | None = None,
) -> PoolReload:
    """One pool's reload: the file's pool moved from `file_before` to `file_after`; the pool runs
    `running` (with `running_digests`), which is `file_before` with the live `stored` admin
    changes on top. When the file's pool is unchanged, nothing is touched. Otherwise the stored
    changes are replayed on `file_after` as a restart replays them (`replay`: a change whose
    fields the file changed is dropped, the file wins), and the action says how the result
    differs from what runs: not at all ("none"), in keys only ("keys"), or more ("config").
    `bounds` (tenant -> its floor and ceiling slots; a replica group's division over its live
    members, controlplane/core/replica_loss.py) overrides the file's bounds of the tenants it
    names in the result; ValueError (pydantic's ValidationError) when that is no valid pool."""
    if file_before == file_after:
        return PoolReload("none", running, dict(running_digests), ())
    changes = tuple(pool_changes(file_before, file_after)) or ("the pool's config",)
    result = replay(file_after, stored, digester)
    pool = result.pool if bounds is None else with_bounds(result.pool, bounds)
    if _settings(pool) != _settings(running):
        action: PoolAction = "config"
    elif result.key_digests != dict(running_digests):
        action = "keys"
    else:
        action = "none"
    return PoolReload(action, pool, result.key_digests, changes, result.dropped, result.stale)


def _settings(pool: PoolConfig) -> dict[str, Any]:
    """The pool's config but its tenants' keys (which run as digests, compared apart)."""
    data: dict[str, Any] = pool.model_dump(mode="python", exclude={"tenants"})
    data["tenants"] = [t.model_dump(mode="python", exclude=set(_KEY_FIELDS)) for t in pool.tenants]
    return data


def _tenant_changes(before: TenantConfig, after: TenantConfig) -> list[str]:
    changes = [
        _field_change(name, getattr(before, name), getattr(after, name))
        for name in type(before).model_fields
        if name not in _KEY_FIELDS and getattr(before, name) != getattr(after, name)
    ]
    if any(getattr(before, n) != getattr(after, n) for n in sorted(_KEY_FIELDS)):
        changes.append("keys")
    return changes


def _field_change(name: str, before: object, after: object) -> str:
    """`name before -> after` for a scalar; `name` alone for a section (it may hold secrets)."""
    scalars = (str, int, float, bool, type(None))
    if isinstance(before, scalars) and isinstance(after, scalars):
        return f"{name} {before} -> {after}"
    return f"{name} changed"
