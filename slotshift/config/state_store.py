"""Where the control plane keeps what must survive it: admin changes, versions, decisions."""

from __future__ import annotations

from typing import Annotated, Literal, Self

from pydantic import Field, model_validator

from slotshift.config.base import ConfigModel, PositiveSeconds

DEFAULT_SQLITE_NAME = "slotshift-state.sqlite3"
"""The SQLite file's name beside the config file, where `sqlite_file` is unset (loading.py)."""


class StateStoreConfig(ConfigModel):
    """The control plane's state store (controlplane/store/; the precedence of what it holds
    over the config file: docs/operations.md, "State that survives a restart")."""

    kind: Literal["sqlite", "postgresql", "memory"] = "sqlite"
    """sqlite: one file on the control plane's disk (one replica); postgresql: a server, for
    more than one replica; memory: nothing survives the process (admin changes, the decision
    history and the version counter start afresh with every start)."""

    sqlite_file: str | None = None
    """The SQLite database (created if missing, with its `-wal` and `-shm` files beside it); a
    relative path is relative to the config file's folder. Unset: `slotshift-state.sqlite3`
    beside the config file (`slotshift up` therefore keeps it beside the file it runs); a config
    built in code rather than loaded from a file then keeps its state in memory (logged)."""

    postgresql_dsn_file: str | None = None
    """A file holding the PostgreSQL connection string (its first line: a libpq `key=value`
    string or a `postgresql://` URL, password included), such as a mounted Kubernetes Secret;
    relative to the config file's folder. Required with kind postgresql."""

    connect_timeout_s: PositiveSeconds = 10.0
    """Seconds the control plane waits for the store to open at start-up (and each PostgreSQL
    connection to be made) before it gives up and exits."""

    decisions_max_age_s: PositiveSeconds = 7 * 24 * 3600.0
    """Decisions older than this are deleted from the store (a week)."""

    decisions_max_count: Annotated[int, Field(ge=1)] = 100_000
    """Decisions kept per pool in the store; beyond this the oldest are deleted. Deletion goes
    in whole key-frame steps (`decision_keyframe_every_count`), so up to that many more may be
    kept than these two limits say."""

    decision_keyframe_every_count: Annotated[int, Field(ge=1)] = 64
    """Every this many decisions of a pool (and the first after each start) is stored whole;
    the others hold only what changed since the decision before, like the in-memory log. A read
    of history rebuilds whole records from the key frame before it: at most this many stored
    decisions more are read than are returned."""

    decision_flush_interval_ms: Annotated[float, Field(gt=0)] = 200.0
    """Decisions are written behind, in batches, this often (the decision loop never waits on
    the store); a crash loses at most this much of the history. Admin changes are written
    through: a change is answered only once it is stored."""

    retention_interval_s: PositiveSeconds = 60.0
    """How often the control plane applies the two retention limits."""

    @model_validator(mode="after")
    def _postgresql_has_dsn(self) -> Self:
        if self.kind == "postgresql" and self.postgresql_dsn_file is None:
            raise ValueError("postgresql_dsn_file: required with kind postgresql")
        return self
