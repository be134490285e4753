"""The gateways of one pool: their sessions, leases and what each may hold (go-control-plane's
registry role).

A gateway is one `GatewayRecord`: the session of its live stream (a replaced connection's
events are ignored), its newest figures as rows over the pool's tenants, the limits it
acknowledged and those sent and not yet acknowledged, and a lease that keeps a disconnected
gateway's slots counted until it runs out. `GatewayRecord.bounds` is the most a gateway may be
holding of each tenant: what the grants (core/placement.py) must leave room for.

The registry is per pool today; one gateway stream will carry several pools (the fleet
topology), and then a session holds one record per pool it serves. Rows count units (one request
is one unit today): nothing here depends on what a unit is.
"""

from __future__ import annotations

import itertools
import logging
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field

import numpy as np
from numpy.typing import NDArray

from controlplane.core.allocation import Allocation
from slotshift.clock import Clock
from slotshift.demand import TenantDemand
from slotshift.demand_columns import COUNTS, IN_FLIGHT, LATENCIES, QUEUED, DemandColumns
from slotshift.newest import NewestBox

logger = logging.getLogger(__name__)


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


@dataclass(frozen=True, slots=True, eq=False)
class Taken:
    """What a gateway's figures changed (GatewayRecord.take_figures)."""

    started: bool
    """Some tenant's requests started to queue there (none queued before, some now)."""
    moved: bool
    """Some tenant's requests in flight or queued there moved: what placement reads."""
    columns: NDArray[np.intp]
    """The columns whose figures may have changed."""
    change: NDArray[np.int64]
    """(COUNTS, len(columns)): new counts minus old, per column (slotshift.demand_columns)."""


Row = NDArray[np.int64]
"""One gateway's figure for every tenant of the pool, in PoolState.tenants' order."""

Row2 = NDArray[np.int64]
"""Rows of several gateways: (gateways, tenants)."""


