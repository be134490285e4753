"""The PostgreSQL state store: one database that several control-plane replicas share.

psycopg 3's async API; one connection, its transactions one at a time (an asyncio lock): the
control plane's traffic to its store is a few transactions a second. A connection that fails is
dropped and made again on the next call, so a database restart costs the calls made while it is
down (each a StoreError), not the control plane. The schema is created under a transaction-level
advisory lock, so that replicas starting together do not race on it.

Connections ask for TCP keepalives, so that a dead server (or network) is noticed rather than
waited on; the leader lease (controlplane/leadership.py) does not rely on them: its holder stops
on its own clock when it could not renew in time.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Sequence

import psycopg

from controlplane.store.base import ChangeConflict, StoreError
from controlplane.store.sql import Rows, SqlStateStore, Statement

SCHEMA_LOCK_KEY = 0x736C6F74_73686674 & 0x7FFF_FFFF_FFFF_FFFF
"""The advisory lock (bigint) held while the schema is created ("slotshft" in ASCII)."""

KEEPALIVES: dict[str, int] = {
    "keepalives": 1,
    "keepalives_idle": 10,
    "keepalives_interval": 5,
    "keepalives_count": 3,
}
"""libpq's TCP keepalives: a silent peer is given up on after about 25 s."""


class PostgresStateStore(SqlStateStore):
    """A StateStore (base.py) in the PostgreSQL database `dsn` names (a libpq string or URL);
    `connect_timeout_s` bounds each connection attempt."""

    _greatest = "GREATEST"
    _now = "CAST(extract(epoch FROM clock_timestamp()) AS DOUBLE PRECISION)"
    _schema_lock = (("SELECT pg_advisory_xact_lock(?)", (SCHEMA_LOCK_KEY,)),)

    def __init__(self, dsn: str, *, connect_timeout_s: float = 10.0) -> None:
        self._dsn = dsn
        self._connect_timeout_s = connect_timeout_s
        self._connection: psycopg.AsyncConnection[tuple[object, ...]] | None = None
        self._lock = asyncio.Lock()
        self._open = False

    async def open(self) -> None:
        if self._open:
            raise RuntimeError("the store is open already")
        self._open = True
        try:
            await self._create_schema()
        except BaseException:
            await self.close()
            raise

    async def close(self) -> None:
        self._open = False
        async with self._lock:
            connection, self._connection = self._connection, None
            if connection is not None:
                # Closing a broken connection: nothing is left to release.
                with contextlib.suppress(psycopg.Error):
                    await connection.close()

    async def _run(self, statements: Sequence[Statement]) -> list[Rows]:
        if not self._open:
            raise StoreError("the store is not open")
        async with self._lock:
            return await self._transaction(statements)

    async def _transaction(self, statements: Sequence[Statement]) -> list[Rows]:
        try:
            connection = await self._connected()
            results: list[Rows] = []
            async with connection.transaction(), connection.cursor() as cursor:
                for sql, params in statements:
                    await cursor.execute(_placeholders(sql), params)
                    rows = await cursor.fetchall() if cursor.description is not None else []
                    results.append([tuple(row) for row in rows])
            return results
        except psycopg.errors.UniqueViolation as exc:
            raise ChangeConflict(f"postgresql: {exc}") from exc
        except psycopg.OperationalError as exc:
            await self._forget_connection()
            raise StoreError(f"postgresql: {exc}") from exc
        except (psycopg.Error, OSError) as exc:
            raise StoreError(f"postgresql: {exc}") from exc

    async def _connected(self) -> psycopg.AsyncConnection[tuple[object, ...]]:
        connection = self._connection
        if connection is not None and not connection.closed:
            return connection
        self._connection = await psycopg.AsyncConnection.connect(
            psycopg.conninfo.make_conninfo(
                self._dsn,
                connect_timeout=max(1, round(self._connect_timeout_s)),
                **KEEPALIVES,
            )
        )
        return self._connection

    async def _forget_connection(self) -> None:
        connection, self._connection = self._connection, None
        if connection is not None:
            with contextlib.suppress(psycopg.Error):  # it is broken already
                await connection.close()


def _placeholders(sql: str) -> str:
    """The schema's `?` placeholders as psycopg's `%s` (no statement holds a literal ? or %)."""
    return sql.replace("?", "%s")
