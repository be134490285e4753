"""One grid point: a real control plane, the generators, a measured window, the point's JSON.

Sequence:
1. a config is generated (one pool of T tenants, the point's budget, policy slo, shipped
   defaults otherwise, free ports) and the control plane is started from it as a user starts it
   (`python -m slotshift_tools controlplane --config FILE`), its output in `controlplane.log`;
2. the generator processes start (multiprocessing, spawn) and their gateways connect; once the
   control plane counts all G connected, a warm-up lets the restart hold (which lasts a lease
   from the control plane's start) and the first decisions pass;
3. the window: CPU times of the control plane, of each generator process, of this process and
   of the host are read at both ends; the control plane's RSS every second; the decision log is
   read as it grows (each decision once, through GetDecisions; that reading costs the control
   plane a little CPU, counted in its figure); the processes are watched;
4. the generators stop and write what they recorded; the last decisions are read; the control
   plane is stopped (SIGTERM, then SIGKILL after a grace period);
5. the figures (figures.py), the budget check over the whole run (budget.py) and the point's
   validity: a point where the host was saturated (the busy cores over the window at or above
   SATURATED_HOST_FRACTION of the CPUs), where a generator process used nearly a whole core, or
   where a generator's loop lagged like a disturbed bench run, is marked invalid, as the bench
   marks a run whose harness was disturbed.
"""

from __future__ import annotations

import asyncio
import json
import logging
import multiprocessing
import multiprocessing.context
import os
import signal
import sys
from collections.abc import Coroutine, Mapping, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import grpc
import numpy as np
import yaml

from slotshift.apportion import nominal_shares
from slotshift.clock import Clock
from slotshift.config import SlotshiftConfig, apply_overrides, parse_config, parse_overrides
from slotshift.v1 import query_pb2, query_pb2_grpc
from slotshift.wire import from_timestamp
from slotshift_tools.bench.summary import DISTURBED_LOOP_LAG_P99_MS
from slotshift_tools.local_stack import (
    STREAM_TOKENS_FOLDER,
    StreamTokenFiles,
    free_ports,
    generated_tenant_keys,
    grpc_serving,
)
from slotshift_tools.scale import procfs
from slotshift_tools.scale.budget import check_budget
from slotshift_tools.scale.dynamics import DemandSettings, Dynamics
from slotshift_tools.scale.figures import (
    PUBLISHED,
    DecisionTimes,
    Window,
    decision_figures,
    enforced_latencies,
    summary_ms,
)
from slotshift_tools.scale.generator import CHANNEL_OPTIONS, GeneratorSpec, generator_main

logger = logging.getLogger(__name__)

HOST = "127.0.0.1"
POOL = "scale"
POLICY = "slo"
SATURATED_HOST_FRACTION = 0.9
"""Busy cores over the window, as a fraction of the host's CPUs, from which a point is invalid:
the control plane and the generators competed for the CPUs (with each other or with anything
else on the host), so the control plane's figures are not its own."""
SATURATED_GENERATOR_CORES = 0.9
"""A generator process using this much of a core could not keep its gateways' pace."""
DECISION_POLL_S = 2.0
"""How often the decision log is read during the window."""
MAX_DECISIONS_READ = 8192
"""Most decisions asked for in one read (far above the log's shipped 512)."""
ENFORCED_HORIZON_S = 10.0
"""A published decision not enforced this long after it is not read again (counted as
unacknowledged, unless a later read of the log still shows it)."""
ENFORCED_SETTLE_S = 2.0
"""After the window, how long the decisions made at its end get to be enforced before the last
read (a decision not enforced by then is counted as unacknowledged)."""
MEMORY_POLL_S = 1.0
WATCH_S = 0.5
RPC_TIMEOUT_S = 30.0
STOP_GRACE_S = 10.0
HOLD_MARGIN_S = 1.0
"""The window starts at least this long after the control plane's restart hold has ended."""
GENERATOR_JOIN_S = 60.0
"""A generator writes its recording after its gateways stop: a large one takes a while."""

