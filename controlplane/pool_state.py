"""Everything the control plane knows of one pool, and the one place it changes.

PoolState holds each gateway's newest figures (the `TenantDemand` of every tenant it reported,
and when it observed them), the latest telemetry, the current allocation and the
decision log. Every change goes through its methods, all called on the event loop; whenever the
limits a gateway must enforce change, it builds a new immutable Allocation with the next version
and drops it into every connected gateway's mailbox (the gRPC stream handler sends it). Between
decisions it re-grants as gateways acknowledge and drain (see controlplane/core/grants.py), so
lent slots come back as soon as they are free, not at the next period.
"""

from __future__ import annotations

import asyncio
import dataclasses
import logging
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray

from controlplane.core import placement
from controlplane.core.allocation import NO_PAUSE, Allocation, CellLimits
from controlplane.core.config_change import config_key_digests
from controlplane.core.push import Waiting
from controlplane.core.snapshot import PoolSnapshot, TelemetryView, TenantLoad
from controlplane.decision_log import DecisionLog
from controlplane.registry import (
    Delivery,
    GatewayRecord,
    GatewayRegistry,
    GatewaySession,
    Row,
    Row2,
    TenantDirectory,
    columns_of,
)
from controlplane.token_ledger import TokenCount, TokenLedger
from slotshift.apportion import nominal_shares
from slotshift.clock import Clock
from slotshift.config import PoolConfig
from slotshift.demand import LatencySummary, TenantDemand
from slotshift.keys import KeyDigester

logger = logging.getLogger(__name__)


@dataclass(frozen=True, slots=True)
class TelemetryRecord:
    """The latest telemetry report and when it arrived (monotonic seconds)."""

    received_at_s: float
    agent_id: str
    kv_cache_usage_perc: float
    num_requests_running: float
    num_requests_waiting: float
    gpu_available: bool
    gpu_emulated: bool
    gpu_utilization_pct: float
    trace_context: Mapping[str, str] = field(default_factory=dict)
    """W3C context of the agent's span that sent the report (decisions link to it)."""
    engine_scraped: bool = True
    """Whether the agent could scrape the engine's /metrics for this report (EngineSample's
    scrape_ok): false is the signal of a lost replica (controlplane/core/replica_loss.py)."""


