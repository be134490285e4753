"""The state store a config asks for."""

from __future__ import annotations

import asyncio
import logging

from controlplane.store.base import StateStore
from controlplane.store.postgresql import PostgresStateStore
from controlplane.store.sqlite import MEMORY, SqliteStateStore
from slotshift.config import ConfigError, StateStoreConfig, read_secret_text

logger = logging.getLogger(__name__)


async def store_from_config(config: StateStoreConfig) -> StateStore:
    """The store `config` names, not yet opened. Reads the PostgreSQL DSN's file (ConfigError
    when it cannot be read or is empty); an unset SQLite file (a config built in code) is a
    store in memory, said in a warning."""
    if config.kind == "postgresql":
        assert config.postgresql_dsn_file is not None  # the config's validator says so
        dsn = await asyncio.to_thread(_read_dsn, config.postgresql_dsn_file)
        return PostgresStateStore(dsn, connect_timeout_s=config.connect_timeout_s)
    if config.kind == "memory":
        return SqliteStateStore(MEMORY)
    if config.sqlite_file is None:
        logger.warning(
            "state store: no sqlite_file and no config file to keep it beside: admin changes "
            "and the decision history are kept in memory and lost with the process"
        )
        return SqliteStateStore(MEMORY)
    return SqliteStateStore(config.sqlite_file)


def _read_dsn(path: str) -> str:
    field = "controlplane.state_store.postgresql_dsn_file"
    lines = read_secret_text(path, field=field).splitlines()
    dsn = lines[0].strip() if lines else ""
    if not dsn:
        raise ConfigError(f"{field}: {path} holds no connection string")
    return dsn