class GatewayRecord:
    """One gateway as the control plane knows it: its figures as rows over the pool's tenants,
    and the limits it enforces or may soon enforce."""

    __slots__ = (
        "acked",
        "applied_version",
        "connected",
        "counts",
        "delivery",
        "gateway_id",
        "held",
        "in_flight",
        "latencies",
        "lease_expires_at_s",
        "observed_at_wall_s",
        "pending",
        "queued",
        "sent",
        "sent_at_s",
        "sent_version",
        "session",
    )

    def __init__(self, gateway_id: str, session: GatewaySession, tenants: int) -> None:
        self.gateway_id = gateway_id
        self.session = session
        self.delivery: Delivery | None = None
        """The newest allocation put in the session's mailbox."""
        self.connected = True
        self.applied_version = 0
        self.counts: Row2 = np.zeros((COUNTS, tenants), dtype=np.int64)
        """The newest figures the gateway sent of each tenant: rows as DemandColumns.counts,
        columns the pool's tenants; 0 where it holds none."""
        self.latencies: NDArray[np.float64] = np.zeros((LATENCIES, tenants), dtype=np.float64)
        """Its latency windows, rows as DemandColumns.latencies."""
        self.held: NDArray[np.bool_] = np.zeros(tenants, dtype=bool)
        """Which tenants it holds figures of."""
        self.in_flight: Row = self.counts[IN_FLIGHT]
        """A view of `counts`: its requests in flight of each tenant."""
        self.queued: Row = self.counts[QUEUED]
        """A view of `counts`: its requests queued of each tenant."""
        self.observed_at_wall_s: float | None = None
        """When the gateway observed its figures (its wall clock, from the message); None:
        unknown."""
        self.acked: Row = zeros_row(tenants)
        """Limits in force at the last acknowledgement (or the hello)."""
        self.sent: dict[int, Row] = {}
        """version -> limits sent and not yet acknowledged."""
        self.pending: Row = zeros_row(tenants)
        """The largest limit of each tenant among `sent`."""
        self.sent_at_s: dict[int, float] = {}
        self.sent_version = 0
        """The newest version sent to this gateway (on any of its connections)."""
        self.lease_expires_at_s: float | None = None

    def bounds(self) -> Row:
        """Most this gateway may be holding of each tenant (see controlplane/core/grants.py)."""
        return np.maximum(np.maximum(self.in_flight, self.acked), self.pending)

    def take_figures(
        self,
        figures: DemandColumns,
        observed_at_wall_s: float | None,
        index: Mapping[str, int],
        *,
        delta: bool = False,
    ) -> Taken:
        """Hold `figures` (of the tenants in `index`) as this gateway's figures, observed at
        `observed_at_wall_s`: all of them (a tenant not named has none), or with `delta` only the
        named tenants' (the others stand). Always the newest: one session is one gRPC stream,
        which delivers in order, so an earlier stamp means the gateway's clock stepped back, not
        an old message (dropping it would freeze the gateway's demand until its clock caught
        up). Costs about the number of tenants named (a whole report: the pool's tenants)."""
        get = index.get
        named = [get(t, -1) for t in figures.tenants]
        counts, latencies = figures.counts, figures.latencies
        if -1 in named:
            known = np.array(named, dtype=np.intp) >= 0
            columns = np.array(named, dtype=np.intp)[known]
            counts, latencies = counts[:, known], latencies[:, known]
        else:
            # Every tenant named is the pool's (all but always): no copy of the figures.
            columns = np.array(named, dtype=np.intp)
        self.observed_at_wall_s = observed_at_wall_s
        if delta:
            # A tenant it holds no figures of has zeros in every row.
            before = self.counts[:, columns]
            self.counts[:, columns] = counts
            self.latencies[:, columns] = latencies
            self.held[columns] = True
            change = counts - before
            return Taken(
                started=bool(((counts[QUEUED] > 0) & (before[QUEUED] == 0)).any()),
                # In flight and queued are the first two rows: what placement reads.
                moved=bool(change[IN_FLIGHT : QUEUED + 1].any()),
                columns=columns,
                change=change,
            )
        before = self.counts.copy()
        queued_before = before[QUEUED]
        self.counts[:] = 0
        self.latencies[:] = 0.0
        self.held[:] = False
        self.counts[:, columns] = counts
        self.latencies[:, columns] = latencies
        self.held[columns] = True
        every = np.arange(self.held.size, dtype=np.intp)
        return Taken(
            started=bool(((self.queued > 0) & (queued_before == 0)).any()),
            moved=not (
                np.array_equal(before[IN_FLIGHT], self.in_flight)
                and np.array_equal(queued_before, self.queued)
            ),
            columns=every,
            change=self.counts - before,
        )

    def demand(self, tenants: tuple[str, ...]) -> dict[str, TenantDemand]:
        """The figures it holds, tenant by tenant (`tenants`: the columns' names), as the
        gateway sent them (the fields the control plane keeps)."""
        held = np.flatnonzero(self.held)
        names = tuple(tenants[column] for column in held)
        columns = DemandColumns(names, self.counts[:, held], self.latencies[:, held])
        return {d.tenant: d for d in columns.demands()}

    def enforcing(self, version: int) -> bool:
        """The gateway says it enforces `version` now (an acknowledgement, or a report's
        `applied_version`: so the next report heals a lost acknowledgement). Its limits then are
        those sent with `version`; versions up to it are no longer pending. Returns whether the
        most it may hold by its limits (acknowledged or pending) fell."""
        acked, pending = self.acked, self.pending
        if version in self.sent:
            self.acked = self.sent[version]
        if any(v <= version for v in self.sent):
            self.sent = {v: limits for v, limits in self.sent.items() if v > version}
            self.pending = row_max(self.sent.values(), self.acked.size)
        self.applied_version = max(self.applied_version, version)
        if self.acked is acked and self.pending is pending:
            return False
        return not np.array_equal(np.maximum(acked, pending), np.maximum(self.acked, self.pending))

    def send(self, version: int, limits: Row, now_s: float) -> None:
        """`limits` go out to the gateway as `version`."""
        self.sent[version] = limits
        self.sent_at_s[version] = now_s
        self.pending = np.maximum(self.pending, limits)
        self.sent_version = max(self.sent_version, version)

    def reindex(self, old: tuple[str, ...], new: tuple[str, ...]) -> None:
        """The pool's tenants changed from `old` to `new`: move every row to the new columns
        (a tenant new here starts at 0)."""
        source = columns_of(old, new)
        kept = source >= 0

        def moved(row: Row) -> Row:
            result = zeros_row(len(new))
            result[kept] = row[source[kept]]
            return result

        counts = np.zeros((COUNTS, len(new)), dtype=np.int64)
        counts[:, kept] = self.counts[:, source[kept]]
        latencies = np.zeros((LATENCIES, len(new)), dtype=np.float64)
        latencies[:, kept] = self.latencies[:, source[kept]]
        held = np.zeros(len(new), dtype=bool)
        held[kept] = self.held[source[kept]]
        self.counts, self.latencies, self.held = counts, latencies, held
        self.in_flight, self.queued = counts[IN_FLIGHT], counts[QUEUED]
        self.acked = moved(self.acked)
        self.sent = {v: moved(limits) for v, limits in self.sent.items()}
        self.pending = moved(self.pending)


def zeros_row(size: int) -> Row:
    """A row of zeros."""
    return np.zeros(size, dtype=np.int64)