class PoolState:
    """The control plane's state of one pool."""

    def __init__(
        self,
        pool: PoolConfig,
        *,
        clock: Clock,
        gateway_lease_ttl_s: float,
        telemetry_stale_after_s: float,
        decision_log_size: int,
        key_digester: KeyDigester | None = None,
    ) -> None:
        """key_digester: how the config's API keys are digested (tenant_keys); unkeyed by
        default (a config built in code)."""
        self.pool = pool
        self.config_version = 1
        """1 as configured at start-up; one more with every change through the admin API."""
        digester = key_digester if key_digester is not None else KeyDigester.unkeyed()
        self.key_digests: dict[str, tuple[bytes, ...]] = config_key_digests(pool, digester)
        """tenant -> digests of its API keys (slotshift/keys.py; the keys are not kept)."""
        self._draining: set[str] = set()
        """Removed tenants some gateway may still run requests of: their slots stay counted (with
        a target of 0) until every gateway has drained them."""
        self._clock = clock
        self.gateways = GatewayRegistry(clock=clock, lease_ttl_s=gateway_lease_ttl_s)
        """The pool's gateways: sessions, leases, and what each may hold."""
        self._stale_after_s = telemetry_stale_after_s
        self.decisions = DecisionLog(decision_log_size)
        self.policy_state: object | None = None
        self.telemetry: TelemetryRecord | None = None
        self._nominal = nominal_shares(pool)
        """Each tenant's nominal share under the pool's config (computed once per config)."""
        self.tenants: tuple[str, ...] = tuple(t.name for t in pool.tenants)
        """The columns of every gateway's rows: the pool's tenants, then the draining ones."""
        self._index = {name: column for column, name in enumerate(self.tenants)}
        self._loads = _PoolLoads(t.name for t in pool.tenants)
        self.allocation = Allocation(
            pool=pool.name,
            version=0,
            decision_id=0,
            policy=pool.policy,
            budget_slots=pool.budget_slots,
            created_at_wall_s=clock.wall(),
            tenant_limits=dict(self._nominal),
            cells=CellLimits.empty(self.tenants),
        )
        self._version = 0
        self._holding_until_s = clock.monotonic() + gateway_lease_ttl_s
        """Until then no gateway is granted more than it already enforces. A control plane that
        has just started (or restarted) has not heard from every gateway yet: one it does not
        know of may hold slots, and every live gateway reconnects within a lease."""
        self._expected: frozenset[str] = frozenset()
        """The gateways the hold waits for (expect_gateways): once all have connected, it
        ends; none named: it lasts its lease."""
        self._limits_trace_context: Mapping[str, str] = {}
        """W3C context of the decision whose tenant limits are in force (empty: the nominal
        shares, before any decision changed them)."""
        self._queued_before: dict[str, int] = {}
        """Each pool tenant's requests queued over the gateways at the fast path's last look."""
        self._rows_cache: dict[tuple[int, tuple[str, ...]], tuple[Mapping[str, int], Row]] = {}
        self._preemptible: tuple[PoolConfig, tuple[str, ...], NDArray[np.bool_]] | None = None
        self._lending: NDArray[np.bool_] = np.zeros(0, dtype=bool)
        """Which tenants held at most their nominal share at the last reconcile."""
        self._lender_short = False
        """Whether, at the last reconcile, some lender queued where its grant was below its
        target (core/push.py: every shrink is then urgent)."""
        self._over_budget = False
        """Whether, at the last reconcile, the gateways' bounds summed above the budget (a
        gateway that connected late ran on its fallback split): every shrink is then urgent."""
        self._short = False
        """Whether, at the last reconcile, some cell's grant was below its target."""
        self._regrant_due = False
        """Whether the next re-grant may give more than the last one with nothing moved."""
        self._whole_split_due_s = -float("inf")
        """When every tenant's limit is split anew by where its demand is (at least once a
        decision period); in between, only the tenants that need it (_moved_parts)."""
        self._held = False
        """Whether the restart hold was on at the last reconcile."""
        self._capped = False
        """Whether the pool's waste was over its cap at the last reconcile (nothing paused)."""
        self._waste_samples: deque[tuple[float, int, int]] = deque()
        self.tokens = TokenLedger()
        """The tenants' tokens, from the gateways' full reports (ListTenants, GetAllocation)."""
        """(monotonic s, pool output tokens, pool waste tokens) over the waste window."""
        self.decision_wanted = asyncio.Event()
        """Set when something calls for a decision before the next period (the fast path)."""
        self.fast_path_reason = ""
        """Why the fast path last asked for a decision."""
        self.reconcile_soon: Callable[[], None] | None = None
        """Set by a runtime that paces re-grants (controlplane/runtime.py): reports and acks then
        ask it for a reconcile instead of running one each, so that a burst of messages costs one
        whole-pool pass; None (a test, a library user): every message reconciles at once."""

    # Gateways -----------------------------------------------------------------------------

    def connect_gateway(
        self,
        gateway_id: str,
        applied_version: int,
        demand: Iterable[TenantDemand],
        *,
        observed_at_wall_s: float | None = None,
        trace_context: Mapping[str, str] | None = None,
    ) -> GatewaySession:
        """Register a (re)connecting gateway; returns its session, whose mailbox gets every
        allocation from now on (the current one first). `demand` is what its hello says it holds
        and enforces, observed at `observed_at_wall_s` (the gateway's wall clock; None:
        unknown); tenants the pool does not know are dropped. `trace_context` (W3C) is that of
        the connection's span: the pushes it causes are its children."""
        record, previous = self.gateways.connect(
            gateway_id, len(self.tenants), applied_version, self.directory()
        )
        if previous is not None:
            self._forget_figures(previous)
        record.take_figures(demand, observed_at_wall_s, self._index, replaced=self._loads.replaced)
        # What it enforces is what it says it enforces (limits sent to an earlier connection
        # and perhaps not yet applied still count: the registry kept them).
        for name, figures in record.demand.items():
            record.acked[self._index[name]] = figures.limit_slots
        # A restarted control plane continues above any version a gateway has seen, so that the
        # gateway does not ignore its updates as stale.
        self._version = max(self._version, applied_version)
        logger.info("gateway %s connected to pool %s", gateway_id, self.pool.name)
        self._end_hold_if_all_came()
        self.reconcile(resplit=True, force_publish=True, trace_context=trace_context)
        return record.session

    def record_demand(
        self,
        session: GatewaySession,
        applied_version: int,
        demand: Iterable[TenantDemand],
        *,
        observed_at_wall_s: float | None = None,
        delta: bool = False,
    ) -> bool:
        """A gateway's demand report: its figures, observed at `observed_at_wall_s` (its wall
        clock; None: unknown), while it enforces `applied_version`. Returns False, changing
        nothing, when the session is not the gateway's live one. Otherwise the figures replace the
        gateway's (with `delta`, only those of the tenants named; tenants the pool does not know
        dropped), `applied_version` counts as an acknowledgement of that version, and the grants
        are recomputed (at once, or soon: see `reconcile_soon`)."""
        record = self.gateways.live(session)
        if record is None:
            return False
        taken = record.take_figures(
            demand, observed_at_wall_s, self._index, delta=delta, replaced=self._loads.replaced
        )
        self._queue_started(record, taken.started)
        fell = record.enforcing(applied_version)
        # Kept for the version itself: should its acknowledgement still come, the push latency
        # is measured.
        record.sent_at_s = {v: at for v, at in record.sent_at_s.items() if v >= applied_version}
        self._observe_waste()
        self._check_fast_path()
        self._changed(moved=taken.moved, fell=fell)
        return True

    def _check_fast_path(self) -> None:
        """Ask for a decision now when a tenant's queue grows while it holds less than its
        nominal share: waiting for the next period would leave it queueing behind lent slots."""
        if not self.pool.fast_path:
            self._loads.take_queue_moved()
            return
        # Only the tenants whose queue moved since the last look: a report about k tenants
        # costs about k, not the pool's tenants times its gateways.
        moved = self._loads.take_queue_moved()
        if not moved:
            return
        before = self._queued_before
        grown: list[tuple[int, str, int]] = []
        for tenant in moved:
            queued = self._loads.queued(tenant)
            if queued > before.get(tenant, 0):
                grown.append((self._index[tenant], tenant, queued))
            before[tenant] = queued
        for _, tenant, queued in sorted(grown):
            if self.allocation.tenant_limits[tenant] < self._nominal[tenant]:
                self.fast_path_reason = (
                    f"fast path: {tenant}'s queue grew to {queued} below its nominal share"
                )
                self.decision_wanted.set()
                break

    def record_ack(
        self,
        session: GatewaySession,
        version: int,
        demand: Iterable[TenantDemand],
        *,
        observed_at_wall_s: float | None = None,
        delta: bool = False,
    ) -> float | None:
        """The gateway enforces `version` now, with `demand` observed at `observed_at_wall_s`. Returns
        seconds since that version was sent; None for a stale session or a version not pending."""
        record = self.gateways.live(session)
        if record is None:
            return None
        sent_at = record.sent_at_s.get(version)
        latency = None if sent_at is None else self._clock.monotonic() - sent_at
        fell = record.enforcing(version)
        record.sent_at_s = {v: at for v, at in record.sent_at_s.items() if v > version}
        taken = record.take_figures(
            demand, observed_at_wall_s, self._index, delta=delta, replaced=self._loads.replaced
        )
        self._queue_started(record, taken.started)
        self._changed(moved=taken.moved, fell=fell)
        return latency

    def expect_gateways(self, gateway_ids: Iterable[str]) -> None:
        """This control plane starts to serve the pool now (it just started, or was elected
        leader) and `gateway_ids` are the gateways the pool counted last (the state store's
        registry): the restart hold starts again from now and ends as soon as every one of them
        has connected (or its lease has run out, for one that does not come back). None named:
        the hold lasts its lease."""
        self._expected = frozenset(gateway_ids)
        self._holding_until_s = self._clock.monotonic() + self.gateways.lease_ttl_s
        self._end_hold_if_all_came()

    @property
    def holding(self) -> bool:
        """Whether the restart hold is on (no gateway granted more than it enforces)."""
        return self._clock.monotonic() < self._holding_until_s

    def _end_hold_if_all_came(self) -> None:
        if not self._expected or self._clock.monotonic() >= self._holding_until_s:
            return
        connected = {r.gateway_id for r in self.gateways if r.connected}
        if self._expected <= connected:
            self._holding_until_s = self._clock.monotonic()
            logger.info(
                "pool %s: the restart hold ends, every gateway it knew has connected (%d)",
                self.pool.name,
                len(self._expected),
            )

    def resume_versions_above(self, version: int) -> None:
        """Publish allocation versions above `version` from now on (a restarted control plane
        continues above every version it published: controlplane/state_keeper.py)."""
        self._version = max(self._version, version)

    def _queue_started(self, record: GatewayRecord, started: bool) -> None:
        """Requests started to queue at `record`'s gateway: an update held for its push slot may
        now be waited for (core/push.py), so its writer looks at it again."""
        if started and record.delivery is not None:
            record.session.mailbox.put(record.delivery)

    def _changed(self, *, moved: bool, fell: bool) -> None:
        """A gateway's message came: re-grant, at once or, when the pool runs under a runtime
        that paces it (`reconcile_soon`), on its next turn; unless a re-grant now would give
        what the last one gave.

        `moved`: some requests in flight or queued moved (what the split, the grants and the
        pause levels read); `fell`: what the gateway may hold by its limits fell. A fall alone
        changes nothing while every cell has its target, the bounds are within the budget and
        no tenant drains (the grants are the targets whatever the bounds); counters alone
        (admitted, tokens, latencies) change nothing unless they move the waste share across its
        cap; and the restart hold's end, a drained tenant's column leaving and a whole re-split
        falling due are changes of their own. Skipping the rest keeps the
        cost of a report proportional to what it changed (tests/unit/controlplane/
        test_pool_state.py holds it to a re-grant after every message)."""
        if not (
            moved
            or self._regrant_due
            or (fell and (self._short or self._over_budget or self._draining))
            or (self._held and not self.holding)
            or self._waste_capped() != self._capped
            or self.allocation.cells.tenants != self.tenants
            or self._clock.monotonic() >= self._whole_split_due_s
        ):
            return
        if self.reconcile_soon is None:
            self.reconcile()
        else:
            self.reconcile_soon()

    def waiting_at(self, gateway_id: str) -> Waiting | None:
        """Who waits for slots, for an update to `gateway_id` (core/push.py): what it has queued
        per tenant as it last said, and the pool's lenders as of the last reconcile; None: the
        gateway is not known, or the columns changed since that reconcile."""
        record = self.gateways.get(gateway_id)
        if record is None or self._lending.size != len(self.tenants):
            return None
        return Waiting(record.queued, self._lending, self._lender_short, self._over_budget)

    def disconnect_gateway(self, session: GatewaySession) -> None:
        """The gateway's stream ended. Its slots stay counted until its lease runs out, since it
        may still be running what it admitted."""
        if self.gateways.disconnect(session) is None:
            return
        logger.warning(
            "gateway %s disconnected from pool %s; its slots return in %.1f s unless it comes back",
            session.gateway_id,
            self.pool.name,
            self.gateways.lease_ttl_s,
        )
        self.reconcile(resplit=True)

    def record_tokens(self, session: GatewaySession, counts: Iterable[TokenCount]) -> None:
        """A gateway's token counters, from a full report, acknowledgement or hello (nothing for
        a session that is not the gateway's live one)."""
        record = self.gateways.live(session)
        if record is not None:
            self.tokens.record(record.gateway_id, counts, self._clock.monotonic())

    def expire_leases(self) -> None:
        expired = self.gateways.expire()
        for record in expired:
            self._forget_figures(record)
            self.tokens.forget(record.gateway_id)
        if expired:
            self.reconcile(resplit=True)

    def close_sessions(self) -> None:
        """End every gateway's stream (on shutdown); the gateways reconnect elsewhere or later."""
        self.gateways.close_sessions()

    @property
    def gateways_connected(self) -> int:
        return self.gateways.connected

    def applied_versions(self) -> dict[str, int]:
        """gateway id -> the version it last acknowledged, for connected gateways."""
        return self.gateways.applied_versions()

    # Config changes (the admin API) ---------------------------------------------------------

    def known_tenants(self) -> set[str]:
        """Tenants whose usage counts: the pool's, and removed ones still draining."""
        return set(self.tenants)

    def directory(self) -> TenantDirectory:
        """The tenants the gateways must authenticate now, with their key digests."""
        return TenantDirectory(
            pool=self.pool.name,
            config_version=self.config_version,
            tenants={t.name: self.key_digests.get(t.name, ()) for t in self.pool.tenants},
        )

    def replace_config(self, pool: PoolConfig, key_digests: Mapping[str, tuple[bytes, ...]]) -> int:
        """Run `pool` (already validated) from now on; returns the new config version.

        Until the next decision the tenants hold their nominal shares under the new config (a
        valid allocation whatever changed); the caller decides at once. A removed tenant's slots
        stay counted until its running requests finish: its gateways get a limit of 0 and its
        keys stop working, and the slots go to the others through the grants as it drains.
        """
        if pool.name != self.pool.name:
            raise ValueError(f"pool {pool.name!r} cannot replace pool {self.pool.name!r}")
        names = {t.name for t in pool.tenants}
        self._draining = (self._draining | {t.name for t in self.pool.tenants}) - names
        self.pool = pool
        self._nominal = nominal_shares(pool)
        self._set_tenants(tuple(t.name for t in pool.tenants) + tuple(sorted(self._draining)))
        self.key_digests = {t: tuple(key_digests.get(t, ())) for t in names}
        self.config_version += 1
        # Policy memory is per tenant and per policy; it starts again under the new config.
        self.policy_state = None
        self.allocation = dataclasses.replace(
            self.allocation, tenant_limits=dict(self._nominal), policy=pool.policy
        )
        self.gateways.set_directory(self.directory())
        self.reconcile(resplit=True, force_publish=True)
        return self.config_version

    def replace_key_digests(self, key_digests: Mapping[str, tuple[bytes, ...]]) -> int:
        """The pool's tenants hold `key_digests` from now on (a key added or revoked); returns
        the new config version. Nothing else changes: not the allocation, not the policy's
        memory, not any gateway's limits; the gateways get the new directory with their next
        update, which is published at once."""
        self.key_digests = {t.name: tuple(key_digests.get(t.name, ())) for t in self.pool.tenants}
        self.config_version += 1
        self.gateways.set_directory(self.directory())
        self.reconcile(force_publish=True)
        return self.config_version

    def _forget_figures(self, record: GatewayRecord) -> None:
        """A gateway's figures stop counting in the pool's loads."""
        for figures in record.demand.values():
            self._loads.replaced(figures, None)

    def _set_tenants(self, tenants: tuple[str, ...]) -> None:
        """The columns of every row become `tenants` (the pool's, then the draining ones), and
        the policy's view the pool's tenants."""
        if tenants != self.tenants:
            self.gateways.reindex(self.tenants, tenants)
            self.tenants = tenants
            self._index = {name: column for column, name in enumerate(tenants)}
        # The policy's tenants changed (a config change, a drained tenant), with the columns or
        # without them (a removed last tenant drains in its own column): sum afresh.
        self._loads = _PoolLoads(t.name for t in self.pool.tenants)
        for record in self.gateways:
            for figures in record.demand.values():
                self._loads.replaced(None, figures)

    # Telemetry ----------------------------------------------------------------------------

    def record_telemetry(self, record: TelemetryRecord) -> None:
        self.telemetry = record

    def telemetry_age_s(self) -> float | None:
        if self.telemetry is None:
            return None
        return self._clock.monotonic() - self.telemetry.received_at_s

    # Decisions ----------------------------------------------------------------------------

    def snapshot(self) -> PoolSnapshot:
        """What a policy sees now: tenant load summed over the gateways that may hold slots, with
        the age of the oldest figures in each sum."""
        now_wall_s = self._clock.wall()
        loads = self._loads.loads(self.gateways, now_wall_s, draining=bool(self._draining))
        return PoolSnapshot(
            now_s=self._clock.monotonic(),
            tenants=loads,
            current_limits=dict(self.allocation.tenant_limits),
            telemetry=self._telemetry_view(),
            gateways_connected=self.gateways_connected,
        )

    def _telemetry_view(self) -> TelemetryView | None:
        record = self.telemetry
        if record is None:
            return None
        age = self._clock.monotonic() - record.received_at_s
        return TelemetryView(
            age_s=age,
            fresh=age <= self._stale_after_s,
            kv_cache_usage_perc=record.kv_cache_usage_perc,
            num_requests_running=record.num_requests_running,
            num_requests_waiting=record.num_requests_waiting,
            gpu_available=record.gpu_available,
            gpu_emulated=record.gpu_emulated,
            gpu_utilization_pct=record.gpu_utilization_pct,
        )

    def apply_limits(
        self,
        limits: Mapping[str, int],
        decision_id: int,
        policy: str,
        *,
        trace_context: Mapping[str, str] | None = None,
        resplit: bool = True,
    ) -> bool:
        """Adopt validated tenant limits; True when a new allocation was published.

        `trace_context` (W3C) is the decision's: every allocation that carries these limits, now
        or when later re-grants publish it, is pushed under it. `resplit`: split every tenant's
        limit anew by where its demand is; otherwise only those that need it (reconcile).
        """
        self.allocation = dataclasses.replace(
            self.allocation, tenant_limits=dict(limits), decision_id=decision_id, policy=policy
        )
        self._limits_trace_context = dict(trace_context or {})
        return self.reconcile(resplit=resplit) is not None

    def reconcile(
        self,
        *,
        resplit: bool = False,
        force_publish: bool = False,
        trace_context: Mapping[str, str] | None = None,
    ) -> Allocation | None:
        """Recompute what each gateway may admit; publish a new version if anything changed.

        `resplit`: split every tenant's limit among the gateways anew by where its demand is
        (as also happens when the gateways or tenants change, and at least once a decision
        period); otherwise only the tenants that need it move (_moved_parts).
        `trace_context` (W3C) names what caused the change; by default the decision whose limits
        are in force (re-grants as gateways drain carry on that decision's work).
        """
        current = self.allocation
        tenants = self.tenants
        ids = self.gateways.ids
        records = list(self.gateways)
        live = np.array([r.connected for r in records], dtype=bool)
        connected = tuple(g for g, r in zip(ids, records, strict=True) if r.connected)
        in_flight = _rows([r.in_flight for r in records], len(tenants))
        demand = in_flight + _rows([r.queued for r in records], len(tenants))
        acked = _rows([r.acked for r in records], len(tenants))
        # GatewayRecord.bounds of every record, as three whole-array passes rather than two
        # per gateway.
        bounds = np.maximum(
            np.maximum(in_flight, acked), _rows([r.pending for r in records], len(tenants))
        )
        previous = current.cells
        same_cells = previous.gateway_ids == connected and previous.tenants == tenants
        limits = self._row_of(current.tenant_limits)
        live_demand = demand[live]
        now = self._clock.monotonic()
        if resplit or not same_cells or now >= self._whole_split_due_s:
            live_targets = placement.split_targets(limits, live_demand)
            self._whole_split_due_s = now + self.pool.decision_period_s
        else:
            live_targets = self._moved_parts(limits, live_demand, previous)
        targets = np.zeros_like(bounds)
        targets[live] = live_targets
        granted = _granted(previous, ids, tenants)
        # The restart hold caps what may be granted, not the targets the gateways are told.
        granting = targets
        self._held = self.holding
        if self._held:
            granting = np.minimum(targets, acked)
        grants = placement.grant(self.pool.budget_slots, granting, granted, bounds)
        self._short = bool((grants < targets).any())
        # A grant the last allocation made that no bound holds (a reconnected gateway's row)
        # counts as held in this pass and no longer in the next: the next may grant more.
        self._regrant_due = self._short and bool((granted > np.maximum(bounds, grants)).any())
        self._capped = self._waste_capped()
        pauses = self._pause_levels(in_flight[live], grants[live])
        candidate_cells = CellLimits.of(
            connected, tenants, targets[live], grants[live], pauses, pool_limits=limits
        )
        self._lending = limits <= self._row_of(self._nominal)
        short = (grants < targets) & (demand > in_flight) & self._lending
        self._lender_short = bool(short[live].any())
        self._over_budget = int(bounds.sum()) > self.pool.budget_slots
        candidate = dataclasses.replace(current, cells=candidate_cells)
        published: Allocation | None = None
        if candidate.same_limits(current) and not force_publish:
            self.allocation = candidate
        else:
            self._version += 1
            published = dataclasses.replace(
                candidate, version=self._version, created_at_wall_s=self._clock.wall()
            )
            self.allocation = published
            now = self._clock.monotonic()
            delivery = Delivery(
                published,
                cause=dict(trace_context) if trace_context else self._limits_trace_context,
                decision=self._limits_trace_context,
            )
            changed = _changed_rows(previous, candidate_cells)
            by_id = dict(zip(ids, records, strict=True))
            for row, gateway_id in enumerate(connected):
                if force_publish or changed[row]:
                    record = by_id[gateway_id]
                    record.send(published.version, candidate_cells.limits[row], now)
                    record.delivery = delivery
                    record.session.mailbox.put(delivery)
        # A removed tenant stops being counted once no gateway may hold any of it (its column
        # goes after this allocation, which still names it).
        drained = {name for name in self._draining if not bounds[:, self._index[name]].any()}
        if drained:
            self._draining -= drained
            self._set_tenants(
                tuple(t.name for t in self.pool.tenants) + tuple(sorted(self._draining))
            )
        return published

    def _moved_parts(self, limits: Row, demand: Row2, previous: CellLimits) -> Row2:
        """The connected gateways' parts of the tenant limits, between whole splits: only the
        tenants that need it move, so that the other gateways get no update.

        - A tenant whose limit moved is split anew: a cut comes from every gateway in proportion
          to its demand, so that each gateway's finished requests return slots at once.
        - A lending tenant (at most its nominal share) is split anew as soon as one gateway has
          used its part up while another's idles: the lender's next request finds room.
        - Any other tenant moves only when a request of it waits at one gateway while part of
          its limit idles at another, and then by the fewest slots (placement.rebalance).
        """
        parts = previous.targets
        anew = (limits != previous.pool_limits) | (
            (limits <= self._row_of(self._nominal))
            & placement.idle_beside(parts, demand, waiting_only=False)
        )
        waiting = ~anew & placement.idle_beside(parts, demand, waiting_only=True)
        return placement.rebalance(demand, placement.resplit(limits, demand, parts, anew), waiting)

    def _pause_levels(self, in_flight: NDArray[np.int64], grants: NDArray[np.int64]) -> Row2:
        """Where preemptible tenants must pause work above their limits (core/placement.py),
        unless preemption is off or the pool's recent waste is over its cap; NO_PAUSE elsewhere.
        Rows are the connected gateways'."""
        levels = np.full(in_flight.shape, NO_PAUSE, dtype=np.int64)
        if not self.pool.preemption.enabled or self._capped:
            return levels
        preemptible = self._preemptible_columns()
        if not preemptible.any():
            return levels
        terms = placement.PauseTerms(
            preemptible=preemptible,
            nominal=self._row_of(self._nominal),
            limits=self._row_of(self.allocation.tenant_limits),
        )
        return placement.pause_levels(terms, in_flight, grants)

    def _preemptible_columns(self) -> NDArray[np.bool_]:
        """Which columns are preemptible tenants under the pool's config; built once per config
        and column order (read-only: shared)."""
        cached = self._preemptible
        if cached is None or cached[0] is not self.pool or cached[1] != self.tenants:
            names = {t.name for t in self.pool.tenants if t.preemptible}
            columns = np.array([t in names for t in self.tenants], dtype=bool)
            columns.flags.writeable = False
            cached = self._preemptible = (self.pool, self.tenants, columns)
        return cached[2]

    def _row_of(self, per_tenant: Mapping[str, int]) -> Row:
        """`per_tenant` (tenant limits, nominal shares) in the columns' order, 0 for a tenant it
        does not name; built once per mapping and column order (read-only: shared)."""
        key = (id(per_tenant), self.tenants)
        cached = self._rows_cache.get(key)
        if cached is not None and cached[0] is per_tenant:
            return cached[1]
        row = np.array([per_tenant.get(t, 0) for t in self.tenants], dtype=np.int64)
        row.flags.writeable = False
        # Two entries: the tenant limits in force and the nominal shares.
        if len(self._rows_cache) >= 2:
            self._rows_cache.pop(next(iter(self._rows_cache)))
        self._rows_cache[key] = (per_tenant, row)
        return row

    def _observe_waste(self) -> None:
        """Remember the pool's output and waste counters now, for the waste window."""
        now = self._clock.monotonic()
        output, waste = self._loads.output_tokens_total, self._loads.waste_tokens_total
        samples = self._waste_samples
        samples.append((now, output, waste))
        horizon = now - self.pool.preemption.waste_window_s
        while len(samples) > 2 and samples[1][0] <= horizon:
            samples.popleft()

    def _waste_capped(self) -> bool:
        """Whether the pool's recent waste is over its cap, preemption on: nothing is paused."""
        settings = self.pool.preemption
        return settings.enabled and self.waste_percent() > settings.max_waste_percent

    @property
    def policy_pool(self) -> PoolConfig:
        """The pool as the policies see it: with preemption off while the pool's recent waste
        is over its cap. Nothing is paused then (_pause_levels), so no lender's reserve may be
        lent to a preemptible tenant either: its slots would come back only as the borrowed
        requests end."""
        if not self._waste_capped():
            return self.pool
        settings = self.pool.preemption
        return self.pool.model_copy(
            update={"preemption": settings.model_copy(update={"enabled": False})}
        )

    def waste_percent(self) -> float:
        """Waste over the last waste_window_s, in percent of the output in that window (0 until
        there is output). Counters of gateways that left or restarted count from their return."""
        if len(self._waste_samples) < 2:
            return 0.0
        _, output_then, waste_then = self._waste_samples[0]
        _, output_now, waste_now = self._waste_samples[-1]
        output = output_now - output_then
        waste = waste_now - waste_then
        if output <= 0 or waste <= 0:
            return 0.0
        return 100.0 * waste / output


