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
import itertools
import logging
from collections import deque
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

from controlplane.core.allocation import Allocation, GatewayLimit
from controlplane.core.config_change import config_key_digests
from controlplane.core.gateway_split import split_among_gateways, split_is_stale
from controlplane.core.grants import Cell, compute_grants
from controlplane.core.preemption import CellLoad, TenantTerms, pause_levels
from controlplane.core.snapshot import PoolSnapshot, TelemetryView, TenantLoad
from controlplane.decision_log import DecisionLog
from slotshift.apportion import nominal_shares
from slotshift.clock import Clock
from slotshift.config import PoolConfig
from slotshift.demand import LatencySummary, TenantDemand
from slotshift.newest import NewestBox

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


@dataclass(frozen=True, slots=True)
class Delivery:
    """An allocation to send to one gateway, with the trace contexts it belongs to."""

    allocation: Allocation
    cause: Mapping[str, str] = field(default_factory=dict)
    """W3C context of what published it (a decision, a gateway connecting): the push's parent."""
    decision: Mapping[str, str] = field(default_factory=dict)
    """W3C context of the decision whose tenant limits it carries; empty before the first."""


@dataclass(frozen=True, slots=True)
class TenantDirectory:
    """The pool's tenants and the SHA-256 digests of their API keys, for the gateways."""

    pool: str
    config_version: int
    tenants: Mapping[str, tuple[bytes, ...]]


@dataclass(eq=False)
class GatewaySession:
    """One connection of one gateway; events from a replaced connection are ignored."""

    gateway_id: str
    token: int
    mailbox: NewestBox[Delivery] = field(default_factory=NewestBox)
    """The newest allocation waiting to be sent to this gateway; older unsent ones are dropped."""
    directory: TenantDirectory | None = None
    """A tenant directory to send before the next allocation (an allocation always follows:
    tenants change only with a new allocation), so that the gateway knows every tenant an
    allocation names."""