def row_max(rows: Iterable[Row], size: int) -> Row:
    """The cell-wise max of `rows` (zeros when there are none)."""
    result = zeros_row(size)
    for row in rows:
        np.maximum(result, row, out=result)
    return result


class GatewayRegistry:
    """The gateways of one pool, by id: connections, disconnections and leases."""

    def __init__(self, *, clock: Clock, lease_ttl_s: float) -> None:
        self._clock = clock
        self.lease_ttl_s = lease_ttl_s
        self._records: dict[str, GatewayRecord] = {}
        self._tokens = itertools.count(1)
        self._ids: tuple[str, ...] = ()
        """Every gateway's id, sorted: the rows' order in every pass over the pool."""

    def connect(
        self, gateway_id: str, tenants: int, applied_version: int, directory: TenantDirectory
    ) -> tuple[GatewayRecord, GatewayRecord | None]:
        """A new session for `gateway_id`, which says it enforces `applied_version`, with rows
        of `tenants` columns; returns its record and the one it replaces (whose session ends).
        Limits sent to the earlier connection and perhaps not applied yet stay counted."""
        session = GatewaySession(
            gateway_id=gateway_id, token=next(self._tokens), directory=directory
        )
        record = GatewayRecord(gateway_id, session, tenants)
        record.applied_version = applied_version
        previous = self._records.get(gateway_id)
        if previous is not None:
            previous.session.mailbox.close()
            for version, limits in previous.sent.items():
                if version > applied_version:
                    record.send(version, limits, previous.sent_at_s.get(version, 0.0))
            record.sent_at_s = {}
        self._records[gateway_id] = record
        self._ids = tuple(sorted(self._records))
        return record, previous

    def live(self, session: GatewaySession) -> GatewayRecord | None:
        """The record of `session` while it is its gateway's connected one; else None."""
        record = self._records.get(session.gateway_id)
        if record is None or record.session is not session or not record.connected:
            return None
        return record

    def get(self, gateway_id: str) -> GatewayRecord | None:
        return self._records.get(gateway_id)

    def disconnect(self, session: GatewaySession) -> GatewayRecord | None:
        """The session's stream ended: its gateway's lease starts (None: not the live one)."""
        record = self.live(session)
        if record is None:
            return None
        record.connected = False
        record.lease_expires_at_s = self._clock.monotonic() + self.lease_ttl_s
        session.mailbox.close()
        return record

    def expire(self) -> list[GatewayRecord]:
        """Forget the disconnected gateways whose lease ran out; returns them."""
        now = self._clock.monotonic()
        expired = [
            r
            for r in self._records.values()
            if not r.connected and r.lease_expires_at_s is not None and r.lease_expires_at_s <= now
        ]
        for record in expired:
            del self._records[record.gateway_id]
            logger.info("lease of gateway %s expired; its slots are free", record.gateway_id)
        if expired:
            self._ids = tuple(sorted(self._records))
        return expired

    def close_sessions(self) -> None:
        """End every gateway's stream (on shutdown)."""
        for record in self._records.values():
            record.session.mailbox.close()

    @property
    def ids(self) -> tuple[str, ...]:
        """Every known gateway's id (connected or within its lease), sorted."""
        return self._ids

    def __iter__(self) -> Iterator[GatewayRecord]:
        """Every known gateway, in `ids` order."""
        return (self._records[g] for g in self._ids)

    def __len__(self) -> int:
        return len(self._records)

    @property
    def connected(self) -> int:
        return sum(1 for r in self._records.values() if r.connected)

    def applied_versions(self) -> dict[str, int]:
        """gateway id -> the version it last acknowledged, for connected gateways."""
        return {r.gateway_id: r.applied_version for r in self if r.connected}

    def part_versions(self) -> dict[str, int]:
        """gateway id -> the newest version sent to it, for connected gateways."""
        return {r.gateway_id: r.sent_version for r in self if r.connected}

    def set_directory(self, directory: TenantDirectory) -> None:
        """Every connected gateway gets `directory` before its next allocation."""
        for record in self._records.values():
            if record.connected:
                record.session.directory = directory

    def reindex(self, old: tuple[str, ...], new: tuple[str, ...]) -> None:
        """The pool's tenants changed from `old` to `new`: every row moves to the new columns."""
        for record in self._records.values():
            record.reindex(old, new)


def columns_of(old: tuple[str, ...], new: tuple[str, ...]) -> Row:
    """For each tenant of `new`, its column in `old` (-1: none)."""
    if old == new:
        return np.arange(len(new), dtype=np.int64)
    where = {name: column for column, name in enumerate(old)}
    return np.array([where.get(name, -1) for name in new], dtype=np.int64)