def _changed_rows(before: CellLimits, after: CellLimits) -> NDArray[np.bool_]:
    """For each gateway of `after`, whether anything of its row differs from `before` (a
    gateway new there, or new tenants, count as changed): only those gateways get the new
    version, so a re-grant on one gateway costs the others nothing."""
    changed = np.ones(len(after.gateway_ids), dtype=bool)
    if before.tenants != after.tenants:
        return changed
    new_rows, old_rows = _matching_rows(before.gateway_ids, after.gateway_ids)
    if new_rows.size:
        changed[new_rows] = (
            (before.targets[old_rows] != after.targets[new_rows])
            | (before.limits[old_rows] != after.limits[new_rows])
            | (before.pauses[old_rows] != after.pauses[new_rows])
        ).any(axis=1)
    return changed


def _granted(previous: CellLimits, ids: tuple[str, ...], tenants: tuple[str, ...]) -> Row2:
    """What `previous` granted each gateway of `ids` (rows) for each of `tenants` (columns); 0
    for a gateway or tenant it does not name."""
    if previous.gateway_ids == ids and previous.tenants == tenants:
        return np.array(previous.limits, dtype=np.int64)
    granted = np.zeros((len(ids), len(tenants)), dtype=np.int64)
    new_rows, old_rows = _matching_rows(previous.gateway_ids, ids)
    if not new_rows.size:
        return granted
    columns = columns_of(previous.tenants, tenants)
    kept = np.flatnonzero(columns >= 0)
    if kept.size == len(tenants) and previous.tenants == tenants:
        granted[new_rows] = previous.limits[old_rows]
    else:
        granted[np.ix_(new_rows, kept)] = previous.limits[np.ix_(old_rows, columns[kept])]
    return granted


