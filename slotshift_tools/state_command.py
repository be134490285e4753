"""`slotshift state show|reset`: what the control plane's state store holds over the config file.

show prints, per pool, its counters and its stored admin changes (each an override of the config
file, in the order they apply; those a start-up dropped say why). reset deletes the stored
changes (of one pool, or all): the next start runs the config file as it is. The counters stay,
so versions keep growing. Reset a stopped control plane: a running one still runs the changes
and would store its next one above them.
"""

from __future__ import annotations

import asyncio
import datetime
import sys
from typing import TextIO

from controlplane.store.base import StateStore, StoredChange, StoreError
from controlplane.store.opening import store_from_config
from slotshift.config import ConfigError, SlotshiftConfig


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
    names = [pool] if pool is not None else [p.name for p in config.pools]
    changes = await store.changes(pool)
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
            print(f"  {_describe(change)}", file=out)


def _describe(change: StoredChange) -> str:
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
        f"v{override.config_version} {override.kind} {what} (stored {stored:%Y-%m-%d %H:%M:%S} UTC)"
    )
    if change.dropped_reason is not None:
        line += f" DROPPED: {change.dropped_reason}"
    return line
