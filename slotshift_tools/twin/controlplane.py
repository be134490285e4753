"""The control plane in the twin: the production one, in process, on the virtual loop.

`controlplane.server.ControlPlane` builds, from the stack's config, what the service runs: each
pool's PoolState (with its gateway registry), its PoolRuntime (the DecisionLoop, the paced
re-grants) and the GatewayStreamService. The twin builds it the same way and runs those objects
without the servers: each pool's decision loop and re-grants as processes, and the gateway
stream's reader and writer (`GatewayStreamService.serve`: push slots, deltas, which pushes may
wait) on each gateway's in-memory stream per pool (stream.py). Every knob is the service's own:
the decision period, the fast path, reconcile_min_interval_ms, push_min_interval_ms, the
restart hold of gateway_lease_ttl_s, the waste window. What the sampler reads is what the query
API answers (GetAllocation, ListTenants), read from the state directly.
"""

from __future__ import annotations

from collections.abc import Coroutine
from typing import Any

from controlplane.decision_log import DecisionRecord
from controlplane.pool_state import PoolState
from controlplane.server import ControlPlane
from slotshift.clock import Clock
from slotshift.config import SlotshiftConfig
from slotshift_tools.bench.decisions import DecisionView
from slotshift_tools.twin.stream import GatewayStream


class TwinControlPlane:
    """The production control plane of every pool of `config` on the virtual loop (see the
    module docstring). `state`, `decisions` and `granted()` without a pool are the first pool's:
    the whole of a one-pool stack."""

    def __init__(self, config: SlotshiftConfig, *, clock: Clock) -> None:
        self.decisions_of: dict[str, list[DecisionView]] = {p.name: [] for p in config.pools}
        """pool -> its decisions, in order, as the bench's sampler keeps them."""
        self._server = ControlPlane(config, clock=clock, decision_observers=[self._keep])
        self._first = config.pools[0].name
        self.states: dict[str, PoolState] = dict(self._server.pools)
        """pool -> its PoolState."""

    @property
    def state(self) -> PoolState:
        """The first pool's state."""
        return self.states[self._first]

    @property
    def decisions(self) -> list[DecisionView]:
        """The first pool's decisions, in order."""
        return self.decisions_of[self._first]

    def processes(self) -> dict[str, Coroutine[Any, Any, None]]:
        """Every pool's own processes, by name: what ControlPlane.start spawns for them (a
        one-pool stack's are named `decisions` and `regrants`, a fleet's `NAME/decisions`...)."""
        prefix = len(self.states) > 1
        processes: dict[str, Coroutine[Any, Any, None]] = {}
        for name, runtime in self._server.runtimes.items():
            at = f"{name}/" if prefix else ""
            processes[f"{at}decisions"] = runtime.decisions()
            processes[f"{at}regrants"] = runtime.regrants()
        return processes

    async def serve(self, stream: GatewayStream) -> None:
        """The control plane's end of one gateway's stream to one pool, until cancelled: its
        hello (as Connect reads it: the pool it names), then GatewayStreamService.serve."""
        first = await anext(stream.up)
        if not first.HasField("hello") or first.hello.pool not in self.states:
            raise ValueError(f"a gateway's first message must be a hello to one of {self.states}")
        state = self.states[first.hello.pool]
        await self._server.gateway_service.serve(state, first.hello, stream.up, stream.down)

    def granted(self, pool: str | None = None) -> dict[str, int]:
        """What the gateways may admit now in `pool` (default: the first), per tenant, summed
        (GetAllocation's gateways)."""
        state = self.states[pool if pool is not None else self._first]
        cells = state.allocation.cells
        sums = cells.limits.sum(axis=0)
        granted = dict.fromkeys(state.allocation.tenant_limits, 0)
        for column, name in enumerate(cells.tenants):
            granted[name] = int(sums[column])
        return granted

    def _keep(self, record: DecisionRecord) -> None:
        self.decisions_of[record.pool].append(
            DecisionView(
                id=record.id,
                decided_at_wall_s=record.decided_at_wall_s,
                outcome=record.outcome.value,
                outputs=dict(record.outputs),
                reason=record.reason,
            )
        )