def _matching_rows(
    old: tuple[str, ...], new: tuple[str, ...]
) -> tuple[NDArray[np.intp], NDArray[np.intp]]:
    """The rows of `new` whose gateway `old` has too, and that gateway's row in `old`."""
    if old == new:
        every = np.arange(len(new), dtype=np.intp)
        return every, every
    where = {gateway_id: row for row, gateway_id in enumerate(old)}
    pairs = [(row, where[g]) for row, g in enumerate(new) if g in where]
    return (
        np.array([p[0] for p in pairs], dtype=np.intp),
        np.array([p[1] for p in pairs], dtype=np.intp),
    )


def _rows(rows: list[Row], tenants: int) -> Row2:
    """Rows stacked into a (gateways, tenants) array."""
    if not rows:
        return np.zeros((0, tenants), dtype=np.int64)
    # np.array, not np.stack: the same copy for a third of the cost at ten gateways (np.stack
    # checks and reshapes every row in Python).
    return np.array(rows, dtype=np.int64)


_LatencyKey = tuple[int, float, float, float, int, float, float, float]
"""What a tenant's merged latency summaries are made from: (count, count x p50, worst p90,
worst p99) of TTFT, then of end-to-end latency."""


class _PoolLoads:
    """Each pool tenant's figures summed over the gateways, kept up as figures come and go, so
    that a snapshot costs about the tenants whose figures changed since the last one.

    Latency windows cannot be merged exactly without their samples: the p50 is weighted by
    count, the p90 and p99 are the worst (the tail errs on the safe side). Sums and worsts are
    updated as figures change; a worst whose last holder left (which no subtraction can undo) is
    found again by a walk over the gateways at the next snapshot, and the merged summaries are
    rebuilt then for the tenants whose figures changed."""

    def __init__(self, tenants: Iterable[str]) -> None:
        self._sums = {name: _Sums() for name in tenants}
        self._stale: set[str] = set(self._sums)
        """Tenants whose merged latency summaries must be rebuilt (their sums or worst moved)."""
        self._latency: dict[str, tuple[_LatencyKey, LatencySummary, LatencySummary]] = {}
        """tenant -> the figures its summaries were made from, and its (ttft, e2e) merged over
        its gateways, as of its last change."""
        self._queue_moved: set[str] = set()
        """Pool tenants whose queued figure at some gateway moved since take_queue_moved."""
        self.output_tokens_total = 0
        """Summed over every figure held, removed tenants' too (the base of the waste share)."""
        self.waste_tokens_total = 0

    def replaced(self, old: TenantDemand | None, new: TenantDemand | None) -> None:
        """A gateway's figure of one tenant left (new None), came (old None) or changed."""
        figures = new if new is not None else old
        if figures is None:
            return
        if old is not None:
            self.output_tokens_total -= old.output_tokens_total
            self.waste_tokens_total -= old.waste_tokens_total
        if new is not None:
            self.output_tokens_total += new.output_tokens_total
            self.waste_tokens_total += new.waste_tokens_total
        sums = self._sums.get(figures.tenant)
        if sums is None:
            return  # a draining tenant: not in the policy's view
        if (0 if old is None else old.queued) != (0 if new is None else new.queued):
            self._queue_moved.add(figures.tenant)
        if old is not None:
            sums.add(old, -1)
        if new is not None:
            sums.add(new, 1)
        self._stale.add(figures.tenant)

    def take_queue_moved(self) -> set[str]:
        """The pool tenants whose queue moved at some gateway since the last call (and none
        from now)."""
        moved, self._queue_moved = self._queue_moved, set()
        return moved

    def queued(self, tenant: str) -> int:
        """A pool tenant's requests queued, summed over the gateways."""
        return self._sums[tenant].queued

    def loads(
        self, records: Iterable[GatewayRecord], now_wall_s: float, *, draining: bool
    ) -> dict[str, TenantLoad]:
        """Every pool tenant's load now; `draining`: whether gateways may hold figures of
        removed tenants too."""
        records = list(records)
        for name in self._stale:
            sums = self._sums[name]
            if sums.worst_unknown:
                held = (record.demand.get(name) for record in records)
                sums.recount_worst(figures for figures in held if figures is not None)
            ttft90, ttft99, e2e90, e2e99 = sums.worst
            key = (
                sums.ttft_count,
                sums.ttft_weighted,
                ttft90.value,
                ttft99.value,
                sums.e2e_count,
                sums.e2e_weighted,
                e2e90.value,
                e2e99.value,
            )
            held_latency = self._latency.get(name)
            if held_latency is not None and held_latency[0] == key:
                continue  # re-reported as it was: the summaries stand
            self._latency[name] = (
                key,
                _summary(sums.ttft_count, sums.ttft_weighted, ttft90.value, ttft99.value),
                _summary(sums.e2e_count, sums.e2e_weighted, e2e90.value, e2e99.value),
            )
        self._stale.clear()
        # With removed tenants among the figures, a count no longer says a gateway names every
        # pool tenant.
        oldest = _oldest_observed(records, None if draining else len(self._sums))
        latency = self._latency
        return {
            name: sums.load(latency[name][1], latency[name][2], oldest(name), now_wall_s)
            for name, sums in self._sums.items()
        }


