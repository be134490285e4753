"""The load generator: processes of their own, each running several simulated gateways.

Each simulated gateway holds one real `GatewayService.Connect` stream, on a channel of its own,
and behaves as admission_gateway/control_client.py does on it:
- first a GatewayHello: the pool, its id, applied version 0 and every tenant's usage, with the
  static fallback split as its limits (nominal share // gateways, as a gateway configured with
  `fallback_replicas` = G enforces before it first hears from the control plane);
- a DemandReport every report interval (the requests move first, see dynamics.py), stamped with
  `observed_at`; a simulated gateway does not report early when a queue starts (the real one
  does, at most every queue_report_min_interval_s), so its message rate is the periodic one;
- reports and acks name only the tenants whose figures changed (every tenant every 5 s), as the
  real gateway's do;
- on an AllocationUpdate newer than the version applied: every tenant's limit is set (a delta
  names only the tenants that changed; a whole update gives the others 0), then the
  AllocationAck (version and usage at that moment) is sent, then waiting requests are admitted
  into raised limits. Older or repeated updates are ignored; a TenantDirectory is counted.

Each process records, per gateway: every update received (when, version, decision, bytes), every
ack (version, when sent), every report (when, bytes), the held-slot events of the budget check
(budget.py), and its event loop's lateness. At the end it writes them to `generator-<i>.npz`
and `generator-<i>.json` in the point's folder. It stops when the parent sets the stop event,
or at its deadline if the parent is gone.
"""

from __future__ import annotations

import asyncio
import json
import logging
import multiprocessing.synchronize
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import grpc
import numpy as np
from google.protobuf.timestamp_pb2 import Timestamp

from slotshift.aiotasks import Supervisor
from slotshift.clock import Clock, SystemClock
from slotshift.reconnect import STREAM_GONE
from slotshift.stream_token import bearer_metadata, read_stream_token
from slotshift.v1 import common_pb2, gateway_pb2, gateway_pb2_grpc
from slotshift.wire import demand_messages_of, to_timestamp
from slotshift_tools.scale.budget import HeldLog
from slotshift_tools.scale.dynamics import (
    DemandSettings,
    DemandTimeline,
    Dynamics,
    GatewayCells,
    IntArray,
)

logger = logging.getLogger(__name__)

STOP_POLL_S = 0.1
"""How often a generator process looks at the parent's stop event."""
LOOP_PROBE_S = 0.05
"""Interval of the loop-lag probe (as the bench's harness)."""
CHANNEL_OPTIONS = [
    # A 10,000-tenant update or directory is hundreds of kB; the default cap is 4 MB.
    ("grpc.max_receive_message_length", -1),
    ("grpc.max_send_message_length", -1),
]

_Call = grpc.aio.StreamStreamCall[gateway_pb2.GatewayMessage, gateway_pb2.ControlMessage]


@dataclass(frozen=True)
class GeneratorSpec:
    """What one generator process runs (picklable: it crosses into a spawned process)."""

    index: int
    target: str
    """host:port of the control plane's gRPC API."""
    pool: str
    tenants: tuple[str, ...]
    nominal: tuple[int, ...]
    """Each tenant's nominal share, in the pool's order."""
    gateway_indexes: tuple[int, ...]
    """The gateways this process runs, numbered over the whole point."""
    gateways_total: int
    report_interval_s: float
    dynamics: Dynamics
    seed: int
    origin_wall_s: float
    """Step 0 of the demand timeline; the same in every process."""
    deadline_wall_s: float
    """The process stops by then even if the parent never says so."""
    out_dir: str
    token_file: str | None = None
    """The gateways' stream token (the control plane's stream_auth.gateway_token_file), presented
    on every stream; None presents none."""
    settings: DemandSettings = field(default_factory=DemandSettings)


def gateway_name(index: int) -> str:
    """The id simulated gateway `index` says in its hello."""
    return f"scale-gw-{index:04d}"