_OUTCOMES = {
    query_pb2.DECISION_OUTCOME_PUBLISHED: "published",
    query_pb2.DECISION_OUTCOME_HELD: "held",
    query_pb2.DECISION_OUTCOME_REJECTED: "rejected",
}


class PointError(RuntimeError):
    """The point could not be measured: a process failed to start or died during the run."""


@dataclass(frozen=True)
class PointSettings:
    """Everything one point needs."""

    tenants: int
    gateways: int
    budget_slots: int
    report_interval_s: float
    dynamics: Dynamics
    duration_s: float
    """The measured window."""
    warmup_s: float
    """From all gateways connected to the window's start (and the window never starts before
    the control plane's restart hold has ended)."""
    seed: int
    generator_processes: int
    overrides: tuple[str, ...] = ()
    """`--set PATH=VALUE` pairs for the control plane's config."""
    log_level: str = "WARNING"
    """The control plane's log level."""
    ready_timeout_s: float = 120.0
    """For the control plane to serve and for every gateway to connect, each."""
    keep_recordings: bool = False
    """Keep the generators' raw recordings (large) next to point.json."""

    @property
    def label(self) -> str:
        return f"{self.tenants}x{self.gateways}"


def tenant_names(count: int) -> list[str]:
    """t0, t1, ... zero-padded to one width, so that names sort in the pool's order."""
    width = len(str(count - 1))
    return [f"t{i:0{width}d}" for i in range(count)]


def controlplane_config_data(
    settings: PointSettings, grpc_port: int, metrics_port: int
) -> dict[str, Any]:
    """The generated config: one pool, the point's tenants and budget, policy slo, defaults
    otherwise (API keys in clear: a benchmark's throwaway file)."""
    return {
        "pools": [
            {
                "name": POOL,
                "budget_slots": settings.budget_slots,
                "policy": POLICY,
                "tenants": [
                    {"name": name, "api_keys": [f"scale-key-{name}"]}
                    for name in tenant_names(settings.tenants)
                ],
            }
        ],
        "controlplane": {"grpc_host": HOST, "grpc_port": grpc_port, "metrics_port": metrics_port},
    }


def effective_config(settings: PointSettings, data: dict[str, Any]) -> SlotshiftConfig:
    """The config the control plane runs: the generated one with the command line's --set."""
    config = parse_config(data, source="bench-scale")
    overrides = parse_overrides(settings.overrides)
    return apply_overrides(config, overrides) if overrides else config


def assign_gateways(gateways: int, processes: int) -> list[tuple[int, ...]]:
    """Gateways 0..G-1 dealt round-robin to the processes (none left empty)."""
    processes = max(1, min(processes, gateways))
    return [tuple(range(p, gateways, processes)) for p in range(processes)]