def _oldest_observed(
    records: list[GatewayRecord], tenants: int | None
) -> Callable[[str], float | None]:
    """tenant -> when the oldest figures of it were observed, over the gateways holding any.
    A gateway holding `tenants` figures (all it can hold: every pool tenant) counts for all
    without a walk over them; None: walk every gateway's."""
    everyone: float | None = None
    partial: dict[str, float] = {}
    for record in records:
        observed = record.observed_at_wall_s
        if observed is None or not record.demand:
            continue
        if tenants is not None and len(record.demand) >= tenants:
            everyone = observed if everyone is None else min(everyone, observed)
            continue
        for name in record.demand:
            held = partial.get(name)
            partial[name] = observed if held is None else min(held, observed)

    def oldest(name: str) -> float | None:
        held = partial.get(name)
        if held is None:
            return everyone
        return held if everyone is None else min(held, everyone)

    return oldest


class _Worst:
    """The largest of a multiset of latencies that changes one value at a time, and how many
    values equal it; 0.0 (a member that never leaves) when there is none. When the last value
    at the largest leaves, the largest is not known until the values are walked again
    (`unknown`): until then `value` bounds them from above, and a value that reaches it is the
    largest again. So a gateway re-reporting the same figures (a full report: every figure
    leaves, then comes back) never costs a walk over the gateways."""

    __slots__ = ("count", "value")

    def __init__(self) -> None:
        self.value = 0.0
        self.count = 1

    def add(self, value: float) -> None:
        if value > self.value:
            self.value, self.count = value, 1
        elif value == self.value:
            self.count += 1

    def remove(self, value: float) -> None:
        if value == self.value and self.count > 0:
            self.count -= 1

    @property
    def unknown(self) -> bool:
        return self.count == 0

    def recount(self, values: Iterable[float]) -> None:
        self.value, self.count = 0.0, 1
        for value in values:
            self.add(value)


