"""A real PostgreSQL server for tests: Debian's `postgresql` package, started in a temporary
folder on a unix socket only (no TCP port), one database per test.

initdb refuses to run as root, and CI runs as root: there the server runs as the `postgres`
user that the package creates (`runuser`), in a folder handed to it.
"""

from __future__ import annotations

import itertools
import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import psycopg

PG_ROOT = Path("/usr/lib/postgresql")
"""Where Debian installs each major version's binaries (PG_ROOT/15/bin/...)."""

SUPERUSER = "slotshift"
"""The cluster's superuser the tests connect as (trust authentication on the socket)."""

START_TIMEOUT_S = 60


def postgres_bin_dir() -> Path | None:
    """The newest installed version's bin folder with initdb, pg_ctl and postgres; None: not
    installed (`apt-get install postgresql`)."""
    if not PG_ROOT.is_dir():
        return None
    versions = sorted((p for p in PG_ROOT.iterdir() if p.name.isdigit()), key=lambda p: int(p.name))
    for version in reversed(versions):
        bin_dir = version / "bin"
        if all((bin_dir / tool).is_file() for tool in ("initdb", "pg_ctl", "postgres")):
            return bin_dir
    return None


class PostgresServer:
    """One PostgreSQL cluster in a temporary folder, listening on a unix socket there."""

    def __init__(self, bin_dir: Path) -> None:
        self._bin_dir = bin_dir
        # A short path: a unix socket's path is limited to about 100 bytes.
        self.folder = Path(tempfile.mkdtemp(prefix="slotshift-pg-", dir="/tmp"))
        self._data = self.folder / "data"
        self._databases = itertools.count(1)
        self._as_postgres = os.geteuid() == 0
        if self._as_postgres:
            shutil.chown(self.folder, user="postgres")

    def _tool(self, name: str, *args: str, check: bool = True) -> None:
        command = [str(self._bin_dir / name), *args]
        if self._as_postgres:
            command = ["runuser", "-u", "postgres", "--", *command]
        subprocess.run(command, check=check, capture_output=True, timeout=START_TIMEOUT_S)

    def start(self) -> None:
        """initdb, then start the server; CalledProcessError (with its output) if either
        fails."""
        self._tool("initdb", "-D", str(self._data), "-A", "trust", "-U", SUPERUSER, "--no-sync")
        # fsync off: the tests check what the store does, not the disk's durability.
        options = f"-c listen_addresses='' -k {self.folder} -c fsync=off"
        log = self.folder / "server.log"
        self._tool("pg_ctl", "-D", str(self._data), "-o", options, "-l", str(log), "-w", "start")

    def dsn(self, database: str = "postgres") -> str:
        return f"host={self.folder} user={SUPERUSER} dbname={database}"

    def new_database(self) -> str:
        """A fresh, empty database; returns its DSN."""
        name = f"test_{next(self._databases)}"
        with psycopg.connect(self.dsn(), autocommit=True) as connection:
            connection.execute(f"CREATE DATABASE {name}")
        return self.dsn(name)

    def stop(self) -> None:
        """Stop the server at once (if it runs) and delete its folder."""
        if self._data.is_dir():
            self._tool("pg_ctl", "-D", str(self._data), "-m", "immediate", "stop", check=False)
        shutil.rmtree(self.folder, ignore_errors=True)