class DecisionReader:
    """Reads the decision log as it grows; keeps what the figures need of each decision."""

    def __init__(self, stub: query_pb2_grpc.AllocationServiceAsyncStub, pool: str) -> None:
        self._stub = stub
        self._pool = pool
        self.decisions: dict[int, DecisionTimes] = {}
        self.last_id = 0
        self.lost = 0
        """Decisions that fell out of the bounded log before they were read."""

    async def read_new(self) -> None:
        """Fetch the decisions made since the last read, and again those read before that were
        published and not yet enforced (the log answers newest first, with no offset: ask for
        more until the answer reaches back to the oldest one wanted, or the log holds no older
        ones)."""
        newest = await self._get(1)
        if not newest:
            return
        horizon_s = newest[0].decided_at_wall_s - ENFORCED_HORIZON_S
        pending = [
            d.id
            for d in self.decisions.values()
            if d.outcome == PUBLISHED
            and d.enforced_at_wall_s is None
            and d.decided_at_wall_s >= horizon_s
        ]
        wanted = min([self.last_id + 1, *pending])
        if newest[0].id < wanted:
            return
        # A little more than the gap: decisions made between the two calls.
        limit = newest[0].id - wanted + 3
        while True:
            fetched = await self._get(limit)
            oldest = min((d.id for d in fetched), default=wanted)
            if oldest <= wanted or len(fetched) < limit or limit >= MAX_DECISIONS_READ:
                break
            limit = min(2 * limit, MAX_DECISIONS_READ)
        fresh = [d for d in fetched if d.id > self.last_id]
        self.lost += max(0, min((d.id for d in fresh), default=self.last_id + 1) - self.last_id - 1)
        for decision in fetched:
            if decision.id > self.last_id or decision.id in self.decisions:
                self.decisions[decision.id] = decision
        if fresh:
            self.last_id = max(d.id for d in fresh)

    async def run(self, interval_s: float) -> None:
        """read_new every interval, until cancelled."""
        while True:
            await asyncio.sleep(interval_s)
            await self.read_new()

    async def _get(self, limit: int) -> list[DecisionTimes]:
        # Times only: the decisions' tenants (even as stored, only what changed) would cost the
        # control plane more than the decisions this reads the times of (7.6% of its CPU at
        # 1,000 x 100 as stored).
        request = query_pb2.GetDecisionsRequest(
            pool=self._pool, limit=limit, changes_only=True, without_tenants=True
        )
        reply = await self._stub.GetDecisions(request, timeout=RPC_TIMEOUT_S)
        return [
            DecisionTimes(
                id=d.id,
                decided_at_wall_s=from_timestamp(d.decided_at),
                duration_ms=d.duration_ms,
                outcome=_OUTCOMES.get(d.outcome, "unspecified"),
                trigger=d.trigger,
                version=d.version,
                enforced_at_wall_s=from_timestamp(d.enforced_at)
                if d.HasField("enforced_at")
                else None,
            )
            for d in reply.decisions
        ]


@dataclass
class CpuMark:
    """CPU seconds of each watched process and of the host at one moment."""

    wall_s: float
    controlplane_s: float
    generators_s: list[float]
    harness_s: float
    host: procfs.HostCpu


class _Processes:
    """The control plane and the generator processes of one point."""

    def __init__(self, settings: PointSettings, out_dir: Path) -> None:
        self.settings = settings
        self.out_dir = out_dir
        self.controlplane: asyncio.subprocess.Process | None = None
        self.generators: list[multiprocessing.context.SpawnProcess] = []
        self._context = multiprocessing.get_context("spawn")
        self.stop_generators = self._context.Event()

    async def start_controlplane(self, config_path: Path, target: str) -> None:
        log = (self.out_dir / "controlplane.log").open("wb")
        with log:
            argv = [
                sys.executable,
                "-m",
                "slotshift_tools",
                "controlplane",
                "--config",
                str(config_path),
                "--log-level",
                self.settings.log_level,
            ]
            for pair in self.settings.overrides:
                argv += ["--set", pair]
            self.controlplane = await asyncio.create_subprocess_exec(
                *argv, stdout=log, stderr=asyncio.subprocess.STDOUT, start_new_session=True
            )
        deadline = asyncio.get_running_loop().time() + self.settings.ready_timeout_s
        while not await grpc_serving(target):
            if self.controlplane.returncode is not None:
                raise PointError(
                    f"the control plane exited with status {self.controlplane.returncode} while "
                    f"starting (see {self.out_dir / 'controlplane.log'})"
                )
            if asyncio.get_running_loop().time() > deadline:
                raise PointError(
                    f"the control plane was not serving within {self.settings.ready_timeout_s} s"
                )
            await asyncio.sleep(0.2)

    def start_generators(self, specs: Sequence[GeneratorSpec]) -> None:
        for spec in specs:
            process = self._context.Process(
                target=generator_main,
                args=(spec, self.stop_generators),
                name=f"bench-scale-generator-{spec.index}",
            )
            process.start()
            self.generators.append(process)

    def controlplane_pid(self) -> int:
        assert self.controlplane is not None
        return self.controlplane.pid

    def check_alive(self) -> None:
        """PointError when the control plane or a generator has exited."""
        if self.controlplane is not None and self.controlplane.returncode is not None:
            raise PointError(
                f"the control plane exited with status {self.controlplane.returncode} during "
                "the run"
            )
        for process in self.generators:
            if process.exitcode is not None and not self.stop_generators.is_set():
                raise PointError(f"{process.name} exited with status {process.exitcode}")

    def cpu_mark(self, clock: Clock) -> CpuMark:
        return CpuMark(
            wall_s=clock.wall(),
            controlplane_s=procfs.process_cpu_s(self.controlplane_pid()),
            generators_s=[
                procfs.process_cpu_s(p.pid) if p.pid is not None else 0.0 for p in self.generators
            ],
            harness_s=procfs.process_cpu_s(os.getpid()),
            host=procfs.host_cpu(),
        )

    async def stop_generator_processes(self) -> None:
        self.stop_generators.set()
        for process in self.generators:
            await asyncio.to_thread(process.join, GENERATOR_JOIN_S)
            if process.exitcode is None:
                logger.warning("%s did not stop; terminating it", process.name)
                process.terminate()
                await asyncio.to_thread(process.join, STOP_GRACE_S)

    async def stop_controlplane(self) -> None:
        process = self.controlplane
        if process is None or process.returncode is not None:
            return
        process.send_signal(signal.SIGTERM)
        try:
            await asyncio.wait_for(process.wait(), STOP_GRACE_S)
        except TimeoutError:
            logger.warning("the control plane did not stop within %.0f s; killing it", STOP_GRACE_S)
            process.kill()
            await process.wait()

    async def stop(self) -> None:
        """Everything still running, generators first (they hold the streams)."""
        if not self.stop_generators.is_set() or any(p.is_alive() for p in self.generators):
            await self.stop_generator_processes()
        await self.stop_controlplane()