class Recorder:
    """What one process's gateways record (see the module docstring)."""

    def __init__(self) -> None:
        self.held = HeldLog()
        self.updates: list[tuple[int, float, int, int, int]] = []
        """(gateway, received wall s, version, decision id, bytes) of each update applied."""
        self.stale_updates = 0
        """Updates not newer than the version applied (ignored, as the real gateway does)."""
        self.acks: list[tuple[int, int, float, int]] = []
        """(gateway, version, sent wall s, bytes)."""
        self.reports: list[tuple[int, float, int]] = []
        """(gateway, sent wall s, bytes)."""
        self.directories: list[tuple[int, float, int]] = []
        """(gateway, received wall s, bytes) of each TenantDirectory."""
        self.loop_lags: list[tuple[float, float]] = []
        """(wall s, seconds late) of each loop probe."""
        self.errors: list[str] = []
        """How streams ended before the stop, one line each."""


FULL_REPORT_INTERVAL_S = 5.0
"""The real gateway's default `full_report_interval_s`."""


class SimGateway:
    """One simulated gateway on one stream (see the module docstring)."""

    def __init__(
        self,
        spec: GeneratorSpec,
        index: int,
        timeline: DemandTimeline,
        recorder: Recorder,
        clock: Clock,
        auth_metadata: tuple[tuple[str, str], ...] = (),
    ) -> None:
        """auth_metadata: the call metadata that presents the stream token (bearer_metadata)."""
        self._spec = spec
        self._auth_metadata = auth_metadata
        self.index = index
        self.gateway_id = gateway_name(index)
        self._timeline = timeline
        self._recorder = recorder
        self._clock = clock
        self._positions = {name: i for i, name in enumerate(spec.tenants)}
        fallback = [share // spec.gateways_total for share in spec.nominal]
        self.cells = GatewayCells(fallback, max_queued=spec.settings.max_queued)
        self._cell_base = index * len(spec.tenants)
        self._rng = np.random.default_rng([spec.seed, index])
        self.applied_version = 0
        self._last_step_wall_s: float | None = None
        self._rows_sent: IntArray | None = None
        """The figures the control plane holds from this stream (see _rows); None: none yet."""
        self._whole_due_s = 0.0
        self._columns = False
        """Whether the control plane reads figures as columns (its directory said so)."""

    async def run(self) -> None:
        """Hello, then reports and acks until cancelled; returns when the stream ends."""
        async with grpc.aio.insecure_channel(self._spec.target, options=CHANNEL_OPTIONS) as channel:
            stub = gateway_pb2_grpc.GatewayServiceStub(channel)
            call: _Call = stub.Connect(None, metadata=self._auth_metadata)
            writes = asyncio.Lock()
            tasks = Supervisor(f"scale-gateway/{self.gateway_id}")
            try:
                self._record_held(np.arange(len(self.cells.limit)))
                hello = gateway_pb2.GatewayMessage(
                    hello=gateway_pb2.GatewayHello(
                        pool=self._spec.pool,
                        gateway_id=self.gateway_id,
                        applied_version=0,
                        tenants=demand_messages_of(self._figures(whole=True)[0]),
                    )
                )
                await self._write(call, writes, hello)
                tasks.spawn("reports", self._report_periodically(call, writes), forever=False)
                async for message in call:
                    kind = message.WhichOneof("kind")
                    if kind == "allocation":
                        await self._on_allocation(call, writes, message)
                    elif kind == "tenants":
                        self._columns = message.tenants.reads_demand_columns
                        self._recorder.directories.append(
                            (self.index, self._clock.wall(), message.ByteSize())
                        )
                self._recorder.errors.append(
                    f"{self.gateway_id}: the control plane ended the stream"
                )
            except grpc.aio.AioRpcError as exc:
                self._recorder.errors.append(
                    f"{self.gateway_id}: stream failed: {exc.code().name} {exc.details()}"
                )
            finally:
                await tasks.stop()
                call.cancel()

    async def _on_allocation(
        self, call: _Call, writes: asyncio.Lock, message: gateway_pb2.ControlMessage
    ) -> None:
        update = message.allocation
        received = self._clock.wall()
        if update.version <= self.applied_version:
            self._recorder.stale_updates += 1
            return
        # A whole update gives a tenant it does not name 0; a delta leaves it as it was.
        limits = self.cells.limit.copy() if update.delta else np.zeros_like(self.cells.limit)
        for tenant in update.tenants:
            position = self._positions.get(tenant.tenant)
            if position is not None:
                limits[position] = tenant.limit_slots
        before = self.cells.held()
        self.cells.apply_limits(limits)
        self._record_changes(before, received)
        self.applied_version = update.version
        self._recorder.updates.append(
            (self.index, received, update.version, update.decision_id, message.ByteSize())
        )
        # As the real gateway: the ack carries the usage right after the resize, nothing awaited
        # in between; waiting requests move into raised limits only after it.
        figures, delta = self._figures(whole=False)
        ack = gateway_pb2.GatewayMessage(
            ack=gateway_pb2.AllocationAck(
                pool=self._spec.pool,
                gateway_id=self.gateway_id,
                version=update.version,
                delta=delta,
                **self._carried(figures),
            )
        )
        await self._write(call, writes, ack)
        self._recorder.acks.append((self.index, update.version, self._clock.wall(), ack.ByteSize()))
        self.cells.admit()

    async def _report_periodically(self, call: _Call, writes: asyncio.Lock) -> None:
        interval = self._spec.report_interval_s
        # Gateways start at different moments in production: spread the phases.
        phase = random.Random(self._spec.seed * 7919 + self.index).uniform(0.0, interval)
        next_s = self._clock.monotonic() + phase
        while True:
            await asyncio.sleep(max(0.0, next_s - self._clock.monotonic()))
            # A late loop reports once and carries on from now, rather than catching up.
            next_s = max(next_s + interval, self._clock.monotonic())
            self.step()
            try:
                if self._clock.monotonic() >= self._whole_due_s:
                    # The lock first: an ack built meanwhile names what changed since these
                    # figures, so it must follow them on the stream.
                    async with writes:
                        observed_at = to_timestamp(self._clock.wall())
                        report = self._report(self._whole_figures(), False, observed_at)
                        await call.write(report)
                else:
                    figures, delta = self._figures(whole=False)
                    report = self._report(figures, delta, to_timestamp(self._clock.wall()))
                    await self._write(call, writes, report)
            except STREAM_GONE:
                return  # the stream is gone; the reader sees it too
            self._recorder.reports.append((self.index, self._clock.wall(), report.ByteSize()))

    def _report(
        self, figures: common_pb2.TenantDemandColumns, delta: bool, observed_at: Timestamp
    ) -> gateway_pb2.GatewayMessage:
        return gateway_pb2.GatewayMessage(
            demand=gateway_pb2.DemandReport(
                pool=self._spec.pool,
                gateway_id=self.gateway_id,
                applied_version=self.applied_version,
                observed_at=observed_at,
                delta=delta,
                **self._carried(figures),
            )
        )

    def step(self) -> None:
        """Move the requests to now: redraw what the dynamics say, let requests end and more
        start; record the held-slot changes before the report that shows them is sent."""
        spec = self._spec
        now = self._clock.wall()
        dt = (
            spec.report_interval_s
            if self._last_step_wall_s is None
            else now - self._last_step_wall_s
        )
        self._last_step_wall_s = now
        self._timeline.advance_to(int((now - spec.origin_wall_s) // spec.report_interval_s))
        before = self.cells.held()
        self.cells.redraw(
            self._timeline.levels / spec.gateways_total,
            bursting=self._timeline.bursting,
            dynamics=spec.dynamics,
            dt_s=dt,
            settings=spec.settings,
            rng=self._rng,
        )
        self.cells.serve(dt, mean_service_s=spec.settings.mean_service_s, rng=self._rng)
        self._record_changes(before, now)

    def _record_changes(self, before: IntArray, wall_s: float) -> None:
        after = self.cells.held()
        changed = np.flatnonzero(after != before)
        self._recorder.held.record(wall_s, changed + self._cell_base, after[changed])

    def _record_held(self, positions: IntArray) -> None:
        held = self.cells.held()
        self._recorder.held.record(self._clock.wall(), positions + self._cell_base, held[positions])

    def _figures(self, *, whole: bool) -> tuple[common_pb2.TenantDemandColumns, bool]:
        """As the real gateway (admission_gateway/control_client.py): every tenant (`whole`: on a
        new stream, and once per FULL_REPORT_INTERVAL_S from the periodic report), otherwise only
        the tenants whose figures changed since the last message on the stream (a delta).
        Changes are found on the cells' arrays, so a delta costs the generator about the tenants
        it names (the load must stay cheap beside the control plane it measures)."""
        rows = self._rows()
        if whole or self._rows_sent is None:
            self._rows_sent = rows
            self._whole_due_s = self._clock.monotonic() + FULL_REPORT_INTERVAL_S
            return self._usage(rows, np.arange(rows.shape[1])), False
        changed = np.flatnonzero((rows != self._rows_sent).any(axis=0))
        self._rows_sent[:, changed] = rows[:, changed]
        return self._usage(rows, changed), True

    def _whole_figures(self) -> common_pb2.TenantDemandColumns:
        """Every tenant's figures as of now (a whole report: built a field at a time, a report
        of 10,000 tenants takes a few milliseconds)."""
        rows = self._rows()
        self._rows_sent = rows
        self._whole_due_s = self._clock.monotonic() + FULL_REPORT_INTERVAL_S
        return self._usage(rows, np.arange(rows.shape[1]))

    def _rows(self) -> IntArray:
        """The figures a report carries, one row each: in flight, queued, admitted, completed,
        limit (the latency summaries are functions of these)."""
        cells = self.cells
        return np.stack(
            [
                cells.in_flight,
                cells.queued,
                cells.admitted_total,
                cells.completed_total,
                cells.limit,
            ]
        ).astype(np.int64)

    def _usage(self, rows: IntArray, columns: IntArray) -> common_pb2.TenantDemandColumns:
        """The usage of the tenants in `columns`, in a real gateway's shape (the latency windows
        are synthetic: no SLO is set at this benchmark's tenants, so the policy reads only their
        counts), built a whole field at a time."""
        tenants = self._spec.tenants
        service_ms = self._spec.settings.mean_service_s * 1000.0
        in_flight, waiting, admitted, completed, limit = rows[:, columns]
        count = np.minimum(completed, 1024)
        has = count > 0
        wait_ms = 50.0 * waiting
        windows = {
            name: np.where(has, p50_ms, 0.0)
            for name, p50_ms in (
                ("ttft", 150.0 + wait_ms),
                ("e2e", service_ms + wait_ms),
                ("queue_wait", wait_ms),
            )
        }
        latency_fields = {
            f"{name}_{field}": (p50 * factor).tolist()
            for name, p50 in windows.items()
            for field, factor in (("p50_ms", 1.0), ("p90_ms", 2.0), ("p99_ms", 4.0))
        }
        counts = count.tolist()
        return common_pb2.TenantDemandColumns(
            tenant=[tenants[c] for c in columns.tolist()],
            in_flight=in_flight.tolist(),
            queued=waiting.tolist(),
            admitted_total=admitted.tolist(),
            completed_total=completed.tolist(),
            limit_slots=limit.tolist(),
            ttft_count=counts,
            e2e_count=counts,
            queue_wait_count=counts,
            **latency_fields,
        )

    def _carried(self, figures: common_pb2.TenantDemandColumns) -> dict[str, Any]:
        """The fields that carry `figures`, in the form the control plane reads (the real
        gateway's _FiguresSent)."""
        if self._columns:
            return {"columns": figures}
        return {"tenants": demand_messages_of(figures)}

    @staticmethod
    async def _write(
        call: _Call, writes: asyncio.Lock, message: gateway_pb2.GatewayMessage
    ) -> None:
        # grpc.aio allows one write in flight per call; acks and reports come from two tasks.
        async with writes:
            await call.write(message)


async def loop_lag_probe(
    recorder: Recorder, clock: Clock, interval_s: float = LOOP_PROBE_S
) -> None:
    """Record how late the loop wakes from a fixed sleep, until cancelled."""
    while True:
        due = clock.monotonic() + interval_s
        await asyncio.sleep(interval_s)
        recorder.loop_lags.append((clock.wall(), max(0.0, clock.monotonic() - due)))


async def run_generator(
    spec: GeneratorSpec, should_stop: Callable[[], bool], clock: Clock
) -> Recorder:
    """Run the spec's gateways until `should_stop()` or the deadline; returns what they recorded."""
    recorder = Recorder()
    timeline = DemandTimeline(
        spec.nominal,
        spec.dynamics,
        step_s=spec.report_interval_s,
        seed=spec.seed,
        settings=spec.settings,
    )
    token = await asyncio.to_thread(
        read_stream_token, spec.token_file, field="gateway.controlplane_token_file"
    )
    metadata = bearer_metadata(token)
    tasks = Supervisor(f"scale-generator-{spec.index}")
    tasks.spawn("loop-lag", loop_lag_probe(recorder, clock))
    for index in spec.gateway_indexes:
        gateway = SimGateway(spec, index, timeline, recorder, clock, metadata)
        tasks.spawn(f"gateway/{gateway.gateway_id}", gateway.run(), forever=False)
    try:
        # The stop event is the parent process's (multiprocessing): it can only be polled.
        while not should_stop() and clock.wall() < spec.deadline_wall_s:  # noqa: ASYNC110
            await asyncio.sleep(STOP_POLL_S)
    finally:
        await tasks.stop()
    recorder.errors.extend(f"{name}: {exc!r}" for name, exc in tasks.failures)
    return recorder


def write_recording(recorder: Recorder, out_dir: Path, index: int) -> None:
    """`generator-<index>.npz` (arrays) and `generator-<index>.json` (the rest)."""
    times, cells, values = recorder.held.arrays()
    np.savez(
        out_dir / f"generator-{index}.npz",
        held_times=times,
        held_cells=cells,
        held_values=values,
        updates=_table(recorder.updates, 5),
        acks=_table(recorder.acks, 4),
        reports=_table(recorder.reports, 3),
        directories=_table(recorder.directories, 3),
        loop_lags=_table(recorder.loop_lags, 2),
    )
    (out_dir / f"generator-{index}.json").write_text(
        json.dumps({"errors": recorder.errors, "stale_updates": recorder.stale_updates}),
        encoding="utf-8",
    )


def _table(rows: Sequence[Sequence[float]], width: int) -> np.ndarray:
    """Rows as a float array of `width` columns (ids and versions are exact below 2**53)."""
    return np.asarray(rows, dtype=np.float64).reshape(-1, width)


def generator_main(spec: GeneratorSpec, stop: multiprocessing.synchronize.Event) -> None:
    """A generator process's entry point (multiprocessing, spawn)."""
    logging.basicConfig(
        level=logging.WARNING, format=f"generator-{spec.index} %(levelname)s %(message)s"
    )
    recorder = asyncio.run(run_generator(spec, stop.is_set, SystemClock()))
    write_recording(recorder, Path(spec.out_dir), spec.index)
