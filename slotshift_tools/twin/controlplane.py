"""The control plane in the twin: the production one, in process, on the virtual loop.

`controlplane.server.ControlPlane` builds, from the stack's config, what the service runs: each
pool's PoolState (with its gateway registry), its PoolRuntime (the DecisionLoop, the paced
re-grants) and the GatewayStreamService. The twin builds it the same way and runs those objects
without the servers: the pool's decision loop and re-grants as processes, and the gateway
stream's reader and writer (`GatewayStreamService.serve`: push slots, deltas, which pushes may
wait) on each gateway's in-memory stream (stream.py). Every knob is the service's own: the
decision period, the fast path, reconcile_min_interval_ms, push_min_interval_ms, the restart
hold of gateway_lease_ttl_s, the waste window. What the sampler reads is what the query API
answers (GetAllocation, ListTenants), read from the state directly.
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
    """One pool's production control plane on the virtual loop (see the module docstring)."""

    def __init__(self, config: SlotshiftConfig, *, clock: Clock) -> None:
        if len(config.pools) != 1:
            raise ValueError("the twin runs one pool")
        self.decisions: list[DecisionView] = []
        """Every decision, in order, as the bench's sampler keeps them."""
        self._server = ControlPlane(config, clock=clock, decision_observers=[self._keep])
        self._pool = config.pools[0].name
        self.state: PoolState = self._server.pools[self._pool]
        self._runtime = self._server.runtimes[self._pool]

    def processes(self) -> dict[str, Coroutine[Any, Any, None]]:
        """The pool's own processes, by name: what ControlPlane.start spawns for it."""
        return {"decisions": self._runtime.decisions(), "regrants": self._runtime.regrants()}

    async def serve(self, stream: GatewayStream) -> None:
        """The control plane's end of one gateway's stream, until cancelled: its hello (as
        Connect reads it), then GatewayStreamService.serve."""
        first = await anext(stream.up)
        if not first.HasField("hello") or first.hello.pool != self._pool:
            raise ValueError(f"a gateway's first message must be a hello to pool {self._pool}")
        await self._server.gateway_service.serve(self.state, first.hello, stream.up, stream.down)

    def granted(self) -> dict[str, int]:
        """What the gateways may admit now, per tenant, summed (GetAllocation's gateways)."""
        cells = self.state.allocation.cells
        sums = cells.limits.sum(axis=0)
        granted = dict.fromkeys(self.state.allocation.tenant_limits, 0)
        for column, name in enumerate(cells.tenants):
            granted[name] = int(sums[column])
        return granted

    def _keep(self, record: DecisionRecord) -> None:
        self.decisions.append(
            DecisionView(
                id=record.id,
                decided_at_wall_s=record.decided_at_wall_s,
                outcome=record.outcome.value,
                outputs=dict(record.outputs),
                reason=record.reason,
            )
        )
