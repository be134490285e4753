"""One pool at run time: its state, its decision loop, the pacing of its re-grants, and changes
to its config; the services act on a pool only through it.

go-control-plane's roles, per pool: the decision loop and the re-grants produce allocations
(PoolState versions them), the gateway stream service delivers them (controlplane/core/push.py
says what each gateway's update carries and when). An admin change goes to `change_config`,
which swaps the state's config and the loop's policy together and decides at once; a change of a
tenant's keys alone goes to `change_keys`, which leaves the allocation as it is. A reloaded
config file (controlplane/config_reload.py) takes the same two ways; both callers hold
`changing`.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping

from opentelemetry import trace

from controlplane.agent_advisor import ChatAdvisor
from controlplane.core.pacing import paced_rest_s
from controlplane.core.policies import make_policy
from controlplane.decision_log import DecisionRecord
from controlplane.decision_loop import DecisionLoop, DecisionObserver
from controlplane.pool_state import PoolState
from slotshift.clock import Clock
from slotshift.config import PoolConfig

logger = logging.getLogger(__name__)


class PoolRuntime:
    """Runs one pool: decisions every period and on the fast path, re-grants paced to at most
    one per `reconcile_min_interval_s`, config changes from the admin API."""

    def __init__(
        self,
        state: PoolState,
        *,
        clock: Clock,
        reconcile_min_interval_s: float,
        reconcile_max_cores: float = 1.0,
        observers: list[DecisionObserver] | None = None,
        tracer: trace.Tracer | None = None,
    ) -> None:
        self.state = state
        self._clock = clock
        self._reconcile_min_interval_s = reconcile_min_interval_s
        self._reconcile_max_cores = reconcile_max_cores
        pool = state.pool
        self._advisor = ChatAdvisor(pool, pool.agent_policy) if pool.policy == "agent" else None
        self.loop = DecisionLoop(
            state,
            make_policy(pool.policy, fallback=pool.agent_policy.fallback),
            clock=clock,
            observers=observers,
            tracer=tracer,
            advisor=self._advisor,
        )
        self._regrant_wanted = asyncio.Event()
        self.changing = asyncio.Lock()
        """Held while the pool's config changes (an admin change, a config reload): each change
        is built on the config the one before made, and stored under the version after it."""

    @property
    def name(self) -> str:
        return self.state.pool.name

    async def decisions(self) -> None:
        """Decide every period and on the fast path, until cancelled."""
        await self.loop.run()

    async def regrants(self) -> None:
        """Re-grant the pool whenever its gateways' figures or enforced limits moved, at most
        once per interval and within `reconcile_max_cores` of a core (paced_rest_s): a burst of
        reports and acks is one pass over the cells. Until cancelled; while it runs, reports and
        acks no longer reconcile each."""
        state = self.state
        state.reconcile_soon = self._regrant_wanted.set
        try:
            while True:
                await self._regrant_wanted.wait()
                self._regrant_wanted.clear()
                began = self._clock.monotonic()
                state.reconcile()
                rest_s = paced_rest_s(
                    began,
                    self._clock.monotonic(),
                    self._reconcile_min_interval_s,
                    self._reconcile_max_cores,
                )
                if rest_s > 0:
                    await asyncio.sleep(rest_s)
        finally:
            state.reconcile_soon = None

    def change_config(
        self, pool: PoolConfig, key_digests: Mapping[str, tuple[bytes, ...]], what: str
    ) -> DecisionRecord:
        """Run `pool` (validated) from now on, with `key_digests` for its tenants: the state takes
        the config, the loop decides with its policy (and advisor), and a decision runs at once,
        its trigger naming the change (`what`)."""
        version = self.state.replace_config(pool, key_digests)
        self._decide_with(pool)
        logger.info("pool %s config v%d: %s", pool.name, version, what)
        return self.loop.decide_once(trigger=f"config v{version}: {what}")

    def change_keys(self, key_digests: Mapping[str, tuple[bytes, ...]], what: str) -> int:
        """Authenticate the pool's tenants by `key_digests` from now on (a key added or revoked,
        `what` in words); returns the new config version. No decision: a key changes nobody's
        share, and the policy keeps its memory."""
        version = self.state.replace_key_digests(key_digests)
        logger.info("pool %s config v%d: %s", self.name, version, what)
        return version

    def restore_config(
        self, pool: PoolConfig, key_digests: Mapping[str, tuple[bytes, ...]], config_version: int
    ) -> None:
        """Before the pool serves: run `pool` (the config file with the stored admin changes on
        top, controlplane/state_keeper.py) as config version `config_version`, without deciding
        (the decision loop's first decision comes when it starts)."""
        self.state.replace_config(pool, key_digests)
        self.state.config_version = config_version
        self._decide_with(pool)

    def continue_versions_above(self, version: int) -> None:
        """Before the pool serves: publish allocation versions above `version` from now on (a
        restarted control plane continues above every version it published, so that no gateway
        takes its updates for stale ones)."""
        self.state.resume_versions_above(version)

    def _decide_with(self, pool: PoolConfig) -> None:
        """The loop decides with `pool`'s policy (and its advisor) from now on."""
        if pool.policy == "agent":
            if self._advisor is None:
                self._advisor = ChatAdvisor(pool, pool.agent_policy)
            self._advisor.use_pool(pool)
        if pool.policy != self.loop.policy.name:
            policy = make_policy(pool.policy, fallback=pool.agent_policy.fallback)
            self.loop.replace_policy(policy, self._advisor if policy.needs_advice else None)

    async def close(self) -> None:
        """Release what it holds outside the process (the advisor's connections)."""
        if self._advisor is not None:
            await self._advisor.close()
