"""The control plane of one pool in the twin, over the production allocation core.

Every choice is the core's: the policy (controlplane.core.policies.make_policy, decide), the
reserve rule and validation every decision goes through (core/publishable.py), each gateway's
part of each limit and the re-split (core/placement.split_targets, split_is_stale), the grants
that keep the budget while slots drain (placement.grant), what a preemptible tenant pauses
(placement.pause_levels) and which pushes may wait (core/push.next_push). What is here is the
bookkeeping the service keeps around them (controlplane/pool_state.py, decision_loop.py,
runtime.py and the gateway stream's push slots, which the tools may not import): each gateway's
newest figures and enforced limits, the versions, the decision loop's period and fast path, the
paced re-grants, the restart hold and the waste window, in the same order and on the same
config. It holds one pool whose gateways stay connected for the whole run.
"""

from __future__ import annotations

import asyncio
import logging
from collections import deque
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from admission_gateway.gateway_state import TenantLimit
from controlplane.core import placement
from controlplane.core.allocation import NO_PAUSE, CellLimits
from controlplane.core.policies import make_policy
from controlplane.core.policy import AllocationPolicy
from controlplane.core.publishable import holding_reserves
from controlplane.core.push import GatewayRow, next_push
from controlplane.core.snapshot import PoolSnapshot, TenantLoad
from controlplane.core.validation import InvalidAllocation
from slotshift.apportion import nominal_shares
from slotshift.clock import Clock
from slotshift.config import ControlPlaneConfig, PoolConfig
from slotshift.demand import LatencySummary, TenantDemand
from slotshift_tools.bench.decisions import HELD, PUBLISHED, REJECTED, DecisionView
from slotshift_tools.twin.gateway import PushedRow

logger = logging.getLogger(__name__)

Row = NDArray[np.int64]
Deliver = Callable[[str, PushedRow], None]
"""(gateway id, update): an allocation update on its way to a gateway."""


def _zeros(size: int) -> Row:
    return np.zeros(size, dtype=np.int64)


class _Gateway:
    """One gateway as the control plane knows it (pool_state's _GatewayRecord)."""

    def __init__(self, tenants: int) -> None:
        self.demand: dict[str, TenantDemand] = {}
        self.observed_at_wall_s: float | None = None
        self.in_flight = _zeros(tenants)
        self.queued = _zeros(tenants)
        self.acked = _zeros(tenants)
        self.sent: dict[int, Row] = {}
        self.pending = _zeros(tenants)
        self.applied_version = 0
        self.output_tokens_total = 0
        self.waste_tokens_total = 0
        self.mailbox: tuple[int, GatewayRow] | None = None
        self.mail = asyncio.Event()

    def bounds(self) -> Row:
        return np.maximum(np.maximum(self.in_flight, self.acked), self.pending)

    def take(
        self, figures: Iterable[TenantDemand], observed_at_wall_s: float, index: Mapping[str, int]
    ) -> None:
        self.demand = {}
        self.in_flight = _zeros(len(index))
        self.queued = _zeros(len(index))
        self.output_tokens_total = self.waste_tokens_total = 0
        for item in figures:
            column = index.get(item.tenant)
            if column is None:
                continue
            self.demand[item.tenant] = item
            self.in_flight[column] = item.in_flight
            self.queued[column] = item.queued
            self.output_tokens_total += item.output_tokens_total
            self.waste_tokens_total += item.waste_tokens_total
        self.observed_at_wall_s = observed_at_wall_s

    def enforcing(self, version: int) -> None:
        if version in self.sent:
            self.acked = self.sent[version]
        if any(v <= version for v in self.sent):
            self.sent = {v: limits for v, limits in self.sent.items() if v > version}
            pending = _zeros(self.acked.size)
            for limits in self.sent.values():
                np.maximum(pending, limits, out=pending)
            self.pending = pending
        self.applied_version = max(self.applied_version, version)


@dataclass(frozen=True)
class TwinDecision:
    """A decision as the twin's log keeps it (the bench's DecisionView, and its trigger)."""

    view: DecisionView
    trigger: str