async def run_point(settings: PointSettings, out_dir: Path, clock: Clock) -> dict[str, Any]:
    """Measure one point (module docstring); returns its JSON document, also written to
    `out_dir/point.json`. PointError when a process fails to start or dies."""
    grpc_port, metrics_port = free_ports(2)
    data = controlplane_config_data(settings, grpc_port, metrics_port)
    data["tenant_keys"] = await asyncio.to_thread(generated_tenant_keys, out_dir)
    # The simulated gateways authenticate as real ones do: the per-message cost measured is
    # that of an authenticated stream (the check itself runs once, at the stream's start).
    tokens = await asyncio.to_thread(StreamTokenFiles.ensure, out_dir / STREAM_TOKENS_FOLDER)
    data["controlplane"]["stream_auth"] = {
        "gateway_token_file": str(tokens.gateway),
        "agent_token_file": str(tokens.agent),
    }
    config = effective_config(settings, data)
    pool = config.pool(POOL)
    config_path = out_dir / "slotshift.yaml"
    await asyncio.to_thread(_write_config, config_path, data)
    target = f"{HOST}:{grpc_port}"
    processes = _Processes(settings, out_dir)
    nominal = nominal_shares(pool)
    tenants = tuple(t.name for t in pool.tenants)
    try:
        await processes.start_controlplane(config_path, target)
        serving_at = clock.monotonic()
        origin = clock.wall()
        assignment = assign_gateways(settings.gateways, settings.generator_processes)
        horizon_s = settings.ready_timeout_s + settings.warmup_s + settings.duration_s + 60.0
        specs = [
            GeneratorSpec(
                index=index,
                target=target,
                pool=POOL,
                tenants=tenants,
                nominal=tuple(nominal[t] for t in tenants),
                gateway_indexes=gateways,
                gateways_total=settings.gateways,
                report_interval_s=settings.report_interval_s,
                dynamics=settings.dynamics,
                seed=settings.seed,
                origin_wall_s=origin,
                deadline_wall_s=origin + horizon_s,
                out_dir=str(out_dir),
                token_file=str(tokens.gateway),
                settings=DemandSettings(),
            )
            for index, gateways in enumerate(assignment)
        ]
        processes.start_generators(specs)
        async with grpc.aio.insecure_channel(target, options=CHANNEL_OPTIONS) as channel:
            stub = query_pb2_grpc.AllocationServiceStub(channel)
            await _wait_connected(stub, settings, processes, clock)
            # The window never overlaps the restart hold: while it lasts, grants follow the
            # acknowledged limits, and acks of superseded versions make them flip back and forth
            # (an update storm of its own, counted as updates_before_window).
            hold_ends = serving_at + config.controlplane.gateway_lease_ttl_s + HOLD_MARGIN_S
            await asyncio.sleep(max(settings.warmup_s, hold_ends - clock.monotonic()))
            reader = DecisionReader(stub, POOL)
            measured = await _measure(settings, processes, reader, clock)
            await processes.stop_generator_processes()
            await reader.read_new()
        await processes.stop_controlplane()
    finally:
        await processes.stop()
    # Reading the recordings back and merging them is blocking work, done off the loop.
    document = await asyncio.to_thread(
        _point_document,
        settings,
        pool_period_s=pool.decision_period_s,
        measured=measured,
        reader=reader,
        out_dir=out_dir,
        processes=len(specs),
    )
    await asyncio.to_thread(
        (out_dir / "point.json").write_text, json.dumps(document, indent=2) + "\n", "utf-8"
    )
    return document


