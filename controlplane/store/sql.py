"""The one schema and the SQL both stores run (SQLite and PostgreSQL speak it alike).

Tables, all prefixed `slotshift_` (a PostgreSQL database may be shared):
- slotshift_schema: the schema's version (SCHEMA_VERSION);
- slotshift_changes: one row per admin change (pool, config_version) with its override as JSON
  and, once a start-up dropped it, why and when;
- slotshift_counters: (pool, name) -> value, only ever raised (GREATEST on conflict);
- slotshift_decisions: one row per logged decision (pool, id), its allocation version, when it
  was made, whether it is a key frame, and the entry as JSON (codec.py);
- slotshift_gateways: (pool, gateway_id), the gateways a pool last counted;
- slotshift_leases: name -> holder, epoch and expiry (seconds since the epoch by the store's
  clock: replicas never compare their own clocks).

The last two came after version 1 without changing it: they are created where missing, and
code that does not know them leaves them alone.

A subclass runs statements (`?` placeholders) in one transaction each call: `_run`.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Sequence
from typing import Any

from controlplane.core.overrides import Override
from controlplane.decision_log import LoggedDecision
from controlplane.store import codec
from controlplane.store.base import (
    Counters,
    HistoryQuery,
    Lease,
    StoredChange,
    StoreError,
    decisions_of,
)

SCHEMA_VERSION = 1
"""The schema this code writes; a store of a later version is refused (written by newer code)."""

Statement = tuple[str, tuple[Any, ...]]
Rows = list[tuple[Any, ...]]

SCHEMA = (
    "CREATE TABLE IF NOT EXISTS slotshift_schema (version INTEGER NOT NULL)",
    """CREATE TABLE IF NOT EXISTS slotshift_changes (
        pool TEXT NOT NULL,
        config_version BIGINT NOT NULL,
        kind TEXT NOT NULL,
        body TEXT NOT NULL,
        stored_at_wall_s DOUBLE PRECISION NOT NULL,
        dropped_reason TEXT,
        dropped_at_wall_s DOUBLE PRECISION,
        PRIMARY KEY (pool, config_version))""",
    """CREATE TABLE IF NOT EXISTS slotshift_counters (
        pool TEXT NOT NULL,
        name TEXT NOT NULL,
        value BIGINT NOT NULL,
        PRIMARY KEY (pool, name))""",
    """CREATE TABLE IF NOT EXISTS slotshift_decisions (
        pool TEXT NOT NULL,
        id BIGINT NOT NULL,
        version BIGINT NOT NULL,
        decided_at_wall_s DOUBLE PRECISION NOT NULL,
        keyframe BOOLEAN NOT NULL,
        body TEXT NOT NULL,
        PRIMARY KEY (pool, id))""",
    """CREATE TABLE IF NOT EXISTS slotshift_gateways (
        pool TEXT NOT NULL,
        gateway_id TEXT NOT NULL,
        PRIMARY KEY (pool, gateway_id))""",
    """CREATE TABLE IF NOT EXISTS slotshift_leases (
        name TEXT NOT NULL PRIMARY KEY,
        holder TEXT NOT NULL,
        epoch BIGINT NOT NULL,
        expires_at_s DOUBLE PRECISION NOT NULL)""",
    "CREATE INDEX IF NOT EXISTS slotshift_decisions_version ON slotshift_decisions (pool, version)",
    "CREATE INDEX IF NOT EXISTS slotshift_decisions_time"
    " ON slotshift_decisions (pool, decided_at_wall_s)",
)

COUNTERS = ("config_version", "allocation_version", "decision_id")

_HISTORY = """
WITH first AS (
    SELECT min(id) AS id FROM slotshift_decisions
    WHERE pool = ? AND id > ? AND version >= ? AND decided_at_wall_s >= ?
), frame AS (
    SELECT max(d.id) AS id FROM slotshift_decisions d, first
    WHERE d.pool = ? AND d.keyframe AND d.id <= first.id
)
SELECT id, body FROM (
    SELECT d.id AS id, d.body AS body FROM slotshift_decisions d, first, frame
    WHERE d.pool = ? AND d.id >= coalesce(frame.id, first.id) AND d.id < first.id
    UNION ALL
    SELECT id, body FROM (
        SELECT d.id AS id, d.body AS body FROM slotshift_decisions d, first
        WHERE d.pool = ? AND d.id >= first.id ORDER BY d.id LIMIT ?
    ) page
) history ORDER BY id
"""
"""The decisions a HistoryQuery asks for and those from the key frame before them, in one
statement: a prune in between cannot take the key frame away."""

_PRUNE = """
DELETE FROM slotshift_decisions WHERE pool = ? AND id < (
    SELECT max(k.id) FROM slotshift_decisions k WHERE k.pool = ? AND k.keyframe AND k.id <= (
        SELECT coalesce(min(c.id), (SELECT max(id) + 1 FROM slotshift_decisions WHERE pool = ?))
        FROM slotshift_decisions c
        WHERE c.pool = ? AND c.decided_at_wall_s >= ?
          AND c.id > (SELECT max(id) FROM slotshift_decisions WHERE pool = ?) - ?
    )
)
"""
"""Delete a pool's decisions before the key frame at or before the oldest one to keep (the
oldest within both limits; none within them: keep from the newest key frame on)."""


class SqlStateStore:
    """The StateStore methods (base.py) over `_run`; `_greatest` names the SQL function that
    takes the larger of two values (max in SQLite, GREATEST in PostgreSQL), `_now` the
    expression of the store's clock in seconds since the Unix epoch."""

    _greatest = "max"
    _now = "((julianday('now') - 2440587.5) * 86400.0)"

    async def _run(self, statements: Sequence[Statement]) -> list[Rows]:
        """Run `statements` in one transaction; the rows each returned (empty where none).
        StoreError (ChangeConflict on a unique key taken) when it fails; nothing is changed
        then."""
        raise NotImplementedError

    _schema_lock: tuple[Statement, ...] = ()
    """Statements that open the schema's transaction (PostgreSQL: an advisory lock, so that
    replicas starting together do not race on CREATE TABLE)."""

    async def _create_schema(self) -> None:
        results = await self._run(
            [
                *self._schema_lock,
                *((ddl, ()) for ddl in SCHEMA),
                (
                    "INSERT INTO slotshift_schema (version) SELECT ? "
                    "WHERE NOT EXISTS (SELECT 1 FROM slotshift_schema)",
                    (SCHEMA_VERSION,),
                ),
                ("SELECT max(version) FROM slotshift_schema", ()),
            ]
        )
        version = int(results[-1][0][0])
        if version > SCHEMA_VERSION:
            raise StoreError(
                f"the store's schema is version {version}, newer than this slotshift's "
                f"({SCHEMA_VERSION}): run the newer slotshift, or another store"
            )

    def _raise(self, pool: str, name: str, value: int) -> Statement:
        return (
            "INSERT INTO slotshift_counters (pool, name, value) VALUES (?, ?, ?) "
            "ON CONFLICT (pool, name) DO UPDATE SET value = "
            f"{self._greatest}(slotshift_counters.value, excluded.value)",
            (pool, name, value),
        )

    async def add_change(self, change: Override) -> None:
        await self._run(
            [
                (
                    "INSERT INTO slotshift_changes "
                    "(pool, config_version, kind, body, stored_at_wall_s) VALUES (?, ?, ?, ?, ?)",
                    (
                        change.pool,
                        change.config_version,
                        change.kind,
                        codec.encode_override(change),
                        change.stored_at_wall_s,
                    ),
                ),
                self._raise(change.pool, "config_version", change.config_version),
            ]
        )

    async def changes(self, pool: str | None = None) -> list[StoredChange]:
        columns = "SELECT body, dropped_reason, dropped_at_wall_s FROM slotshift_changes"
        order = " ORDER BY pool, config_version"
        statement: Statement = (
            (columns + order, ())
            if pool is None
            else (columns + " WHERE pool = ?" + order, (pool,))
        )
        (rows,) = await self._run([statement])
        try:
            return [
                StoredChange(
                    codec.decode_override(body),
                    dropped_reason=reason,
                    dropped_at_wall_s=None if at is None else float(at),
                )
                for body, reason, at in rows
            ]
        except codec.CodecError as exc:
            raise StoreError(str(exc)) from exc

    async def drop_change(self, pool: str, config_version: int, *, reason: str) -> None:
        await self._run(
            [
                (
                    "UPDATE slotshift_changes SET dropped_reason = ?, dropped_at_wall_s = ? "
                    "WHERE pool = ? AND config_version = ?",
                    (reason, time.time(), pool, config_version),
                )
            ]
        )

    async def reset_changes(self, pool: str | None = None) -> int:
        count = "SELECT count(*) FROM slotshift_changes"
        delete = "DELETE FROM slotshift_changes"
        where, params = ("", ()) if pool is None else (" WHERE pool = ?", (pool,))
        results = await self._run([(count + where, params), (delete + where, params)])
        return int(results[0][0][0])

    async def counters(self, pool: str) -> Counters:
        (rows,) = await self._run(
            [("SELECT name, value FROM slotshift_counters WHERE pool = ?", (pool,))]
        )
        values = {name: int(value) for name, value in rows if name in COUNTERS}
        return Counters(**values)

    async def raise_counters(
        self,
        pool: str,
        *,
        allocation_version: int = 0,
        decision_id: int = 0,
        config_version: int = 0,
    ) -> None:
        statements = []
        if config_version > 0:
            statements.append(self._raise(pool, "config_version", config_version))
        if allocation_version > 0:
            statements.append(self._raise(pool, "allocation_version", allocation_version))
        if decision_id > 0:
            statements.append(self._raise(pool, "decision_id", decision_id))
        if statements:
            await self._run(statements)

    async def add_decisions(self, entries: Sequence[LoggedDecision]) -> None:
        if not entries:
            return
        # Off the event loop: a key frame of a pool of 10,000 tenants is a large document.
        bodies = await asyncio.to_thread(lambda: [codec.encode_decision(e) for e in entries])
        statements: list[Statement] = [
            (
                "INSERT INTO slotshift_decisions "
                "(pool, id, version, decided_at_wall_s, keyframe, body) VALUES (?, ?, ?, ?, ?, ?)",
                (
                    entry.record.pool,
                    entry.record.id,
                    entry.record.version,
                    entry.record.decided_at_wall_s,
                    entry.keyframe,
                    body,
                ),
            )
            for entry, body in zip(entries, bodies, strict=True)
        ]
        statements += [
            self._raise(pool, "decision_id", highest)
            for pool, highest in decisions_of(entries).items()
        ]
        await self._run(statements)

    async def decisions(self, pool: str, query: HistoryQuery) -> list[LoggedDecision]:
        if query.limit <= 0:
            return []
        params = (
            pool,
            query.after_decision_id,
            query.since_version,
            query.since_wall_s,
            pool,
            pool,
            pool,
            query.limit,
        )
        (rows,) = await self._run([(_HISTORY, params)])
        try:
            return [codec.decode_decision(body) for _, body in rows]
        except codec.CodecError as exc:
            raise StoreError(str(exc)) from exc

    async def prune_decisions(self, *, older_than_wall_s: float, keep_count: int) -> int:
        (pools,) = await self._run([("SELECT DISTINCT pool FROM slotshift_decisions", ())])
        deleted = 0
        for (pool,) in pools:
            results = await self._run(
                [
                    ("SELECT count(*) FROM slotshift_decisions WHERE pool = ?", (pool,)),
                    (_PRUNE, (pool, pool, pool, pool, older_than_wall_s, pool, keep_count)),
                    ("SELECT count(*) FROM slotshift_decisions WHERE pool = ?", (pool,)),
                ]
            )
            before, after = results[0], results[2]
            deleted += int(before[0][0]) - int(after[0][0])
        return deleted

    async def gateways(self, pool: str) -> list[str]:
        (rows,) = await self._run(
            [
                (
                    "SELECT gateway_id FROM slotshift_gateways WHERE pool = ? ORDER BY gateway_id",
                    (pool,),
                )
            ]
        )
        return [str(gateway_id) for (gateway_id,) in rows]

    async def set_gateways(self, pool: str, gateway_ids: Sequence[str]) -> None:
        await self._run(
            [
                ("DELETE FROM slotshift_gateways WHERE pool = ?", (pool,)),
                *(
                    ("INSERT INTO slotshift_gateways (pool, gateway_id) VALUES (?, ?)", (pool, g))
                    for g in sorted(set(gateway_ids))
                ),
            ]
        )

    async def acquire_lease(self, name: str, holder: str, ttl_s: float) -> Lease:
        now = self._now
        results = await self._run(
            [
                (
                    "INSERT INTO slotshift_leases (name, holder, epoch, expires_at_s) "
                    "VALUES (?, '', 0, 0) ON CONFLICT (name) DO NOTHING",
                    (name,),
                ),
                (
                    f"UPDATE slotshift_leases SET holder = ?, epoch = epoch + 1, "
                    f"expires_at_s = {now} + ? "
                    f"WHERE name = ? AND (expires_at_s <= {now} OR holder = ?)",
                    (holder, ttl_s, name, holder),
                ),
                (
                    f"SELECT holder, epoch, expires_at_s - {now} FROM slotshift_leases "
                    "WHERE name = ?",
                    (name,),
                ),
            ]
        )
        ((held_by, epoch, remaining_s),) = results[-1]
        return Lease(str(held_by), int(epoch), float(remaining_s))

    async def renew_lease(self, name: str, holder: str, epoch: int, ttl_s: float) -> bool:
        now = self._now
        (rows,) = await self._run(
            [
                (
                    f"UPDATE slotshift_leases SET expires_at_s = {now} + ? "
                    f"WHERE name = ? AND holder = ? AND epoch = ? AND expires_at_s > {now} "
                    "RETURNING epoch",
                    (ttl_s, name, holder, epoch),
                )
            ]
        )
        return bool(rows)

    async def release_lease(self, name: str, holder: str, epoch: int) -> None:
        await self._run(
            [
                (
                    "UPDATE slotshift_leases SET expires_at_s = 0 "
                    "WHERE name = ? AND holder = ? AND epoch = ?",
                    (name, holder, epoch),
                )
            ]
        )
