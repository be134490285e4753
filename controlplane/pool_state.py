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
from collections.abc import Callable, Iterable, Mapping
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
    Taken,
    TenantDirectory,
    columns_of,
)
from controlplane.token_ledger import TokenCount, TokenLedger
from slotshift.apportion import nominal_shares
from slotshift.clock import Clock
from slotshift.config import PoolConfig
from slotshift.demand import LatencySummary, TenantDemand
from slotshift.demand_columns import (
    ADMITTED,
    COMPLETED,
    COUNTS,
    E2E_COUNT,
    E2E_P50,
    E2E_P90,
    E2E_P99,
    IN_FLIGHT,
    LIMIT,
    OUTPUT_TOKENS,
    QUEUED,
    REJECTED,
    TTFT_COUNT,
    TTFT_P50,
    TTFT_P90,
    TTFT_P99,
    WASTE_TOKENS,
    DemandColumns,
)
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
        self._sums = _PoolSums(len(self.tenants))
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
        self._queued_before = np.zeros(len(self.tenants), dtype=np.int64)
        """Each tenant's requests queued over the gateways at the fast path's last look."""
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
        self._awaiting: deque[_Awaited] = deque()
        """Published decisions not yet acknowledged by every gateway they changed."""
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
        demand: DemandColumns | Iterable[TenantDemand],
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
        self._sums.take(record.take_figures(_columns(demand), observed_at_wall_s, self._index))
        # What it enforces is what it says it enforces (limits sent to an earlier connection
        # and perhaps not yet applied still count: the registry kept them).
        record.acked[record.held] = record.counts[LIMIT, record.held]
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
        demand: DemandColumns | Iterable[TenantDemand],
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
        taken = record.take_figures(_columns(demand), observed_at_wall_s, self._index, delta=delta)
        self._sums.take(taken)
        self._queue_started(record, taken.started)
        fell = record.enforcing(applied_version)
        self._acknowledged(record)
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
        # Only the tenants whose queue moved since the last look: a report about k tenants
        # costs about k, not the pool's tenants times its gateways.
        moved = self._sums.take_queue_moved()
        if not self.pool.fast_path or moved.size == 0:
            return
        queued = self._sums.counts[QUEUED, moved]
        grown = moved[queued > self._queued_before[moved]]
        self._queued_before[moved] = queued
        names = len(self.pool.tenants)
        for column in grown[grown < names].tolist():
            tenant = self.tenants[column]
            if self.allocation.tenant_limits[tenant] < self._nominal[tenant]:
                self.fast_path_reason = (
                    f"fast path: {tenant}'s queue grew to "
                    f"{int(self._sums.counts[QUEUED, column])} below its nominal share"
                )
                self.decision_wanted.set()
                break

    def record_ack(
        self,
        session: GatewaySession,
        version: int,
        demand: DemandColumns | Iterable[TenantDemand],
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
        self._acknowledged(record)
        record.sent_at_s = {v: at for v, at in record.sent_at_s.items() if v > version}
        taken = record.take_figures(_columns(demand), observed_at_wall_s, self._index, delta=delta)
        self._sums.take(taken)
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
        falling due are changes of their own. Skipping the rest keeps the cost of a report
        proportional to what it changed (tests/unit/controlplane/test_pool_state.py holds it to
        a re-grant after every message)."""
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

    def _acknowledged(self, record: GatewayRecord) -> None:
        """`record`'s gateway enforces its applied version: the published decisions it was
        waited for up to that version need it no more."""
        version = record.applied_version
        for awaited in self._awaiting:
            if awaited.version > version:
                break
            awaited.gateways.discard(record.gateway_id)
        self._note_enforced()

    def _note_enforced(self) -> None:
        """Log as enforced, from now, the published decisions no gateway is waited for."""
        if all(awaited.gateways for awaited in self._awaiting):
            return
        now = self._clock.wall()
        for awaited in self._awaiting:
            if not awaited.gateways:
                self.decisions.enforced(awaited.decision_id, now)
        self._awaiting = deque(a for a in self._awaiting if a.gateways)

    def disconnect_gateway(self, session: GatewaySession) -> None:
        """The gateway's stream ended. Its slots stay counted until its lease runs out, since it
        may still be running what it admitted."""
        if self.gateways.disconnect(session) is None:
            return
        # It acknowledges nothing more; the decisions waiting for it are enforced everywhere
        # else (what it still holds, its lease keeps counted).
        for awaited in self._awaiting:
            awaited.gateways.discard(session.gateway_id)
        self._note_enforced()
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
        self._sums.forget(record.counts)

    def _set_tenants(self, tenants: tuple[str, ...]) -> None:
        """The columns of every row become `tenants` (the pool's, then the draining ones), and
        the policy's view the pool's tenants."""
        if tenants != self.tenants:
            source = columns_of(self.tenants, tenants)
            kept = source >= 0
            queued_before = np.zeros(len(tenants), dtype=np.int64)
            queued_before[kept] = self._queued_before[source[kept]]
            self._queued_before = queued_before
            self.gateways.reindex(self.tenants, tenants)
            self.tenants = tenants
            self._index = {name: column for column, name in enumerate(tenants)}
        # The policy's tenants changed (a config change, a drained tenant), with the columns or
        # without them (a removed last tenant drains in its own column): sum afresh.
        self._sums = _PoolSums(len(tenants), [r.counts for r in self.gateways])

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
        loads = _loads(
            self.tenants[: len(self.pool.tenants)],
            self._sums.counts,
            list(self.gateways),
            self._clock.wall(),
        )
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
        published = self.reconcile(resplit=resplit)
        if published is not None:
            # The gateways the version went to: those whose part it changed.
            sent_to = {r.gateway_id for r in self.gateways if published.version in r.sent}
            self._awaiting.append(_Awaited(decision_id, published.version, sent_to))
            # A gateway that never acknowledges (connected, but stuck) keeps its decisions
            # waiting: no more of them than the log can show.
            while len(self._awaiting) > self.decisions.capacity:
                self._awaiting.popleft()
            self._note_enforced()
        return published is not None

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
        # Every gateway connected (all but always): the rows are taken whole, as views rather
        # than copies picked out by a mask.
        live: slice | NDArray[np.bool_] = slice(None)
        connected = ids
        if not all(r.connected for r in records):
            live = np.array([r.connected for r in records], dtype=bool)
            connected = tuple(g for g, r in zip(ids, records, strict=True) if r.connected)
        in_flight = _rows([r.in_flight for r in records], len(tenants))
        queued = _rows([r.queued for r in records], len(tenants))
        demand = in_flight + queued
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
        targets = live_targets
        if connected is not ids:
            targets = np.zeros_like(bounds)
            targets[live] = live_targets
        granted = _granted(previous, ids, tenants)
        # The restart hold caps what may be granted, not the targets the gateways are told.
        granting = targets
        self._held = self.holding
        if self._held:
            granting = np.minimum(targets, acked)
        grants = placement.grant(self.pool.budget_slots, granting, granted, bounds)
        below = grants < targets
        self._short = bool(below.any())
        # A grant the last allocation made that no bound holds (a reconnected gateway's row)
        # counts as held in this pass and no longer in the next: the next may grant more.
        self._regrant_due = self._short and bool((granted > np.maximum(bounds, grants)).any())
        self._capped = self._waste_capped()
        pauses = self._pause_levels(in_flight[live], grants[live], queued[live])
        candidate_cells = CellLimits.of(
            connected, tenants, targets[live], grants[live], pauses, pool_limits=limits
        )
        self._lending = limits <= self._row_of(self._nominal)
        short = below & (demand > in_flight) & self._lending
        self._lender_short = bool(short[live].any())
        self._over_budget = int(bounds.sum()) > self.pool.budget_slots
        # The rows whose cells changed; with the same gateways and tenants, none changed and
        # the same pool-wide limits is the same allocation (Allocation.same_limits: the tenant
        # limits are the current ones), so one pass answers both.
        changed = _changed_rows(previous, candidate_cells)
        same = (
            same_cells
            and not changed.any()
            and np.array_equal(previous.pool_limits, candidate_cells.pool_limits)
        )
        published: Allocation | None = None
        if force_publish or not same:
            self._version += 1
            published = dataclasses.replace(
                current,
                cells=candidate_cells,
                version=self._version,
                created_at_wall_s=self._clock.wall(),
            )
            self.allocation = published
            now = self._clock.monotonic()
            delivery = Delivery(
                published,
                cause=dict(trace_context) if trace_context else self._limits_trace_context,
                decision=self._limits_trace_context,
            )
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

    def _pause_levels(
        self, in_flight: NDArray[np.int64], grants: NDArray[np.int64], queued: NDArray[np.int64]
    ) -> Row2:
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
            queued=queued.sum(axis=0),
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
        output, waste = self._sums.output_tokens, self._sums.waste_tokens
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
    if before.tenants == after.tenants and before.gateway_ids == after.gateway_ids:
        # The same rows (all but always): compared in place.
        moved: NDArray[np.bool_] = (
            (before.targets != after.targets)
            | (before.limits != after.limits)
            | (before.pauses != after.pauses)
        ).any(axis=1)
        return moved
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


@dataclass(slots=True)
class _Awaited:
    """A published decision and the gateways it changed that have not acknowledged it yet."""

    decision_id: int
    version: int
    gateways: set[str]


class _PoolSums:
    """Every tenant's counts summed over the gateways (rows as DemandColumns.counts, the pool's
    columns), kept up as figures come and go, so that a report costs what it names; and which
    tenants' queues moved since the fast path last looked."""

    def __init__(self, tenants: int, counts: Iterable[Row2] = ()) -> None:
        """`counts`: the figures the gateways hold now (their queues count as moved)."""
        self.counts: Row2 = np.zeros((COUNTS, tenants), dtype=np.int64)
        self._queue_moved = np.zeros(tenants, dtype=bool)
        for held in counts:
            self.counts += held
            self._queue_moved |= held[QUEUED] != 0
        self.output_tokens = int(self.counts[OUTPUT_TOKENS].sum())
        """Summed over every figure held, removed tenants' too (the base of the waste share)."""
        self.waste_tokens = int(self.counts[WASTE_TOKENS].sum())

    def take(self, taken: Taken) -> None:
        """A gateway's figures of `taken.columns` changed by `taken.change`."""
        columns, change = taken.columns, taken.change
        self.counts[:, columns] += change
        self.output_tokens += int(change[OUTPUT_TOKENS].sum())
        self.waste_tokens += int(change[WASTE_TOKENS].sum())
        self._queue_moved[columns[change[QUEUED] != 0]] = True

    def forget(self, counts: Row2) -> None:
        """A gateway's figures (all of them) stop counting."""
        self.counts -= counts
        self.output_tokens -= int(counts[OUTPUT_TOKENS].sum())
        self.waste_tokens -= int(counts[WASTE_TOKENS].sum())
        self._queue_moved |= counts[QUEUED] != 0

    def take_queue_moved(self) -> NDArray[np.intp]:
        """The columns whose queue moved at some gateway since the last call (and none from
        now)."""
        moved = np.flatnonzero(self._queue_moved)
        if moved.size:
            self._queue_moved[:] = False
        return moved


def _loads(
    names: tuple[str, ...], sums: Row2, records: list[GatewayRecord], now_wall_s: float
) -> dict[str, TenantLoad]:
    """Each of the pool's tenants' load (`names`: its first columns) from the pool's sums and
    every gateway's latency windows and observation time.

    Latency windows cannot be merged exactly without their samples: the p50 is weighted by
    count, the p90 and p99 are the worst over the gateways whose window holds samples (the tail
    errs on the safe side). A tenant's demand age is that of its oldest figures."""
    tenants = len(names)
    sums = sums[:, :tenants]
    if records:
        samples = np.stack([r.counts[TTFT_COUNT : E2E_COUNT + 1, :tenants] for r in records])
        latencies = np.stack([r.latencies[:, :tenants] for r in records])
        has = samples > 0
        p50s = [
            (latencies[:, p50] * samples[:, k]).sum(axis=0)
            for k, p50 in enumerate((TTFT_P50, E2E_P50))
        ]
        worst = [
            np.where(has[:, k], latencies[:, p], 0.0).max(axis=0)
            for k, p in ((0, TTFT_P90), (0, TTFT_P99), (1, E2E_P90), (1, E2E_P99))
        ]
        observed = np.array(
            [np.inf if r.observed_at_wall_s is None else r.observed_at_wall_s for r in records]
        )
        held = np.stack([r.held[:tenants] for r in records])
        oldest = np.where(held, observed[:, np.newaxis], np.inf).min(axis=0).tolist()
    else:
        p50s = [np.zeros(tenants), np.zeros(tenants)]
        worst = [np.zeros(tenants)] * 4
        oldest = [np.inf] * tenants
    ttft_count, e2e_count = sums[TTFT_COUNT].tolist(), sums[E2E_COUNT].tolist()
    ttft_p50, e2e_p50 = (p.tolist() for p in p50s)
    ttft_p90, ttft_p99, e2e_p90, e2e_p99 = (w.tolist() for w in worst)
    in_flight, queued = sums[IN_FLIGHT].tolist(), sums[QUEUED].tolist()
    admitted, completed = sums[ADMITTED].tolist(), sums[COMPLETED].tolist()
    rejected = sums[REJECTED].tolist()
    return {
        name: TenantLoad(
            in_flight=in_flight[i],
            queued=queued[i],
            ttft=_summary(ttft_count[i], ttft_p50[i], ttft_p90[i], ttft_p99[i]),
            e2e=_summary(e2e_count[i], e2e_p50[i], e2e_p90[i], e2e_p99[i]),
            admitted_total=admitted[i],
            completed_total=completed[i],
            rejected_total=rejected[i],
            # Two hosts' clocks: an age below 0 is skew, not news from the future.
            demand_age_s=None if oldest[i] == np.inf else max(0.0, now_wall_s - oldest[i]),
        )
        for i, name in enumerate(names)
    }


_NO_SAMPLES = LatencySummary()


def _summary(count: int, weighted: float, p90_ms: float, p99_ms: float) -> LatencySummary:
    if count <= 0:
        return _NO_SAMPLES
    return LatencySummary(count=count, p50_ms=weighted / count, p90_ms=p90_ms, p99_ms=p99_ms)


def _columns(demand: DemandColumns | Iterable[TenantDemand]) -> DemandColumns:
    """Figures as columns (a caller in process may pass TenantDemands)."""
    return demand if isinstance(demand, DemandColumns) else DemandColumns.of(demand)