def _write_config(path: Path, data: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(
        "# Generated by `slotshift bench-scale` for one point; overrides come as --set flags.\n"
        + yaml.safe_dump(data, sort_keys=False),
        encoding="utf-8",
    )


async def _wait_connected(
    stub: query_pb2_grpc.AllocationServiceAsyncStub,
    settings: PointSettings,
    processes: _Processes,
    clock: Clock,
) -> None:
    deadline = clock.monotonic() + settings.ready_timeout_s
    while True:
        processes.check_alive()
        reply = await stub.ListPools(query_pb2.ListPoolsRequest(), timeout=RPC_TIMEOUT_S)
        connected = sum(p.gateways_connected for p in reply.pools if p.name == POOL)
        if connected >= settings.gateways:
            return
        if clock.monotonic() > deadline:
            raise PointError(
                f"{connected} of {settings.gateways} gateways connected within "
                f"{settings.ready_timeout_s} s"
            )
        await asyncio.sleep(0.2)


@dataclass
class _Measured:
    start: CpuMark
    end: CpuMark
    rss_mb: list[float]
    peak_rss_mb: float
    load_average_1m: tuple[float, float]


async def _measure(
    settings: PointSettings, processes: _Processes, reader: DecisionReader, clock: Clock
) -> _Measured:
    """The window: CPU marks at both ends, RSS each second, decisions read as they come."""
    rss: list[float] = []
    # The warm-up's decisions are read before the window: at a large point that reading is
    # long, and it would lengthen the window and weigh on its figures.
    await reader.read_new()
    load_before = os.getloadavg()[0]
    start = processes.cpu_mark(clock)

    async def memory() -> None:
        while True:
            rss.append(procfs.process_memory(processes.controlplane_pid()).rss_mb)
            await asyncio.sleep(MEMORY_POLL_S)

    async def watch() -> None:
        while True:
            processes.check_alive()
            await asyncio.sleep(WATCH_S)

    try:
        async with asyncio.timeout(settings.duration_s) as deadline:
            await _together(
                {
                    "memory": memory(),
                    "watch": watch(),
                    "decisions": reader.run(DECISION_POLL_S),
                }
            )
    except TimeoutError:
        if not deadline.expired():
            raise
    end = processes.cpu_mark(clock)
    memory_now = procfs.process_memory(processes.controlplane_pid())
    rss.append(memory_now.rss_mb)
    # The window's last decisions are enforced a little after it: read them once they may be
    # (outside the CPU marks).
    await asyncio.sleep(ENFORCED_SETTLE_S)
    await reader.read_new()
    return _Measured(
        start=start,
        end=end,
        rss_mb=rss,
        peak_rss_mb=memory_now.peak_rss_mb,
        load_average_1m=(load_before, os.getloadavg()[0]),
    )


async def _together(work: Mapping[str, Coroutine[Any, Any, None]]) -> None:
    """Run the named coroutines until cancelled; a PointError ends them all and comes out as
    itself rather than wrapped in an exception group."""
    try:
        async with asyncio.TaskGroup() as group:
            for name, coroutine in work.items():
                group.create_task(coroutine, name=f"bench-scale/{name}")
    except* PointError as failures:
        raise failures.exceptions[0] from None


@dataclass
class _Recordings:
    """The generators' recordings, merged."""

    held: tuple[np.ndarray, np.ndarray, np.ndarray]
    updates: np.ndarray
    acks: np.ndarray
    reports: np.ndarray
    directories: np.ndarray
    loop_lags: list[np.ndarray]
    errors: list[str]
    stale_updates: int


def _load_recordings(out_dir: Path, processes: int, *, keep: bool) -> _Recordings:
    arrays: list[Any] = []
    errors: list[str] = []
    stale = 0
    for index in range(processes):
        npz_path = out_dir / f"generator-{index}.npz"
        json_path = out_dir / f"generator-{index}.json"
        if not npz_path.exists():
            raise PointError(f"generator {index} wrote no recording")
        with np.load(npz_path) as recording:
            arrays.append({key: recording[key] for key in recording.files})
        extra = json.loads(json_path.read_text(encoding="utf-8"))
        errors.extend(extra["errors"])
        stale += int(extra["stale_updates"])
        if not keep:
            npz_path.unlink()
            json_path.unlink()

    def joined(key: str, width: int) -> np.ndarray:
        parts = [a[key] for a in arrays if len(a[key])]
        return np.concatenate(parts) if parts else np.zeros((0, width))

    return _Recordings(
        held=(
            np.concatenate([a["held_times"] for a in arrays]),
            np.concatenate([a["held_cells"] for a in arrays]),
            np.concatenate([a["held_values"] for a in arrays]),
        ),
        updates=joined("updates", 5),
        acks=joined("acks", 4),
        reports=joined("reports", 3),
        directories=joined("directories", 3),
        loop_lags=[a["loop_lags"] for a in arrays],
        errors=errors,
        stale_updates=stale,
    )


def _in_window(table: np.ndarray, column: int, window: Window) -> np.ndarray:
    if len(table) == 0:
        return table
    times = table[:, column]
    return table[(times >= window.start_s) & (times <= window.end_s)]


def _point_document(
    settings: PointSettings,
    *,
    pool_period_s: float,
    measured: _Measured,
    reader: DecisionReader,
    out_dir: Path,
    processes: int,
) -> dict[str, Any]:
    recordings = _load_recordings(out_dir, processes, keep=settings.keep_recordings)
    window = Window(measured.start.wall_s, measured.end.wall_s)
    seconds = window.length_s
    start, end = measured.start, measured.end
    cpus = os.cpu_count() or 1
    controlplane_cores = procfs.cores_used(start.controlplane_s, end.controlplane_s, seconds)
    generator_cores = [
        procfs.cores_used(a, b, seconds)
        for a, b in zip(start.generators_s, end.generators_s, strict=True)
    ]
    harness_cores = procfs.cores_used(start.harness_s, end.harness_s, seconds)
    host_busy = procfs.cores_used(start.host.busy_s, end.host.busy_s, seconds)
    lags = [_in_window(lag, 0, window)[:, 1] * 1000.0 for lag in recordings.loop_lags]
    lag_p99 = [summary_ms(lag.tolist())["p99_ms"] for lag in lags]
    lag_max = max((float(lag.max()) for lag in lags if len(lag)), default=None)
    worst_lag_p99 = max((v for v in lag_p99 if isinstance(v, float)), default=None)

    decisions = sorted(reader.decisions.values(), key=lambda d: d.id)
    ack_latencies_s, unacknowledged = enforced_latencies(decisions, window)
    updates = _in_window(recordings.updates, 1, window)
    reports = _in_window(recordings.reports, 1, window)
    acks = _in_window(recordings.acks, 2, window)
    per_gateway_s = settings.gateways * seconds
    budget = check_budget(*recordings.held, budget_slots=settings.budget_slots)

    reasons = []
    if host_busy >= SATURATED_HOST_FRACTION * cpus:
        reasons.append(
            f"the host was saturated: {host_busy:.2f} of {cpus} cores busy over the window "
            "(the control plane, the generators and anything else on the host)"
        )
    for index, cores in enumerate(generator_cores):
        if cores >= SATURATED_GENERATOR_CORES:
            reasons.append(f"generator process {index} used {cores:.2f} of a core")
    if worst_lag_p99 is not None and worst_lag_p99 > DISTURBED_LOOP_LAG_P99_MS:
        reasons.append(
            f"a generator's event loop lagged (p99 {worst_lag_p99:.0f} ms > "
            f"{DISTURBED_LOOP_LAG_P99_MS:.0f} ms): its gateways saw and answered late"
        )
    if recordings.errors:
        reasons.append(f"{len(recordings.errors)} gateway stream(s) ended early")
    if reader.lost:
        reasons.append(f"{reader.lost} decision(s) left the log before they were read")

    return {
        "point": {
            "tenants": settings.tenants,
            "gateways": settings.gateways,
            "label": settings.label,
            "tenants_x_gateways": settings.tenants * settings.gateways,
            "budget_slots": settings.budget_slots,
            "policy": POLICY,
            "decision_period_s": pool_period_s,
            "report_interval_s": settings.report_interval_s,
            "dynamics": settings.dynamics,
            "demand": asdict(DemandSettings()),
            "duration_s": settings.duration_s,
            "warmup_s": settings.warmup_s,
            "seed": settings.seed,
            "controlplane_overrides": list(settings.overrides),
            "controlplane_log_level": settings.log_level,
        },
        "valid": not reasons,
        "invalid_reasons": reasons,
        "window": {"start_wall_s": window.start_s, "end_wall_s": window.end_s, "s": seconds},
        "controlplane": {
            "cpu_cores": controlplane_cores,
            "rss_mb": measured.rss_mb[-1],
            "rss_mb_max_sampled": max(measured.rss_mb),
            "peak_rss_mb": measured.peak_rss_mb,
        },
        "generator": {
            "processes": processes,
            "cpu_cores": sum(generator_cores),
            "cpu_cores_per_process": generator_cores,
            "loop_lag_p99_ms": worst_lag_p99,
            "loop_lag_max_ms": lag_max,
            "stream_errors": recordings.errors,
            "stale_updates": recordings.stale_updates,
        },
        "harness_cpu_cores": harness_cores,
        "host": {
            "cpus": cpus,
            "busy_cores": host_busy,
            "load_average_1m_before": measured.load_average_1m[0],
            "load_average_1m_after": measured.load_average_1m[1],
        },
        "decisions": {
            **decision_figures(decisions, window, pool_period_s),
            "lost_from_log": reader.lost,
        },
        "decision_to_acknowledged": {
            **summary_ms(v * 1000.0 for v in ack_latencies_s),
            "unacknowledged": unacknowledged,
        },
        "messages": {
            "updates_per_gateway_per_s": len(updates) / per_gateway_s,
            "update_bytes_per_gateway_per_s": float(updates[:, 4].sum()) / per_gateway_s
            if len(updates)
            else 0.0,
            "update_bytes_mean": float(updates[:, 4].mean()) if len(updates) else None,
            "acks_per_gateway_per_s": len(acks) / per_gateway_s,
            "reports_per_gateway_per_s": len(reports) / per_gateway_s,
            "report_bytes_per_gateway_per_s": float(reports[:, 2].sum()) / per_gateway_s
            if len(reports)
            else 0.0,
            "directories": len(recordings.directories),
            "updates_before_window": int(
                np.count_nonzero(recordings.updates[:, 1] < window.start_s)
            )
            if len(recordings.updates)
            else 0,
        },
        "budget": {
            "ok": budget.ok,
            "budget_slots": budget.budget_slots,
            "events": budget.events,
            "instants": budget.instants,
            "max_held_slots": budget.max_held_slots,
            "max_held_at_wall_s": budget.max_held_at_wall_s,
            "violations": budget.violations,
            "first_violations": [asdict(v) for v in budget.first_violations],
        },
    }
