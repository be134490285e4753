"""The state store's contract: what the control plane keeps beyond its process.

Per pool: the admin changes (each an override on top of the config file,
controlplane/core/overrides.py), three counters that must only grow across restarts (the config
version, the allocation version's ceiling, the decision id), and the decision log as the
in-memory log stores it (controlplane/decision_log.py: changes, with key frames), and the
gateways it last counted (their ids: a restarted or newly elected leader knows whom to wait for).
Beside them, the leader lease of a set of replicas (controlplane/leadership.py). The
implementations (sqlite.py, postgresql.py) keep them in one schema (sql.py).

Every method may await and does I/O off the event loop; each raises StoreError when the store
cannot be reached or answers an error (ChangeConflict when a config version is taken), and
nothing else but CancelledError. With several control-plane replicas on one PostgreSQL database,
the store is the authority: a change is accepted only once stored under a config version nobody
else holds.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Protocol

from controlplane.core.overrides import Override
from controlplane.decision_log import LoggedDecision


class StoreError(Exception):
    """The store could not do what was asked (unreachable, an SQL error, a damaged row)."""


class ChangeConflict(StoreError):
    """The pool's config version is taken already (another replica, or a stale writer)."""


@dataclass(frozen=True, slots=True)
class StoredChange:
    """An override as stored, and whether a start-up dropped it (the file won)."""

    override: Override
    dropped_reason: str | None = None
    dropped_at_wall_s: float | None = None


@dataclass(frozen=True, slots=True)
class Counters:
    """A pool's counters; 0 where nothing was stored."""

    config_version: int = 0
    """The highest config version any stored change had, or a config reload made (reset keeps
    it)."""
    allocation_version: int = 0
    """The ceiling the allocation versions published stayed below (controlplane/state_keeper)."""
    decision_id: int = 0
    """The highest decision id stored."""


@dataclass(frozen=True, slots=True)
class HistoryQuery:
    """Which stored decisions of a pool: from the first that has an id above
    `after_decision_id`, an allocation version of at least `since_version` and was made at or
    after `since_wall_s`, on; at most `limit` of them."""

    limit: int
    since_version: int = 0
    since_wall_s: float = 0.0
    after_decision_id: int = 0


@dataclass(frozen=True, slots=True)
class Lease:
    """A leader lease as it stands in the store."""

    holder: str
    """The replica that holds it (or last held it); "" when nobody ever did."""
    epoch: int
    """How many times it was taken: every taking raises it by one, and only ever raises it."""
    remaining_s: float
    """Seconds until it expires, by the store's clock; at most 0: expired."""


class StateStore(Protocol):
    """What the control plane and `slotshift state` need of a store."""

    async def open(self) -> None:
        """Connect, and create or check the schema; StoreError when the schema is newer than
        this code's."""

    async def close(self) -> None:
        """Release the connection; never raises."""

    async def add_change(self, change: Override) -> None:
        """Store an accepted change and raise its pool's config-version counter to its version;
        ChangeConflict when that version is stored already."""

    async def changes(self, pool: str | None = None) -> list[StoredChange]:
        """The stored changes of `pool` (None: of every pool), dropped ones included, by pool
        and config version."""

    async def drop_change(self, pool: str, config_version: int, *, reason: str) -> None:
        """Mark a change dropped with its reason: start-ups skip it, `slotshift state show`
        shows it."""

    async def reset_changes(self, pool: str | None = None) -> int:
        """Delete the stored changes of `pool` (None: all); returns how many. The counters are
        kept: versions go on growing."""

    async def counters(self, pool: str) -> Counters:
        """The pool's counters."""

    async def raise_counters(
        self,
        pool: str,
        *,
        allocation_version: int = 0,
        decision_id: int = 0,
        config_version: int = 0,
    ) -> None:
        """Raise the pool's counters to these values where they are below (never lower); the
        config version without a change stored (a config file reloaded)."""

    async def add_decisions(self, entries: Sequence[LoggedDecision]) -> None:
        """Store logged decisions (of any pools) and raise each pool's decision-id counter."""

    async def decisions(self, pool: str, query: HistoryQuery) -> list[LoggedDecision]:
        """The stored decisions `query` asks for, in id order, preceded by those from the key
        frame before the first of them (what `decision_log.rebuild` needs to make them whole)."""

    async def prune_decisions(self, *, older_than_wall_s: float, keep_count: int) -> int:
        """Delete, in every pool, decisions made before `older_than_wall_s` or beyond the newest
        `keep_count`, in key-frame steps: never one that a kept decision needs to be rebuilt.
        Returns how many were deleted."""

    async def gateways(self, pool: str) -> list[str]:
        """The ids of the pool's gateways as last set, sorted."""

    async def set_gateways(self, pool: str, gateway_ids: Sequence[str]) -> None:
        """Replace the pool's gateways with `gateway_ids`."""

    async def acquire_lease(self, name: str, holder: str, ttl_s: float) -> Lease:
        """Take the lease `name` for `holder`, `ttl_s` from now by the store's clock, when it is
        free, expired, or `holder`'s already (a restarted replica takes its own lease back at
        once), with an epoch one above the last. Returns the lease as it stands then: the new
        one, or another's (with the seconds it has left)."""

    async def renew_lease(self, name: str, holder: str, epoch: int, ttl_s: float) -> bool:
        """Extend the lease to `ttl_s` from now, if it is still `holder`'s at `epoch` and has
        not expired; whether it was."""

    async def release_lease(self, name: str, holder: str, epoch: int) -> None:
        """Expire the lease now if it is `holder`'s at `epoch` (a replica that stops in order
        hands over at once); otherwise nothing."""


def decisions_of(entries: Sequence[LoggedDecision]) -> dict[str, int]:
    """pool -> the highest decision id among `entries`."""
    highest: dict[str, int] = {}
    for entry in entries:
        pool = entry.record.pool
        highest[pool] = max(highest.get(pool, 0), entry.record.id)
    return highest