class _Sums:
    """One tenant's additive figures summed over gateways, and its worst latencies (p90 and p99
    of TTFT and end-to-end, over the gateways whose window holds samples)."""

    __slots__ = (
        "admitted",
        "completed",
        "e2e_count",
        "e2e_weighted",
        "in_flight",
        "queued",
        "rejected",
        "ttft_count",
        "ttft_weighted",
        "worst",
    )

    def __init__(self) -> None:
        self.in_flight = self.queued = self.admitted = self.completed = self.rejected = 0
        self.ttft_count = self.e2e_count = 0
        self.ttft_weighted = self.e2e_weighted = 0.0
        self.worst = (_Worst(), _Worst(), _Worst(), _Worst())
        """ttft p90, ttft p99, e2e p90, e2e p99."""

    def add(self, figures: TenantDemand, sign: int) -> None:
        self.in_flight += sign * figures.in_flight
        self.queued += sign * figures.queued
        self.admitted += sign * figures.admitted_total
        self.completed += sign * figures.completed_total
        self.rejected += sign * figures.rejected_total
        if figures.ttft.count > 0:
            self.ttft_count += sign * figures.ttft.count
            self.ttft_weighted += sign * figures.ttft.p50_ms * figures.ttft.count
        if figures.e2e.count > 0:
            self.e2e_count += sign * figures.e2e.count
            self.e2e_weighted += sign * figures.e2e.p50_ms * figures.e2e.count
        for worst, value in self._worst_of(figures):
            if sign > 0:
                worst.add(value)
            else:
                worst.remove(value)

    def _worst_of(self, figures: TenantDemand) -> Iterator[tuple[_Worst, float]]:
        """Each worst latency the figures count in, with their value (a window without samples
        counts in none)."""
        ttft90, ttft99, e2e90, e2e99 = self.worst
        if figures.ttft.count > 0:
            yield ttft90, figures.ttft.p90_ms
            yield ttft99, figures.ttft.p99_ms
        if figures.e2e.count > 0:
            yield e2e90, figures.e2e.p90_ms
            yield e2e99, figures.e2e.p99_ms

    @property
    def worst_unknown(self) -> bool:
        ttft90, ttft99, e2e90, e2e99 = self.worst
        return not (ttft90.count and ttft99.count and e2e90.count and e2e99.count)

    def recount_worst(self, held: Iterable[TenantDemand]) -> None:
        """Walk the figures every gateway holds of the tenant again for its worst latencies."""
        for w in self.worst:
            w.recount(())
        for figures in held:
            for worst, value in self._worst_of(figures):
                worst.add(value)

    def load(
        self, ttft: LatencySummary, e2e: LatencySummary, oldest: float | None, now_wall_s: float
    ) -> TenantLoad:
        return TenantLoad(
            in_flight=self.in_flight,
            queued=self.queued,
            ttft=ttft,
            e2e=e2e,
            admitted_total=self.admitted,
            completed_total=self.completed,
            rejected_total=self.rejected,
            # Two hosts' clocks: an age below 0 is skew, not news from the future.
            demand_age_s=None if oldest is None else max(0.0, now_wall_s - oldest),
        )


def _summary(count: int, weighted: float, p90_ms: float, p99_ms: float) -> LatencySummary:
    if count <= 0:
        return LatencySummary()
    return LatencySummary(count=count, p50_ms=weighted / count, p90_ms=p90_ms, p99_ms=p99_ms)
