"""Reloading the config file while the control plane runs: on SIGHUP (controlplane/main.py) or
when the watch sees the file's content change (every controlplane.config_reload_interval_s).

A reload reads the file again through the source it was first read from (the `--set` overrides
apply again) and validates it as a start does. It is refused, the running config kept, when the
file is invalid (`invalid`: unreadable, not YAML, a bad field, an unreadable key file or secret)
or changes what only a restart can (`needs_restart`, controlplane/core/reload.py): one error is
logged naming the problem, and the reload counted by its result
(`slotshift_controlplane_config_reloads_total{result}`).

A valid file is applied pool by pool, each under the pool's `changing` lock (an admin change
waits, or is waited for), as a restart would apply it: the new file is the base, the stored admin
changes apply on top, and one whose fields the file changed is dropped (logged, marked dropped
in the store). A pool whose result differs from what it runs takes it the way an admin change
does (PoolRuntime.change_config: one decision, its trigger `config vN: config file reloaded
(SIGHUP): ...`; or change_keys when only keys moved) and its new config version is stored as its
counter, so that a restart and the next admin change continue above it. A pool the file did not
change is not touched: no new version.

While replicas of a group are lost (controlplane/replica_watch.py), the group's members run the
division over the live replicas, not the file's: a reload holds their tenants' floors and
ceilings to that division (`live_bounds`, taken under `lock`, which the watch's changes hold
too), and the watch restores the file's once the replicas are back.

Only the leader applies. A follower validates and counts the same way, and takes the new file as
its base only: its pools come from the store, replayed on that base, when it is elected
(`lock` keeps an election's restore and a reload apart). A store that fails half-way leaves the
pools done so far reloaded (`store_error`); the next reload (the watch retries the same content)
finishes.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Callable, Mapping, MutableMapping, Sequence
from dataclasses import dataclass

from controlplane.core.reload import ReloadResult, plan_pool, restart_needed
from controlplane.core.replica_loss import Bounds, TenantBounds
from controlplane.runtime import PoolRuntime
from controlplane.state_keeper import StateKeeper
from controlplane.store.base import StoreError
from slotshift.config import ConfigError, ConfigSource, PoolConfig, SlotshiftConfig
from slotshift.keys import KeyDigester

logger = logging.getLogger(__name__)

TRIGGER_CHANGES_SHOWN = 8
"""At most this many of a pool's changes are named in its decision's trigger (all are logged)."""


@dataclass(frozen=True, slots=True)
class ReloadOutcome:
    """What one reload did."""

    result: ReloadResult
    changed_pools: tuple[str, ...] = ()
    """The pools that run a new config version since (in config order)."""
    message: str = ""
    """What was refused or failed, as logged; empty when it applied or changed nothing."""


class ConfigReloader:
    """Reloads the config of a control plane's pools (module docstring).

    source: where the running config was read from. config: the config it was read as.
    file_pools: pool -> the pool as the file says it; shared with the state keeper and the admin
    API (the base their changes apply to), and replaced here as each pool reloads.
    keeper: the state keeper once started (None before: no stored change is replayed).
    leading: whether this replica leads now. on_result: counts each reload's result.
    live_bounds: the slot bounds the replica groups' members run with under the replicas lost
    now, for a loaded config (controlplane/replica_watch.py; called with `lock` held); None:
    every member runs the file's division.
    """

    def __init__(
        self,
        source: ConfigSource,
        config: SlotshiftConfig,
        *,
        file_pools: MutableMapping[str, PoolConfig],
        runtimes: Mapping[str, PoolRuntime],
        key_digester: KeyDigester,
        keeper: Callable[[], StateKeeper | None],
        leading: Callable[[], bool],
        on_result: Callable[[ReloadResult], None],
        live_bounds: Callable[[SlotshiftConfig], Bounds] | None = None,
    ) -> None:
        self.source = source
        self.config = config
        """The config as last read: its sections are the running ones; its pools the file's."""
        self._file_pools = file_pools
        self._runtimes = runtimes
        self._digester = key_digester
        self._keeper = keeper
        self._leading = leading
        self._on_result = on_result
        self._live_bounds = live_bounds
        self.lock = asyncio.Lock()
        """Held while a reload applies; an election's restore holds it too (controlplane/
        server.py), so that a pool is restored on one base or the other, never half."""
        self._wanted = asyncio.Event()
        self._trigger = "SIGHUP"
        self._seen: str | None = None
        """The fingerprint of the files as last read (ConfigSource.fingerprint)."""

    async def look(self) -> None:
        """Take the files' fingerprint as they are now, as the one the running config was read
        from: called at start, before serving, so that the watch sees every later change (one
        made between the first read and this call is seen only with the next change)."""
        self._seen = await asyncio.to_thread(self.source.fingerprint, self.config)

    def request(self, trigger: str = "SIGHUP") -> None:
        """Ask the watch for a reload now (a signal handler: it neither blocks nor awaits)."""
        self._trigger = trigger
        self._wanted.set()

    async def watch(self) -> None:
        """Reload on request, and every controlplane.config_reload_interval_s (0: never) when
        the file's content (or a key file's) changed since last seen; until cancelled. A reload
        the store failed is tried again at the next look, even if nothing changed since."""
        interval_s = self.config.controlplane.config_reload_interval_s
        if self._seen is None:
            await self.look()
        while True:
            try:
                async with asyncio.timeout(interval_s if interval_s > 0 else None):
                    await self._wanted.wait()
            except TimeoutError:
                pass
            requested = self._wanted.is_set()
            self._wanted.clear()
            # Before the read: a change made while it runs is seen at the next look.
            fingerprint = await asyncio.to_thread(self.source.fingerprint, self.config)
            if not requested and fingerprint == self._seen:
                continue
            trigger = self._trigger if requested else "the file changed"
            outcome = await self.reload(trigger)
            if outcome.result != "store_error":
                self._seen = fingerprint

    async def reload(self, trigger: str = "reload_config") -> ReloadOutcome:
        """Read the file again and apply it (module docstring); `trigger` says why in the logs
        and the decisions' triggers. Never raises but CancelledError: every refusal is logged
        and counted."""
        try:
            loaded = await asyncio.to_thread(self.source.load)
        except ConfigError as exc:
            return self._refused(
                "invalid", f"config reload ({trigger}): invalid: {exc}; keeping the running config"
            )
        async with self.lock:
            problems = restart_needed(self.config, loaded)
            if problems:
                return self._refused(
                    "needs_restart",
                    f"config reload ({trigger}): {self.source.path} changes what only a restart "
                    f'applies: {", ".join(problems)} (docs/operations.md, "Reload the config '
                    'file"); keeping the running config',
                )
            changed: list[str] = []
            try:
                adopted = await self._apply(loaded, trigger, changed)
            except StoreError as exc:
                return self._refused(
                    "store_error",
                    f"config reload ({trigger}): the state store failed ({exc}); pools reloaded "
                    f"before: {changed or 'none'}; the others keep their config until the next "
                    "reload",
                    changed=tuple(changed),
                )
            self.config = loaded
        result: ReloadResult = "applied" if changed or adopted else "unchanged"
        logger.info(
            "config reload (%s) of %s: %s%s",
            trigger,
            self.source.path,
            result,
            f", pools {changed} changed" if changed else "",
        )
        self._on_result(result)
        return ReloadOutcome(result, tuple(changed))

    async def _apply(self, loaded: SlotshiftConfig, trigger: str, changed: list[str]) -> bool:
        """Apply each pool of `loaded` (the names of those that changed go to `changed` as they
        do); whether a follower took a changed file as its base. StoreError from the store."""
        adopted = False
        keeper = self._keeper()
        live = {} if self._live_bounds is None else self._live_bounds(loaded)
        for file_after in loaded.pools:
            name = file_after.name
            runtime = self._runtimes[name]
            async with runtime.changing:
                file_before = self._file_pools[name]
                if file_before == file_after:
                    continue
                if not self._leading():
                    # Its pools come from the store on this base once it leads.
                    self._file_pools[name] = file_after
                    adopted = True
                    continue
                bounds = live.get(name)
                if await self._reload_pool(
                    runtime, file_before, file_after, keeper, trigger, bounds
                ):
                    changed.append(name)
                self._file_pools[name] = file_after
        return adopted

    async def _reload_pool(
        self,
        runtime: PoolRuntime,
        file_before: PoolConfig,
        file_after: PoolConfig,
        keeper: StateKeeper | None,
        trigger: str,
        bounds: Mapping[str, TenantBounds] | None,
    ) -> bool:
        """Apply one pool's new file (its `changing` lock held), its tenants held to `bounds`
        when given (a replica group's live division); whether it runs a new config version
        since."""
        state = runtime.state
        name = state.pool.name
        stored = [] if keeper is None else await keeper.live_changes(name)
        plan_of = functools.partial(
            plan_pool,
            running=state.pool,
            running_digests=state.key_digests,
            file_before=file_before,
            file_after=file_after,
            stored=stored,
            digester=self._digester,
        )
        try:
            plan = plan_of(bounds=bounds)
        except ValueError as exc:
            # Not expected (the live division of a valid group fits each member), but a reload
            # never fails for it: the file's own division is valid.
            logger.error(
                "pool %s: the live division of its replica group is no valid pool (%s); it "
                "takes the file's",
                name,
                exc,
            )
            plan = plan_of(bounds=None)
        for override in plan.stale:
            logger.warning(
                "pool %s: stored admin change v%d holds key digests of scheme %s: left out of "
                "the reload (a restart decides it, tenant_keys.drop_stale_key_changes)",
                name,
                override.config_version,
                override.key_scheme,
            )
        if keeper is not None:
            await keeper.drop_changes(plan.dropped)
        logger.info("pool %s: the config file changed %s", name, "; ".join(plan.file_changes))
        if plan.action == "none":
            logger.info("pool %s: what it runs is unchanged (no new config version)", name)
            return False
        if keeper is not None:
            # Stored first, as an admin change is: a restart must not reuse the version.
            await keeper.raise_config_version(name, state.config_version + 1)
        what = f"config file reloaded ({trigger}): {_summary(plan.file_changes)}"
        if plan.dropped:
            what += f"; {len(plan.dropped)} stored admin change(s) dropped, the file won"
        if plan.action == "keys":
            runtime.change_keys(plan.key_digests, what)
        else:
            runtime.change_config(plan.pool, plan.key_digests, what)
        return True

    def _refused(
        self, result: ReloadResult, message: str, *, changed: tuple[str, ...] = ()
    ) -> ReloadOutcome:
        logger.error("%s", message)
        self._on_result(result)
        return ReloadOutcome(result, changed, message)


def _summary(changes: Sequence[str]) -> str:
    shown = "; ".join(changes[:TRIGGER_CHANGES_SHOWN])
    more = len(changes) - TRIGGER_CHANGES_SHOWN
    return shown if more <= 0 else f"{shown}; and {more} more (logged)"