class TwinControlPlane:
    """One pool's control plane on the virtual loop: `decisions`, `regrants` and one
    `push(gateway)` per gateway are its processes."""

    def __init__(
        self,
        pool: PoolConfig,
        config: ControlPlaneConfig,
        *,
        clock: Clock,
        deliver: Deliver,
        policy: AllocationPolicy | None = None,
    ) -> None:
        self.pool = pool
        self._config = config
        self._clock = clock
        self._deliver = deliver
        self.policy = policy if policy is not None else make_policy(pool.policy)
        self.policy_state: object | None = None
        self.tenants = tuple(t.name for t in pool.tenants)
        self._index = {name: column for column, name in enumerate(self.tenants)}
        self._nominal = nominal_shares(pool)
        self.tenant_limits: dict[str, int] = dict(self._nominal)
        self.cells = CellLimits.empty(self.tenants)
        self.version = 0
        self._gateways: dict[str, _Gateway] = {}
        self._holding_until_s = clock.monotonic() + config.gateway_lease_ttl_s
        self._queued_before = _zeros(len(self.tenants))
        self._waste_samples: deque[tuple[float, int, int]] = deque()
        self._decision_wanted = asyncio.Event()
        self._fast_path_reason = ""
        self._regrant_wanted = asyncio.Event()
        self.log: list[TwinDecision] = []

    # Gateways -----------------------------------------------------------------------------

    def hello(
        self,
        gateway_id: str,
        applied_version: int,
        figures: list[TenantDemand],
        observed_at_wall_s: float,
    ) -> None:
        """A gateway connects: what it enforces is what it says it enforces."""
        record = _Gateway(len(self.tenants))
        record.applied_version = applied_version
        record.take(figures, observed_at_wall_s, self._index)
        for name, item in record.demand.items():
            record.acked[self._index[name]] = item.limit_slots
        self._gateways[gateway_id] = record
        self.reconcile(resplit=True, force_publish=True)

    def report(
        self,
        gateway_id: str,
        applied_version: int,
        figures: list[TenantDemand],
        observed_at_wall_s: float,
    ) -> None:
        """A demand report: the gateway's figures, and an acknowledgement of its version."""
        record = self._gateways[gateway_id]
        record.take(figures, observed_at_wall_s, self._index)
        record.enforcing(applied_version)
        self._observe_waste()
        self._check_fast_path()
        self._regrant_wanted.set()

    def ack(
        self, gateway_id: str, version: int, figures: list[TenantDemand], observed_at_wall_s: float
    ) -> None:
        """The gateway enforces `version` now, with these figures."""
        record = self._gateways[gateway_id]
        record.enforcing(version)
        record.take(figures, observed_at_wall_s, self._index)
        self._regrant_wanted.set()

    def _check_fast_path(self) -> None:
        if not self.pool.fast_path:
            return
        queued = _zeros(len(self.tenants))
        for record in self._gateways.values():
            queued += record.queued
        for column in np.flatnonzero(queued > self._queued_before):
            tenant = self.tenants[column]
            if self.tenant_limits[tenant] < self._nominal[tenant]:
                self._fast_path_reason = (
                    f"fast path: {tenant}'s queue grew to {queued[column]} below its nominal share"
                )
                self._decision_wanted.set()
                break
        self._queued_before = queued

    # What the sampler reads ----------------------------------------------------------------

    def loads(self) -> dict[str, TenantLoad]:
        """Each tenant's load summed over the gateways (p50 weighted by count, p90 and p99 the
        worst, counters summed: pool_state's merge), with the age of its oldest figures."""
        now_wall_s = self._clock.wall()
        result: dict[str, TenantLoad] = {}
        for name in self.tenants:
            items = [
                (r.demand[name], r.observed_at_wall_s)
                for r in self._gateways.values()
                if name in r.demand
            ]
            observed = [at for _, at in items if at is not None]
            result[name] = TenantLoad(
                in_flight=sum(d.in_flight for d, _ in items),
                queued=sum(d.queued for d, _ in items),
                ttft=_merged([d.ttft for d, _ in items]),
                e2e=_merged([d.e2e for d, _ in items]),
                admitted_total=sum(d.admitted_total for d, _ in items),
                completed_total=sum(d.completed_total for d, _ in items),
                rejected_total=sum(d.rejected_total for d, _ in items),
                demand_age_s=max(0.0, now_wall_s - min(observed)) if observed else None,
            )
        return result

    def granted(self) -> dict[str, int]:
        """What the gateways may admit now, per tenant, summed."""
        sums = (
            self.cells.limits.sum(axis=0) if self.cells.gateway_ids else _zeros(len(self.tenants))
        )
        return {name: int(sums[column]) for column, name in enumerate(self.tenants)}

    # Decisions ----------------------------------------------------------------------------

    async def decisions(self) -> None:
        """Decide now, then every period or sooner on the fast path (DecisionLoop.run)."""
        pool = self.pool
        trigger = "period"
        while True:
            self._decision_wanted.clear()
            began = self._clock.monotonic()
            self.decide_once(trigger)
            try:
                await asyncio.wait_for(self._decision_wanted.wait(), timeout=pool.decision_period_s)
            except TimeoutError:
                trigger = "period"
            else:
                trigger = self._fast_path_reason
                delay_s = began + pool.fast_path_min_interval_s - self._clock.monotonic()
                if delay_s > 0:
                    await asyncio.sleep(delay_s)

    def decide_once(self, trigger: str) -> TwinDecision:
        """One decision: snapshot, policy, reserves and validation, publish or hold."""
        pool = self.policy_pool
        snapshot = PoolSnapshot(
            now_s=self._clock.monotonic(),
            tenants=self.loads(),
            current_limits=dict(self.tenant_limits),
            telemetry=None,
            gateways_connected=len(self._gateways),
        )
        outcome = HELD
        try:
            decision = holding_reserves(self.policy.decide(snapshot, pool, self.policy_state), pool)
        except InvalidAllocation as exc:
            outcome, reason = REJECTED, f"invalid allocation: {exc}"
        except Exception as exc:
            # As the decision loop: a failing policy keeps the last good allocation.
            outcome, reason = (
                REJECTED,
                f"policy {self.policy.name} failed: {type(exc).__name__}: {exc}",
            )
            logger.exception("twin: %s", reason)
        else:
            self.policy_state = decision.state
            reason = decision.reason
            if dict(decision.limits) != self.tenant_limits:
                self.tenant_limits = dict(decision.limits)
                self.reconcile(resplit=True)
                outcome = PUBLISHED
            else:
                self.reconcile(resplit=True)
        record = TwinDecision(
            DecisionView(
                id=len(self.log) + 1,
                decided_at_wall_s=self._clock.wall(),
                outcome=outcome,
                outputs=dict(self.tenant_limits),
                reason=reason,
            ),
            trigger,
        )
        self.log.append(record)
        return record

    @property
    def policy_pool(self) -> PoolConfig:
        """The pool as the policies see it: preemption off while the waste is over its cap."""
        settings = self.pool.preemption
        if not settings.enabled or self.waste_percent() <= settings.max_waste_percent:
            return self.pool
        return self.pool.model_copy(
            update={"preemption": settings.model_copy(update={"enabled": False})}
        )

    def _observe_waste(self) -> None:
        now = self._clock.monotonic()
        output = sum(g.output_tokens_total for g in self._gateways.values())
        waste = sum(g.waste_tokens_total for g in self._gateways.values())
        samples = self._waste_samples
        samples.append((now, output, waste))
        horizon = now - self.pool.preemption.waste_window_s
        while len(samples) > 2 and samples[1][0] <= horizon:
            samples.popleft()

    def waste_percent(self) -> float:
        """Waste over the waste window, in percent of the output in it."""
        if len(self._waste_samples) < 2:
            return 0.0
        _, output_then, waste_then = self._waste_samples[0]
        _, output_now, waste_now = self._waste_samples[-1]
        output, waste = output_now - output_then, waste_now - waste_then
        if output <= 0 or waste <= 0:
            return 0.0
        return 100.0 * waste / output

    # Grants and pushes --------------------------------------------------------------------

    async def regrants(self) -> None:
        """Re-grant whenever figures or enforced limits moved, at most once per interval."""
        interval_s = self._config.reconcile_min_interval_ms / 1000.0
        while True:
            await self._regrant_wanted.wait()
            self._regrant_wanted.clear()
            began = self._clock.monotonic()
            self.reconcile()
            rest_s = began + interval_s - self._clock.monotonic()
            if rest_s > 0:
                await asyncio.sleep(rest_s)

    def reconcile(self, *, resplit: bool = False, force_publish: bool = False) -> bool:
        """Recompute what each gateway may admit (PoolState.reconcile over the placement core);
        True when a new version was published."""
        tenants = self.tenants
        ids = tuple(sorted(self._gateways))
        records = [self._gateways[g] for g in ids]
        in_flight = _rows([r.in_flight for r in records], len(tenants))
        demand = in_flight + _rows([r.queued for r in records], len(tenants))
        bounds = _rows([r.bounds() for r in records], len(tenants))
        previous = self.cells
        same_cells = previous.gateway_ids == ids
        if resplit or not same_cells or placement.split_is_stale(previous.targets, demand):
            limits = np.array([self.tenant_limits[t] for t in tenants], dtype=np.int64)
            targets = placement.split_targets(limits, demand)
        else:
            targets = np.array(previous.targets, dtype=np.int64)
        granted = np.zeros_like(bounds)
        for row, gateway_id in enumerate(ids):
            before = previous.row(gateway_id)
            if before is not None:
                granted[row] = previous.limits[before]
        granting = targets
        if self._clock.monotonic() < self._holding_until_s:
            granting = np.minimum(targets, _rows([r.acked for r in records], len(tenants)))
        grants = placement.grant(self.pool.budget_slots, granting, granted, bounds)
        pauses = self._pause_levels(in_flight, grants)
        cells = CellLimits.of(ids, tenants, targets, grants, pauses)
        if cells.same(previous) and not force_publish:
            return False
        self.version += 1
        self.cells = cells
        for row, gateway_id in enumerate(ids):
            before = previous.row(gateway_id)
            changed = before is None or not (
                np.array_equal(previous.targets[before], cells.targets[row])
                and np.array_equal(previous.limits[before], cells.limits[row])
                and np.array_equal(previous.pauses[before], cells.pauses[row])
            )
            if force_publish or changed:
                record = self._gateways[gateway_id]
                record.sent[self.version] = cells.limits[row]
                record.pending = np.maximum(record.pending, cells.limits[row])
                record.mailbox = (self.version, GatewayRow.of(cells, row))
                record.mail.set()
        return True

    def _pause_levels(self, in_flight: Row, grants: Row) -> Row:
        levels = np.full(in_flight.shape, NO_PAUSE, dtype=np.int64)
        settings = self.pool.preemption
        if not settings.enabled or self.waste_percent() > settings.max_waste_percent:
            return levels
        preemptible = {t.name for t in self.pool.tenants if t.preemptible}
        if not preemptible:
            return levels
        terms = placement.PauseTerms(
            preemptible=np.array([t in preemptible for t in self.tenants], dtype=bool),
            nominal=np.array([self._nominal[t] for t in self.tenants], dtype=np.int64),
            limits=np.array([self.tenant_limits[t] for t in self.tenants], dtype=np.int64),
        )
        return placement.pause_levels(terms, in_flight, grants)

    async def push(self, gateway_id: str) -> None:
        """The gateway stream's sender: each newest row, at once when urgent, else at the
        gateway's next push slot (core/push.next_push), until cancelled."""
        record = self._gateways[gateway_id]
        interval_s = self._config.push_min_interval_ms / 1000.0
        pushed: GatewayRow | None = None
        next_slot_s = 0.0
        while True:
            await record.mail.wait()
            record.mail.clear()
            assert record.mailbox is not None
            version, row = record.mailbox
            push = next_push(pushed, row, record.queued)
            while not push.urgent and self._clock.monotonic() < next_slot_s:
                try:
                    await asyncio.wait_for(
                        record.mail.wait(), next_slot_s - self._clock.monotonic()
                    )
                except TimeoutError:
                    break
                record.mail.clear()
                assert record.mailbox is not None
                version, row = record.mailbox
                push = next_push(pushed, row, record.queued)
            self._deliver(gateway_id, PushedRow(version, _limits(row)))
            pushed = row
            next_slot_s = self._clock.monotonic() + interval_s


def _limits(row: GatewayRow) -> tuple[TenantLimit, ...]:
    return tuple(
        TenantLimit(
            name,
            target_slots=int(row.targets[column]),
            limit_slots=int(row.limits[column]),
            pause_above_slots=None if row.pauses[column] == NO_PAUSE else int(row.pauses[column]),
        )
        for column, name in enumerate(row.tenants)
    )


def _rows(rows: list[Row], tenants: int) -> NDArray[np.int64]:
    if not rows:
        return np.zeros((0, tenants), dtype=np.int64)
    return np.stack(rows)


def _merged(summaries: list[LatencySummary]) -> LatencySummary:
    counted = [s for s in summaries if s.count > 0]
    count = sum(s.count for s in counted)
    if count <= 0:
        return LatencySummary()
    return LatencySummary(
        count=count,
        p50_ms=sum(s.p50_ms * s.count for s in counted) / count,
        p90_ms=max(s.p90_ms for s in counted),
        p99_ms=max(s.p99_ms for s in counted),
    )