@dataclass
class _GatewayRecord:
    gateway_id: str
    session: GatewaySession
    connected: bool = True
    applied_version: int = 0
    demand: dict[str, TenantDemand] = field(default_factory=dict)
    """tenant -> its demand here, from the newest figures the gateway sent (pool tenants only)."""
    observed_at_wall_s: float | None = None
    """When the gateway observed `demand` (its wall clock, from the message); None: unknown."""
    acked_limits: dict[str, int] = field(default_factory=dict)
    """Limits in force at the last acknowledgement (or the hello)."""
    sent: dict[int, dict[str, int]] = field(default_factory=dict)
    """version -> limits sent and not yet acknowledged."""
    sent_at_s: dict[int, float] = field(default_factory=dict)
    lease_expires_at_s: float | None = None

    def demand_of(self, tenant: str) -> TenantDemand:
        """`tenant`'s demand here; all zero when the gateway has not reported it."""
        demand = self.demand.get(tenant)
        return demand if demand is not None else TenantDemand(tenant)

    def bound(self, tenant: str) -> int:
        """Most this gateway may be holding of `tenant` (see controlplane/core/grants.py)."""
        sent = max((limits.get(tenant, 0) for limits in self.sent.values()), default=0)
        in_flight = self.demand_of(tenant).in_flight
        return max(in_flight, self.acked_limits.get(tenant, 0), sent)

    def take_figures(
        self, demand: Iterable[TenantDemand], observed_at_wall_s: float | None, known: set[str]
    ) -> None:
        """Hold `demand` (of the `known` tenants) as this gateway's figures, observed at
        `observed_at_wall_s`. Always the newest: one session is one gRPC stream, which delivers
        in order, so an earlier stamp means the gateway's clock stepped back, not an old message
        (dropping it would freeze the gateway's demand until its clock caught up)."""
        self.demand = {d.tenant: d for d in demand if d.tenant in known}
        self.observed_at_wall_s = observed_at_wall_s

    def enforcing(self, version: int) -> None:
        """The gateway says it enforces `version` now (an acknowledgement, or a report's
        `applied_version`: so the next report heals a lost acknowledgement). Its limits then are
        those sent with `version`; versions up to it are no longer pending."""
        if version in self.sent:
            self.acked_limits = self.sent[version]
        self.sent = {v: lim for v, lim in self.sent.items() if v > version}
        self.applied_version = max(self.applied_version, version)


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
    ) -> None:
        self.pool = pool
        self.config_version = 1
        """1 as configured at start-up; one more with every change through the admin API."""
        self.key_digests: dict[str, tuple[bytes, ...]] = config_key_digests(pool)
        """tenant -> SHA-256 digests of its API keys (the keys themselves are not kept)."""
        self._draining: set[str] = set()
        """Removed tenants some gateway may still run requests of: their slots stay counted (with
        a target of 0) until every gateway has drained them."""
        self._clock = clock
        self._lease_ttl_s = gateway_lease_ttl_s
        self._stale_after_s = telemetry_stale_after_s
        self.decisions = DecisionLog(decision_log_size)
        self.policy_state: object | None = None
        self.telemetry: TelemetryRecord | None = None
        self._gateways: dict[str, _GatewayRecord] = {}
        self._tokens = itertools.count(1)
        self.allocation = Allocation(
            pool=pool.name,
            version=0,
            decision_id=0,
            policy=pool.policy,
            budget_slots=pool.budget_slots,
            created_at_wall_s=clock.wall(),
            tenant_limits=nominal_shares(pool),
            gateways={},
        )
        self._version = 0
        self._holding_until_s = clock.monotonic() + gateway_lease_ttl_s
        """Until then no gateway is granted more than it already enforces. A control plane that
        has just started (or restarted) has not heard from every gateway yet: one it does not
        know of may hold slots, and every live gateway reconnects within a lease."""
        self._limits_trace_context: Mapping[str, str] = {}
        """W3C context of the decision whose tenant limits are in force (empty: the nominal
        shares, before any decision changed them)."""
        self._queued_before: dict[str, int] = {}
        self._waste_samples: deque[tuple[float, int, int]] = deque()
        """(monotonic s, pool output tokens, pool waste tokens) over the waste window."""
        self.decision_wanted = asyncio.Event()
        """Set when something calls for a decision before the next period (the fast path)."""
        self.fast_path_reason = ""
        """Why the fast path last asked for a decision."""

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
        session = GatewaySession(
            gateway_id=gateway_id, token=next(self._tokens), directory=self.directory()
        )
        previous = self._gateways.get(gateway_id)
        if previous is not None:
            previous.session.mailbox.close()
        record = _GatewayRecord(gateway_id=gateway_id, session=session)
        record.applied_version = applied_version
        record.take_figures(demand, observed_at_wall_s, self.known_tenants())
        # What it enforces is what it says it enforces; limits sent to an earlier connection
        # and perhaps not yet applied still count.
        record.acked_limits = {t: d.limit_slots for t, d in record.demand.items()}
        if previous is not None:
            record.sent = {v: lim for v, lim in previous.sent.items() if v > applied_version}
        # A restarted control plane continues above any version a gateway has seen, so that the
        # gateway does not ignore its updates as stale.
        self._version = max(self._version, applied_version)
        self._gateways[gateway_id] = record
        logger.info("gateway %s connected to pool %s", gateway_id, self.pool.name)
        self.reconcile(resplit=True, force_publish=True, trace_context=trace_context)
        return session

    def record_demand(
        self,
        session: GatewaySession,
        applied_version: int,
        demand: Iterable[TenantDemand],
        *,
        observed_at_wall_s: float | None = None,
    ) -> bool:
        """A gateway's demand report: its figures, observed at `observed_at_wall_s` (its wall
        clock; None: unknown), while it enforces `applied_version`. Returns False, changing
        nothing, when the session is not the gateway's live one. Otherwise the figures replace the
        gateway's (tenants the pool does not know dropped), `applied_version` counts as an
        acknowledgement of that version, and the grants are recomputed."""
        record = self._live(session)
        if record is None:
            return False
        record.take_figures(demand, observed_at_wall_s, self.known_tenants())
        record.enforcing(applied_version)
        # Kept for the version itself: should its acknowledgement still come, the push latency
        # is measured.
        record.sent_at_s = {v: at for v, at in record.sent_at_s.items() if v >= applied_version}
        self._observe_waste()
        self._check_fast_path()
        self.reconcile()
        return True

    def _check_fast_path(self) -> None:
        """Ask for a decision now when a tenant's queue grows while it holds less than its
        nominal share: waiting for the next period would leave it queueing behind lent slots."""
        if not self.pool.fast_path:
            return
        queued = {
            t.name: sum(g.demand_of(t.name).queued for g in self._gateways.values())
            for t in self.pool.tenants
        }
        nominal = nominal_shares(self.pool)
        for tenant, count in queued.items():
            grew = count > self._queued_before.get(tenant, 0)
            if grew and self.allocation.tenant_limits[tenant] < nominal[tenant]:
                self.fast_path_reason = (
                    f"fast path: {tenant}'s queue grew to {count} below its nominal share"
                )
                self.decision_wanted.set()
                break
        self._queued_before = queued

    def record_ack(
        self,
        session: GatewaySession,
        version: int,
        demand: Iterable[TenantDemand],
        *,
        observed_at_wall_s: float | None = None,
    ) -> float | None:
        """The gateway enforces `version` now, with `demand` observed at `observed_at_wall_s`. Returns
        seconds since that version was sent; None for a stale session or a version not pending."""
        record = self._live(session)
        if record is None:
            return None
        sent_at = record.sent_at_s.get(version)
        latency = None if sent_at is None else self._clock.monotonic() - sent_at
        record.enforcing(version)
        record.sent_at_s = {v: at for v, at in record.sent_at_s.items() if v > version}
        record.take_figures(demand, observed_at_wall_s, self.known_tenants())
        self.reconcile()
        return latency

    def disconnect_gateway(self, session: GatewaySession) -> None:
        """The gateway's stream ended. Its slots stay counted until its lease runs out, since it
        may still be running what it admitted."""
        record = self._live(session)
        if record is None:
            return
        record.connected = False
        record.lease_expires_at_s = self._clock.monotonic() + self._lease_ttl_s
        session.mailbox.close()
        logger.warning(
            "gateway %s disconnected from pool %s; its slots return in %.1f s unless it comes back",
            session.gateway_id,
            self.pool.name,
            self._lease_ttl_s,
        )
        self.reconcile(resplit=True)

    def expire_leases(self) -> None:
        now = self._clock.monotonic()
        expired = [
            g.gateway_id
            for g in self._gateways.values()
            if not g.connected and g.lease_expires_at_s is not None and g.lease_expires_at_s <= now
        ]
        for gateway_id in expired:
            del self._gateways[gateway_id]
            logger.info("lease of gateway %s expired; its slots are free", gateway_id)
        if expired:
            self.reconcile(resplit=True)

    def close_sessions(self) -> None:
        """End every gateway's stream (on shutdown); the gateways reconnect elsewhere or later."""
        for record in self._gateways.values():
            record.session.mailbox.close()

    def _live(self, session: GatewaySession) -> _GatewayRecord | None:
        record = self._gateways.get(session.gateway_id)
        if record is None or record.session is not session or not record.connected:
            return None
        return record

    @property
    def gateways_connected(self) -> int:
        return sum(1 for g in self._gateways.values() if g.connected)

    def applied_versions(self) -> dict[str, int]:
        """gateway id -> the version it last acknowledged, for connected gateways."""
        return {g.gateway_id: g.applied_version for g in self._gateways.values() if g.connected}

    # Config changes (the admin API) ---------------------------------------------------------

    def known_tenants(self) -> set[str]:
        """Tenants whose usage counts: the pool's, and removed ones still draining."""
        return {t.name for t in self.pool.tenants} | self._draining

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
        self.key_digests = {t: tuple(key_digests.get(t, ())) for t in names}
        self.config_version += 1
        # Policy memory is per tenant and per policy; it starts again under the new config.
        self.policy_state = None
        self._queued_before = {t: n for t, n in self._queued_before.items() if t in names}
        self.allocation = dataclasses.replace(
            self.allocation, tenant_limits=nominal_shares(pool), policy=pool.policy
        )
        directory = self.directory()
        for record in self._gateways.values():
            if record.connected:
                record.session.directory = directory
        self.reconcile(resplit=True, force_publish=True)
        return self.config_version

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
        loads: dict[str, TenantLoad] = {}
        now_wall_s = self._clock.wall()
        for tenant in self.pool.tenants:
            demands = [g.demand_of(tenant.name) for g in self._gateways.values()]
            observed = [
                g.observed_at_wall_s
                for g in self._gateways.values()
                if tenant.name in g.demand and g.observed_at_wall_s is not None
            ]
            loads[tenant.name] = TenantLoad(
                in_flight=sum(d.in_flight for d in demands),
                queued=sum(d.queued for d in demands),
                ttft=_merge([d.ttft for d in demands]),
                e2e=_merge([d.e2e for d in demands]),
                admitted_total=sum(d.admitted_total for d in demands),
                completed_total=sum(d.completed_total for d in demands),
                rejected_total=sum(d.rejected_total for d in demands),
                # Two hosts' clocks: an age below 0 is skew, not news from the future.
                demand_age_s=max(0.0, now_wall_s - min(observed)) if observed else None,
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
    ) -> bool:
        """Adopt validated tenant limits; True when a new allocation was published.

        `trace_context` (W3C) is the decision's: every allocation that carries these limits, now
        or when later re-grants publish it, is pushed under it.
        """
        self.allocation = dataclasses.replace(
            self.allocation, tenant_limits=dict(limits), decision_id=decision_id, policy=policy
        )
        self._limits_trace_context = dict(trace_context or {})
        return self.reconcile(resplit=True) is not None

    def reconcile(
        self,
        *,
        resplit: bool = False,
        force_publish: bool = False,
        trace_context: Mapping[str, str] | None = None,
    ) -> Allocation | None:
        """Recompute what each gateway may admit; publish a new version if anything changed.

        `trace_context` (W3C) names what caused the change; by default the decision whose limits
        are in force (re-grants as gateways drain carry on that decision's work).
        """
        current = self.allocation
        connected = {g.gateway_id: g for g in self._gateways.values() if g.connected}
        demand = {
            gid: {t: (d.in_flight, d.queued) for t, d in g.demand.items()}
            for gid, g in connected.items()
        }
        targets = {
            gid: {t: lim.target_slots for t, lim in current.gateways.get(gid, {}).items()}
            for gid in connected
        }
        if resplit or set(current.gateways) != set(connected) or split_is_stale(targets, demand):
            targets = split_among_gateways(current.tenant_limits, demand)
        tenants = [t.name for t in self.pool.tenants] + sorted(self._draining)
        cells = {
            (gid, tenant): Cell(
                target=targets.get(gid, {}).get(tenant, 0),
                granted=_granted(current, gid, tenant),
                bound=record.bound(tenant),
            )
            for gid, record in self._gateways.items()
            for tenant in tenants
        }
        if self._clock.monotonic() < self._holding_until_s:
            cells = {
                (gid, tenant): dataclasses.replace(
                    cell, target=min(cell.target, self._gateways[gid].acked_limits.get(tenant, 0))
                )
                for (gid, tenant), cell in cells.items()
            }
        grants = compute_grants(self.pool.budget_slots, cells)
        pauses = self._pause_levels(connected, grants)
        gateways = {
            gid: {
                t: GatewayLimit(
                    targets.get(gid, {}).get(t, 0), grants[(gid, t)], pauses.get((gid, t))
                )
                for t in tenants
            }
            for gid in connected
        }
        self._draining = {
            t for t in self._draining if any(g.bound(t) > 0 for g in self._gateways.values())
        }
        candidate = dataclasses.replace(current, gateways=gateways)
        if candidate.same_limits(current) and not force_publish:
            self.allocation = candidate
            return None
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
        for gid, record in connected.items():
            record.sent[published.version] = {
                t: lim.limit_slots for t, lim in gateways[gid].items()
            }
            record.sent_at_s[published.version] = now
            record.session.mailbox.put(delivery)
        return published

    def _pause_levels(
        self, connected: Mapping[str, _GatewayRecord], grants: Mapping[tuple[str, str], int]
    ) -> dict[tuple[str, str], int]:
        """Where preemptible tenants must pause work above their limits (core/preemption.py),
        unless preemption is off or the pool's recent waste is over its cap."""
        settings = self.pool.preemption
        if not settings.enabled or self.waste_percent() > settings.max_waste_percent:
            return {}
        preemptible = [t for t in self.pool.tenants if t.preemptible]
        if not preemptible:
            return {}
        nominal = nominal_shares(self.pool)
        terms = {
            t.name: TenantTerms(
                preemptible=t.preemptible,
                nominal_slots=nominal[t.name],
                limit_slots=self.allocation.tenant_limits.get(t.name, 0),
            )
            for t in self.pool.tenants
        }
        loads: dict[tuple[str, str], CellLoad] = {}
        for gid, record in connected.items():
            for tenant in terms:
                loads[(gid, tenant)] = CellLoad(
                    in_flight=record.demand_of(tenant).in_flight, grant=grants.get((gid, tenant), 0)
                )
        return pause_levels(terms, loads)

    def _observe_waste(self) -> None:
        """Remember the pool's output and waste counters now, for the waste window."""
        now = self._clock.monotonic()
        output = waste = 0
        for record in self._gateways.values():
            for demand in record.demand.values():
                output += demand.output_tokens_total
                waste += demand.waste_tokens_total
        samples = self._waste_samples
        samples.append((now, output, waste))
        horizon = now - self.pool.preemption.waste_window_s
        while len(samples) > 2 and samples[1][0] <= horizon:
            samples.popleft()

    @property
    def policy_pool(self) -> PoolConfig:
        """The pool as the policies see it: with preemption off while the pool's recent waste
        is over its cap. Nothing is paused then (_pause_levels), so no lender's reserve may be
        lent to a preemptible tenant either: its slots would come back only as the borrowed
        requests end."""
        settings = self.pool.preemption
        if not settings.enabled or self.waste_percent() <= settings.max_waste_percent:
            return self.pool
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


def _granted(allocation: Allocation, gateway_id: str, tenant: str) -> int:
    limits = allocation.gateways.get(gateway_id, {})
    return limits[tenant].limit_slots if tenant in limits else 0


def _merge(latencies: list[LatencySummary]) -> LatencySummary:
    """Percentiles of several gateways' windows: p50 weighted by count, p90 and p99 the worst
    (windows cannot be merged exactly without their samples; the tail errs on the safe side)."""
    known = [lat for lat in latencies if lat.count > 0]
    if not known:
        return LatencySummary()
    count = sum(lat.count for lat in known)
    return LatencySummary(
        count=count,
        p50_ms=sum(lat.p50_ms * lat.count for lat in known) / count,
        p90_ms=max(lat.p90_ms for lat in known),
        p99_ms=max(lat.p99_ms for lat in known),
    )
