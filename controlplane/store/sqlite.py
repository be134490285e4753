"""The SQLite state store: one file, for one control-plane replica (the default).

sqlite3 blocks, so every statement runs on one thread of its own, which holds the one
connection: the event loop never waits on the disk, and the writes are serialised as SQLite
wants them. The database is in WAL mode (readers such as `slotshift state show` do not block
the control plane) with synchronous=FULL: a transaction that returned has reached the disk, and
a kill -9 or a power cut loses none of it.
"""

from __future__ import annotations

import asyncio
import sqlite3
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TypeVar

from controlplane.store.base import ChangeConflict, StoreError
from controlplane.store.sql import Rows, SqlStateStore, Statement

_T = TypeVar("_T")

MEMORY = ":memory:"
"""The path of a database that lives and dies with the process."""

BUSY_TIMEOUT_MS = 5000
"""How long a statement waits for another process's lock on the file (`slotshift state reset`
while the control plane writes) before it fails."""


class SqliteStateStore(SqlStateStore):
    """A StateStore (base.py) in the SQLite file at `path` (created with its folder if missing;
    MEMORY: in memory)."""

    _greatest = "max"

    def __init__(self, path: str) -> None:
        self.path = path
        self._executor: ThreadPoolExecutor | None = None
        self._connection: sqlite3.Connection | None = None

    async def open(self) -> None:
        if self._executor is not None:
            raise RuntimeError("the store is open already")
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="sqlite-store")
        try:
            await self._call(self._connect)
            await self._create_schema()
        except BaseException:
            await self.close()
            raise

    def _connect(self) -> None:
        if self.path != MEMORY:
            Path(self.path).parent.mkdir(parents=True, exist_ok=True)
        # Autocommit: _execute opens and ends every transaction itself.
        connection = sqlite3.connect(
            self.path, isolation_level=None, timeout=BUSY_TIMEOUT_MS / 1000
        )
        try:
            connection.execute("PRAGMA journal_mode=WAL")
            connection.execute("PRAGMA synchronous=FULL")
            connection.execute(f"PRAGMA busy_timeout={BUSY_TIMEOUT_MS}")
        except sqlite3.Error:
            connection.close()
            raise
        self._connection = connection

    async def close(self) -> None:
        executor, self._executor = self._executor, None
        if executor is None:
            return
        try:
            await asyncio.get_running_loop().run_in_executor(executor, self._disconnect)
        finally:
            executor.shutdown(wait=False)

    def _disconnect(self) -> None:
        connection, self._connection = self._connection, None
        if connection is not None:
            connection.close()

    async def _run(self, statements: Sequence[Statement]) -> list[Rows]:
        return await self._call(lambda: self._execute(statements))

    async def _call(self, work: Callable[[], _T]) -> _T:
        if self._executor is None:
            raise StoreError("the store is not open")
        try:
            return await asyncio.get_running_loop().run_in_executor(self._executor, work)
        except sqlite3.IntegrityError as exc:
            raise ChangeConflict(f"sqlite {self.path}: {exc}") from exc
        except (sqlite3.Error, OSError) as exc:
            raise StoreError(f"sqlite {self.path}: {exc}") from exc

    def _execute(self, statements: Sequence[Statement]) -> list[Rows]:
        connection = self._connection
        if connection is None:
            raise sqlite3.ProgrammingError("not connected")
        results: list[Rows] = []
        # IMMEDIATE: take the write lock up front, so that a transaction never fails half-way
        # for want of it.
        connection.execute("BEGIN IMMEDIATE")
        try:
            for sql, params in statements:
                results.append(connection.execute(sql, params).fetchall())
        except BaseException:
            connection.execute("ROLLBACK")
            raise
        connection.execute("COMMIT")
        return results
