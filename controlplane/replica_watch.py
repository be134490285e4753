"""A replica group's lost members, watched: their slot figures go to the live members while they
are lost, and come back with them (docs/operations.md, "Replica groups").

Every `controlplane.replica_loss.check_interval_s` the watch reads each member pool's telemetry
(`PoolState.telemetry`: its agent's latest report, whether it could scrape the engine, and its
age), takes the signal through the hysteresis (controlplane/core/replica_loss.py), and when the
set of lost members changes, gives every member whose tenants' bounds change under the new
division (`live_bounds`) its new config through PoolRuntime.change_config: one decision at once,
its trigger naming the lost or returned replica. The division is derived state, not an admin
change: nothing is stored but the config version (as a reload stores it, so that a restart
continues above it), and a restart (or a new leader) starts from the file's division and takes
the signal afresh.

Only the leader watches (controlplane/server.py spawns it with the leader's tasks). Each change
holds the config reload's lock, then the pool's `changing` lock, as a reload does: the reload
divides with the same lost set (`bounds`), so a reloaded file keeps the live division.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
from collections.abc import Callable, Mapping

from pydantic import ValidationError

from controlplane.core.replica_loss import (
    ReplicaLossTracker,
    TenantBounds,
    describe,
    engine_down,
    live_bounds,
    with_bounds,
)
from controlplane.runtime import PoolRuntime
from controlplane.state_keeper import StateKeeper
from controlplane.store.base import StoreError
from slotshift.clock import Clock
from slotshift.config import ReplicaLossConfig, SlotshiftConfig

logger = logging.getLogger(__name__)


class ReplicaWatch:
    """Watches the replica groups' members of a control plane (module docstring).

    config: the config running now (its replica groups and members; a reload replaces it).
    settings: the signal's hysteresis and pace (controlplane.replica_loss: only a restart
    changes it).
    lock: the config reload's lock (a null context without a reloader). keeper: the state
    keeper once started (None: no version is stored).
    """

    def __init__(
        self,
        config: Callable[[], SlotshiftConfig],
        runtimes: Mapping[str, PoolRuntime],
        *,
        settings: ReplicaLossConfig,
        clock: Clock,
        lock: Callable[[], contextlib.AbstractAsyncContextManager[object]],
        keeper: Callable[[], StateKeeper | None],
    ) -> None:
        self._config = config
        self._settings = settings
        self._runtimes = runtimes
        self._clock = clock
        self._lock = lock
        self._keeper = keeper
        self._tracker = self._new_tracker()
        self.lost: frozenset[str] = frozenset()
        """The members whose loss the pools run with now (the division's lost set)."""

    def bounds(self, config: SlotshiftConfig) -> dict[str, dict[str, TenantBounds]]:
        """The bounds the members of `config`'s groups run with under the lost set in force (a
        reload divides the file's groups by it; its lock held)."""
        return live_bounds(config, self.lost)

    async def run(self) -> None:
        """Check every check_interval_s until cancelled; starts with every member live (the
        pools run the file's division when a replica begins to lead) and ends so too."""
        self._tracker = self._new_tracker()
        self.lost = frozenset()
        try:
            while True:
                await self.check()
                await asyncio.sleep(self._settings.check_interval_s)
        finally:
            self.lost = frozenset()

    async def check(self) -> None:
        """Observe every member's signal now; when the lost set changed, apply the division it
        makes (module docstring)."""
        config = self._config()
        now_s = self._clock.monotonic()
        members = {pool.name for pool in config.pools if pool.replica_group is not None}
        for name in sorted(members):
            state = self._runtimes[name].state
            record = state.telemetry
            down = engine_down(
                reported=record is not None,
                scraped=record is None or record.engine_scraped,
                age_s=state.telemetry_age_s(),
                silent_after_s=self._settings.silent_after_s,
            )
            self._tracker.observe(name, down, now_s)
        lost = self._tracker.lost & members
        if lost == self.lost:
            return
        async with self._lock():
            await self._apply(lost)

    async def _apply(self, lost: frozenset[str]) -> None:
        """Run the division of `lost` on every member whose bounds it changes (the reload's
        lock held); a member whose new config is invalid keeps its own (logged)."""
        config = self._config()
        went, came = sorted(lost - self.lost), sorted(self.lost - lost)
        self.lost = lost
        for name in went:
            logger.warning(
                "replica %s (group %s) lost: its engine unreachable, its slot figures go to the "
                "group's live members",
                name,
                config.pool(name).replica_group,
            )
        for name in came:
            logger.info(
                "replica %s (group %s) back: the group's division restored",
                name,
                config.pool(name).replica_group,
            )
        events = [f"replica {n} lost" for n in went] + [f"replica {n} back" for n in came]
        for name, bounds in live_bounds(config, lost).items():
            runtime = self._runtimes[name]
            async with runtime.changing:
                running = runtime.state.pool
                try:
                    pool = with_bounds(running, bounds)
                except ValidationError as exc:
                    logger.error(
                        "pool %s: the group's division over its live replicas is not a valid "
                        "pool (%s); it keeps its bounds",
                        name,
                        exc.errors()[0]["msg"],
                    )
                    continue
                if pool is running:
                    continue
                members = [p.name for p in config.members_of(str(running.replica_group))]
                over = [p for p in members if p not in lost] or members
                what = (
                    f"{', '.join(events)}: group {running.replica_group} divided over "
                    f"{', '.join(over)}: {'; '.join(describe(running, pool))}"
                )
                await self._raise_version(runtime)
                runtime.change_config(pool, runtime.state.key_digests, what)

    async def _raise_version(self, runtime: PoolRuntime) -> None:
        """Store the version the change takes, as a reload does (a restart continues above
        it); a store that fails does not hold the change back: the slots matter more than a
        version a restart might number again (logged)."""
        keeper = self._keeper()
        if keeper is None:
            return
        try:
            await keeper.raise_config_version(runtime.name, runtime.state.config_version + 1)
        except StoreError as exc:
            logger.warning(
                "pool %s: config version %d not stored (%s); applied anyway",
                runtime.name,
                runtime.state.config_version + 1,
                exc,
            )

    def _new_tracker(self) -> ReplicaLossTracker:
        return ReplicaLossTracker(
            lost_after_s=self._settings.lost_after_s, back_after_s=self._settings.back_after_s
        )
