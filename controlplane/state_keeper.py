"""What of the control plane outlives its process, kept in the state store (controlplane/store/).

At start-up (`restore`, before anything serves), per pool:
- the stored admin changes are applied on top of the config file, in version order
  (controlplane/core/overrides.py); those the file has overtaken are dropped, logged, and marked
  dropped in the store; the pool runs at the highest config version stored;
- stored changes whose key digests are of another scheme than the config's (a rotated
  key-digest secret, or unkeyed digests stored before keyed ones) cannot be applied: a digest
  is not converted without its key. The control plane refuses to start (StaleKeyDigests, each
  change logged with what to do) unless `tenant_keys.drop_stale_key_changes` says to drop them;
- allocation versions continue above the ceiling stored by the last run, and a new ceiling is
  stored before any version is published (`VERSION_LEASE`);
- decision ids continue above the highest stored, and the decision log hands every entry to
  the keeper, which writes them behind in batches.

While it runs: admin changes are written through (`record_change`, awaited by the admin API
before the change applies), decisions are flushed every `decision_flush_interval_ms`, the
version ceiling is moved ahead of the published versions, retention prunes old decisions, and
each pool's gateways (their ids) are written when they change (`keep_gateways`): the next leader
ends its restart hold as soon as all of them have said hello (`restore` tells the pools whom to
expect).
GetDecisions' history reads come from the store (`history`), after a flush.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping, Sequence

from controlplane.core.overrides import Dropped, Override, replay
from controlplane.decision_log import DecisionLog, DecisionRecord, LoggedDecision, rebuild
from controlplane.runtime import PoolRuntime
from controlplane.store.base import HistoryQuery, StateStore, StoreError
from slotshift.clock import Clock
from slotshift.config import PoolConfig, StateStoreConfig
from slotshift.keys import KeyDigester

logger = logging.getLogger(__name__)

VERSION_LEASE = 1_000_000
"""How far ahead of the published allocation versions the stored ceiling is kept. Versions are
published without waiting for the store (the pool's state publishes them synchronously), so the
ceiling must stay ahead by more than a pool publishes between two checks: a million at one check
a second is far above what even 10,000 gateways reconnecting at once cause. A restart jumps by up
to this much (versions are int64)."""

VERSION_CHECK_INTERVAL_S = 1.0
"""How often the published versions are compared with the stored ceiling."""

GATEWAYS_CHECK_INTERVAL_S = 0.1
"""How often each pool's gateways are compared with the stored registry. Short: a gateway that
connected and is not yet stored is one a control plane restarted now would not wait for, and it
may be granted slots from its first allocation (a tuple comparison a check; a write only when
the gateways changed)."""

MAX_PENDING_DECISIONS = 10_000
"""Decisions held while the store cannot be written; beyond this a pool's pending decisions
are dropped (logged) and its next decision is stored whole, so that the history read back is
never rebuilt across the gap."""

CLOSE_FLUSH_TIMEOUT_S = 5.0
"""How long a stopping control plane tries to write its last decisions."""


class StaleKeyDigests(RuntimeError):
    """Stored admin changes hold key digests of another scheme than the config's: the control
    plane must not start and silently stop authenticating their keys. The message says what to
    do; nothing was changed."""


class StateKeeper:
    """Keeps the pools of `runtimes` in `store` (module docstring).

    file_pools: the pools as the config file says (the base the stored changes apply to), read
    at each restore (a config reload replaces them).
    key_digester: how the config's keys are digested (tenant_keys); stored changes of another
    scheme are stale. drop_stale: drop those (logged) rather than refuse to start.
    settings: the state store's section (retention, flush interval, key frames).
    decision_log_size: the in-memory log's capacity (controlplane.decision_log_size).
    """

    def __init__(
        self,
        store: StateStore,
        settings: StateStoreConfig,
        *,
        file_pools: Mapping[str, PoolConfig],
        runtimes: Mapping[str, PoolRuntime],
        clock: Clock,
        decision_log_size: int,
        key_digester: KeyDigester,
        drop_stale: bool = False,
    ) -> None:
        self.store = store
        self._digester = key_digester
        self._drop_stale = drop_stale
        self._settings = settings
        self._file_pools = file_pools
        self._runtimes = runtimes
        self._clock = clock
        self._decision_log_size = decision_log_size
        self._pending: list[LoggedDecision] = []
        self._flush_lock = asyncio.Lock()
        self._ceilings: dict[str, int] = {}
        self._gateways_stored: dict[str, tuple[str, ...]] = {}
        self._failing = False
        """Whether the last write of decisions failed (the error is logged once per streak)."""

    async def restore(self) -> None:
        """Before the pools serve: their stored changes, versions and decision ids (module
        docstring). StoreError when the store cannot be read: a control plane that would forget
        its changes must not start; StaleKeyDigests (nothing restored) when stored changes hold
        key digests of another scheme and drop_stale is off."""
        await self._check_schemes()
        for name, runtime in self._runtimes.items():
            await self._restore_pool(name, runtime)
        for change in await self.store.changes():
            if change.override.pool not in self._runtimes and change.dropped_reason is None:
                reason = "its pool is no longer in the config file"
                logger.warning(_dropped_message(change.override, reason))
                await self.store.drop_change(
                    change.override.pool, change.override.config_version, reason=reason
                )

    async def _check_schemes(self) -> None:
        """StaleKeyDigests when some pool's live stored changes are stale (module docstring)
        and they are not to be dropped; each is logged with its scheme and what to do."""
        stale: list[Override] = []
        for name in self._runtimes:
            stored = [
                c.override for c in await self.store.changes(name) if c.dropped_reason is None
            ]
            stale += replay(self._file_pools[name], stored, self._digester).stale
        if not stale or self._drop_stale:
            return
        for override in stale:
            logger.error(
                "pool %s: stored admin change v%d (%s %s) holds key digests of scheme %s, not "
                "this config's %s: they cannot be converted without the keys",
                override.pool,
                override.config_version,
                override.kind,
                override.tenant,
                override.key_scheme,
                self._digester.scheme,
            )
        raise StaleKeyDigests(
            f"{len(stale)} stored admin changes hold key digests of another scheme than "
            f"{self._digester.scheme} (logged above): start with the key-digest secret they were "
            "made under (tenant_keys.key_digest_secret_file; or tenant_keys.unkeyed_key_digests "
            "for unkeyed ones), or set tenant_keys.drop_stale_key_changes: true for one start to "
            "drop them and then add their keys again through the admin API (AddTenant, AddKey; "
            'docs/operations.md, "API keys")'
        )

    async def _restore_pool(self, name: str, runtime: PoolRuntime) -> None:
        counters = await self.store.counters(name)
        result = replay(self._file_pools[name], await self.live_changes(name), self._digester)
        for override in result.stale:
            reason = (
                f"its key digests are of scheme {override.key_scheme}, the config's "
                f"{self._digester.scheme} (tenant_keys.drop_stale_key_changes)"
            )
            logger.warning(_dropped_message(override, reason))
            await self.store.drop_change(name, override.config_version, reason=reason)
        await self.drop_changes(result.dropped)
        # The ceiling is stored before any version above the old one can be published.
        ceiling = counters.allocation_version + VERSION_LEASE
        await self.store.raise_counters(name, allocation_version=ceiling)
        self._ceilings[name] = ceiling
        runtime.continue_versions_above(counters.allocation_version)
        state = runtime.state
        # Also without a stored change when the file's pool is not the one the runtime was made
        # with: a follower that took a reloaded file (controlplane/config_reload.py).
        if counters.config_version > 0 or (result.pool, result.key_digests) != (
            state.pool,
            state.key_digests,
        ):
            runtime.restore_config(
                result.pool,
                result.key_digests,
                max(counters.config_version, state.config_version),
            )
        gateways = tuple(await self.store.gateways(name))
        self._gateways_stored[name] = gateways
        state.expect_gateways(gateways)
        state.decisions = DecisionLog(
            self._decision_log_size,
            first_id=counters.decision_id + 1,
            on_logged=self._pending.append,
            keyframe_every=self._settings.decision_keyframe_every_count,
        )
        logger.info(
            "pool %s restored from the state store: config v%d (%d stored changes applied, %d "
            "dropped), allocation versions above %d, decisions from id %d, %d gateways expected",
            name,
            state.config_version,
            len(result.applied),
            len(result.dropped),
            counters.allocation_version,
            counters.decision_id + 1,
            len(gateways),
        )

    async def live_changes(self, pool: str) -> list[Override]:
        """The pool's stored admin changes that no start-up or reload dropped, in version
        order; StoreError when the store cannot be read."""
        return [c.override for c in await self.store.changes(pool) if c.dropped_reason is None]

    async def drop_changes(self, dropped: Sequence[Dropped]) -> None:
        """Log each change the config file overtook (or that no longer applies on it) and mark
        it dropped in the store, with its reason; StoreError when the store cannot be written
        (those before stay marked)."""
        for entry in dropped:
            logger.warning(_dropped_message(entry.override, entry.reason))
            await self.store.drop_change(
                entry.override.pool, entry.override.config_version, reason=entry.reason
            )

    async def raise_config_version(self, pool: str, version: int) -> None:
        """Store that the pool ran config version `version` without a stored change (a config
        reload), so that a restart, and the next admin change, continue above it; StoreError
        when the store cannot be written."""
        await self.store.raise_counters(pool, config_version=version)

    async def record_change(self, change: Override) -> None:
        """Store an accepted admin change before it applies (StoreError: it must not apply)."""
        await self.store.add_change(change)

    async def history(
        self, pool: str, query: HistoryQuery, *, changes_only: bool
    ) -> list[DecisionRecord]:
        """The stored decisions `query` asks for, oldest first, whole or (`changes_only`) as
        stored; the decisions not yet written are written first. StoreError when the store
        cannot be read."""
        await self.flush()
        entries = await self.store.decisions(pool, query)
        first = next((e.record.id for e in entries if _admitted(e, query)), None)
        if first is None:
            return []
        return rebuild(entries, from_id=first, changes_only=changes_only)

    async def flush(self) -> None:
        """Write the pending decisions. On failure they stay pending (up to
        MAX_PENDING_DECISIONS) and the error is logged once until a write succeeds again."""
        async with self._flush_lock:
            batch, self._pending[:] = list(self._pending), []
            if not batch:
                return
            try:
                await self.store.add_decisions(batch)
            except StoreError as exc:
                self._pending[:0] = batch
                if not self._failing:
                    logger.error("state store: cannot write decisions (kept, retried): %s", exc)
                self._failing = True
                self._shed()
                return
            if self._failing:
                logger.info("state store: decisions are written again")
            self._failing = False

    def _shed(self) -> None:
        """Past MAX_PENDING_DECISIONS, drop the pending decisions of the pool holding most."""
        while len(self._pending) > MAX_PENDING_DECISIONS:
            counts: dict[str, int] = {}
            for entry in self._pending:
                counts[entry.record.pool] = counts.get(entry.record.pool, 0) + 1
            pool = max(counts, key=lambda name: counts[name])
            self._pending[:] = [e for e in self._pending if e.record.pool != pool]
            self._runtimes[pool].state.decisions.request_keyframe()
            logger.error(
                "state store: %d decisions of pool %s dropped unwritten (the store is down)",
                counts[pool],
                pool,
            )

    async def write_decisions(self) -> None:
        """Flush every decision_flush_interval_ms, until cancelled."""
        interval_s = self._settings.decision_flush_interval_ms / 1000
        while True:
            await asyncio.sleep(interval_s)
            await self.flush()

    async def keep_versions_ahead(self) -> None:
        """Keep each pool's stored version ceiling VERSION_LEASE ahead of its published
        versions, checked every VERSION_CHECK_INTERVAL_S, until cancelled."""
        while True:
            await asyncio.sleep(VERSION_CHECK_INTERVAL_S)
            await self.check_versions()

    async def check_versions(self) -> None:
        """Move a pool's ceiling once its published versions are within half a lease of it."""
        for name, runtime in self._runtimes.items():
            version = runtime.state.allocation.version
            if version + VERSION_LEASE // 2 <= self._ceilings[name]:
                continue
            ceiling = version + VERSION_LEASE
            try:
                await self.store.raise_counters(name, allocation_version=ceiling)
            except StoreError as exc:
                logger.error("state store: cannot move pool %s's version ceiling: %s", name, exc)
                continue
            self._ceilings[name] = ceiling

    async def keep_gateways(self) -> None:
        """Store each pool's gateways (those it counts: connected or within their lease) when
        they changed, checked every GATEWAYS_CHECK_INTERVAL_S, until cancelled."""
        while True:
            await asyncio.sleep(GATEWAYS_CHECK_INTERVAL_S)
            await self.store_gateways()

    async def store_gateways(self) -> None:
        """Write the pools' gateways that changed since last written (errors logged, retried
        at the next check). While a pool's restart hold is on, the gateways it waits for stay
        stored with those that came (until they came back or their lease ran out): one that
        connected during the hold is stored at once, as any other."""
        for name, runtime in self._runtimes.items():
            ids = runtime.state.gateways.ids
            stored = self._gateways_stored.get(name, ())
            if runtime.state.holding:
                ids = tuple(sorted({*stored, *ids}))
            if stored == ids:
                continue
            try:
                await self.store.set_gateways(name, ids)
            except StoreError as exc:
                logger.error("state store: cannot store pool %s's gateways: %s", name, exc)
                continue
            self._gateways_stored[name] = ids

    async def apply_retention(self) -> None:
        """Prune the stored decisions every retention_interval_s, until cancelled."""
        settings = self._settings
        while True:
            await asyncio.sleep(settings.retention_interval_s)
            try:
                deleted = await self.store.prune_decisions(
                    older_than_wall_s=self._clock.wall() - settings.decisions_max_age_s,
                    keep_count=settings.decisions_max_count,
                )
            except StoreError as exc:
                logger.error("state store: cannot apply retention: %s", exc)
                continue
            if deleted:
                logger.info("state store: %d old decisions deleted", deleted)

    async def close(self) -> None:
        """Write what is pending (for at most CLOSE_FLUSH_TIMEOUT_S) and close the store."""
        try:
            async with asyncio.timeout(CLOSE_FLUSH_TIMEOUT_S):
                await self.flush()
        except TimeoutError:
            logger.error("state store: the last decisions were not written in time")
        finally:
            await self.store.close()


def _admitted(entry: LoggedDecision, query: HistoryQuery) -> bool:
    record = entry.record
    return (
        record.id > query.after_decision_id
        and record.version >= query.since_version
        and record.decided_at_wall_s >= query.since_wall_s
    )


def _dropped_message(override: Override, reason: str) -> str:
    return (
        f"pool {override.pool}: stored admin change v{override.config_version} "
        f"({override.kind} {override.tenant or override.policy}) dropped: {reason}"
    )
