"""`slotshift state show|reset`: what the control plane's state store holds over the config file.

show prints, per pool, its counters and its stored admin changes (each an override of the config
file, in the order they apply; those a start-up dropped say why), each with the scheme its key
digests were made under (slotshift/keys.py). A change whose digests are of another scheme than
this config's (made under a rotated key-digest secret) is marked STALE, with what the next start
does with it: refuse to run, or drop it (tenant_keys.drop_stale_key_changes;
controlplane/state_keeper.py). reset deletes the stored
changes (of one pool, or all): the next start runs the config file as it is. The counters stay,
so versions keep growing. Reset a stopped control plane: a running one still runs the changes
and would store its next one above them.
"""

from __future__ import annotations

import asyncio
import datetime
import sys
from typing import TextIO

from controlplane.core.overrides import replay
from controlplane.store.base import StateStore, StoredChange, StoreError
from controlplane.store.opening import store_from_config
from slotshift.config import ConfigError, SlotshiftConfig, key_digester


def run_state(
    config: SlotshiftConfig, action: str, *, pool: str | None, out: TextIO = sys.stdout
) -> int:
    """Run `action` (show or reset) on `config`'s state store; 0 on success, 1 when the store
    cannot be opened or read (said on stderr), 2 for a pool not in the config."""
    if pool is not None and pool not in {p.name for p in config.pools}:
        print(f"slotshift state: no pool {pool!r} in the config", file=sys.stderr)
        return 2
    try:
        return asyncio.run(_run(config, action, pool=pool, out=out))
    except (StoreError, ConfigError, TimeoutError) as exc:
        print(f"slotshift state: {exc or 'the store did not open in time'}", file=sys.stderr)
        return 1


async def _run(config: SlotshiftConfig, action: str, *, pool: str | None, out: TextIO) -> int:
    settings = config.controlplane.state_store
    store = await store_from_config(settings)
    async with asyncio.timeout(settings.connect_timeout_s):
        await store.open()
    try:
        if action == "reset":
            deleted = await store.reset_changes(pool)
            where = f"pool {pool}" if pool is not None else "every pool"
            print(f"deleted {deleted} stored admin changes of {where}", file=out)
            return 0
        await _show(store, config, pool, _where(config), out)
        return 0
    finally:
        await store.close()


def _where(config: SlotshiftConfig) -> str:
    settings = config.controlplane.state_store
    if settings.kind == "postgresql":
        return f"postgresql (DSN in {settings.postgresql_dsn_file})"
    if settings.kind == "sqlite" and settings.sqlite_file is not None:
        return f"sqlite {settings.sqlite_file}"
    return "memory (nothing is kept)"


async def _show(
    store: StateStore, config: SlotshiftConfig, pool: str | None, where: str, out: TextIO
) -> None:
    print(f"state store: {where}", file=out)
    digester = key_digester(config.tenant_keys)
    print(f"key digests of this config: {digester.scheme}", file=out)
    names = [pool] if pool is not None else [p.name for p in config.pools]
    changes = await store.changes(pool)
    # Stale exactly as a start-up finds them: the live changes replayed on the file's pool.
    file_pools = {p.name: p for p in config.pools}
    stale = {
        (o.pool, o.config_version)
        for name in names
        if name in file_pools
        for o in replay(
            file_pools[name],
            [c.override for c in changes if c.override.pool == name and c.dropped_reason is None],
            digester,
        ).stale
    }
    for name in names + sorted({c.override.pool for c in changes} - set(names)):
        counters = await store.counters(name)
        known = "" if name in names else " (not in the config file)"
        print(
            f"pool {name}{known}: config v{max(1, counters.config_version)}, allocation "
            f"versions below {counters.allocation_version}, last decision id "
            f"{counters.decision_id}",
            file=out,
        )
        own = [c for c in changes if c.override.pool == name]
        if not own:
            print("  no stored admin changes: the config file as it is", file=out)
        for change in own:
            key = (change.override.pool, change.override.config_version)
            line = _describe(change)
            if key in stale:
                line += _stale_note(digester.scheme, config.tenant_keys.drop_stale_key_changes)
            print(f"  {line}", file=out)


def _stale_note(scheme: str, drop_stale: bool) -> str:
    """What the next start does with a live change whose digests are not of `scheme`."""
    then = (
        "the next start drops it (tenant_keys.drop_stale_key_changes)"
        if drop_stale
        else "the next start refuses to run (start with the secret it was made under, or set "
        "tenant_keys.drop_stale_key_changes to drop it)"
    )
    return f" STALE: its key digests are not of this config's scheme {scheme}: {then}"


def _describe(change: StoredChange) -> str:
    """One line: the change, its key-digest scheme, when it was stored, why it was dropped."""
    override = change.override
    stored = datetime.datetime.fromtimestamp(override.stored_at_wall_s, datetime.UTC)
    if override.kind == "set_policy":
        what = f"policy {override.policy}"
    else:
        parts = [f"{k}={v}" for k, v in override.settings.items()]
        parts += [f"{k} cleared" for k in override.clear]
        if override.key_digests:
            parts.append(f"{len(override.key_digests)} key(s)")
        what = f"tenant {override.tenant}" + (f": {', '.join(parts)}" if parts else "")
    line = (
        f"v{override.config_version} {override.kind} {what} (key scheme {override.key_scheme}, "
        f"stored {stored:%Y-%m-%d %H:%M:%S} UTC)"
    )
    if change.dropped_reason is not None:
        line += f" DROPPED: {change.dropped_reason}"
    return line
