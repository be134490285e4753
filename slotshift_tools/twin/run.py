"""One run of a scenario in the twin: the stack's config as `slotshift bench` makes it, the
production pieces wired on a virtual loop, the bench's own load, the figures the bench records.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import time
from collections.abc import Callable, Coroutine, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from slotshift.config import SlotshiftConfig, apply_overrides, parse_config, reveal
from slotshift_tools.bench.arrivals import RequestShape
from slotshift_tools.bench.load import LoadGenerator, ScheduledRequest
from slotshift_tools.bench.runner import RunResult
from slotshift_tools.bench.sampler import Sample
from slotshift_tools.bench.scenario import POOL_BASELINE, PolicyRun, Scenario
from slotshift_tools.bench.stack_config import (
    StackPorts,
    merged_overrides,
    stack_config_data,
    stack_tenants,
)
from slotshift_tools.bench.stats import Window
from slotshift_tools.bench.trace import RequestStatus, RequestTrace
from slotshift_tools.twin.controlplane import TwinControlPlane
from slotshift_tools.twin.engine import TwinEngine
from slotshift_tools.twin.gateway import RequestServer, TwinGateway
from slotshift_tools.twin.settings import TwinSettings
from slotshift_tools.twin.stream import GatewayStream
from slotshift_tools.twin.virtual_loop import VirtualClock, VirtualEventLoop, run_virtual

_PORTS = StackPorts(engine=1, controlplane=2, controlplane_metrics=3, agent_metrics=4, gateways=())
"""Placeholder ports: nothing listens in the twin, but the stack's config names them."""


@dataclass(frozen=True)
class TwinStats:
    """How the twin itself fared in one run."""

    cpu_s: float
    """Process CPU seconds the run took."""
    simulated_s: float
    """Virtual seconds it covered (the stack's start to the horizon)."""
    engine_steps: int
    jumped_steps: int
    """Of engine_steps, those run inside decode runs (EngineCore.advance_decodes)."""


def run_config(scenario: Scenario, run: PolicyRun, overrides: dict[str, Any]) -> SlotshiftConfig:
    """The stack's effective config for `run`, exactly as `slotshift bench` builds it."""
    ports = StackPorts(**{**_PORTS.__dict__, "gateways": tuple(range(10, 10 + scenario.gateways))})
    data = stack_config_data(scenario, run, ports)
    config = parse_config(data, source=f"<twin {run.name}>")
    merged = merged_overrides(scenario, run, overrides)
    return apply_overrides(config, merged) if merged else config


class _Client:
    """The bench's StreamingClient in the twin: a request is a call into a gateway."""

    def __init__(
        self,
        clock: VirtualClock,
        origin_s: float,
        gateways: Mapping[str, RequestServer],
        tenant_of: dict[str, str],
        timeout_s: float,
    ) -> None:
        self._clock = clock
        self._origin_s = origin_s
        self._gateways = gateways
        self._tenant_of = tenant_of
        self._timeout_s = timeout_s

    def now_s(self) -> float:
        return self._clock.monotonic() - self._origin_s

    async def send(
        self, trace: RequestTrace, gateway_url: str, api_key: str, shape: RequestShape
    ) -> None:
        trace.start_s = self.now_s()
        try:
            async with asyncio.timeout(self._timeout_s):
                await self._gateways[gateway_url].serve(trace, self._tenant_of[api_key], shape)
        except TimeoutError:
            trace.fail(self.now_s(), f"no complete answer within {self._timeout_s:g} s")
        except asyncio.CancelledError:
            trace.status = RequestStatus.CANCELLED
            trace.end_s = self.now_s()
            raise


def simulate_run(
    scenario: Scenario,
    run: PolicyRun,
    *,
    warmup_s: float,
    steady_s: float,
    overrides: dict[str, Any] | None = None,
    settings: TwinSettings | None = None,
    schedule: Mapping[str, Sequence[ScheduledRequest]] | None = None,
) -> tuple[RunResult, TwinStats]:
    """Run `run` of `scenario` in virtual time; the bench's RunResult and the twin's stats.

    schedule: every tenant's sends, instead of its arrival process (a replayed request log:
    slotshift_tools/twin/replay.py), as `LoadGenerator` takes it; a send at or past warmup_s +
    steady_s is not sent."""
    settings = settings or TwinSettings()
    config = run_config(scenario, run, dict(overrides or {}))
    clock = VirtualClock()
    cpu_before = time.process_time()
    result, engine = run_virtual(
        _simulate(scenario, run, config, clock, warmup_s, steady_s, settings, schedule), clock
    )
    return result, twin_stats(cpu_before, clock, [engine])


def twin_stats(cpu_before: float, clock: VirtualClock, engines: Iterable[TwinEngine]) -> TwinStats:
    """What a run cost: CPU since `cpu_before` (process time), virtual time, the engines' steps."""
    ran = list(engines)
    return TwinStats(
        cpu_s=time.process_time() - cpu_before,
        simulated_s=clock.now_s,
        engine_steps=sum(e.core.steps_total for e in ran),
        jumped_steps=sum(e.jumped_steps for e in ran),
    )


async def _simulate(
    scenario: Scenario,
    run: PolicyRun,
    config: SlotshiftConfig,
    clock: VirtualClock,
    warmup_s: float,
    steady_s: float,
    settings: TwinSettings,
    schedule: Mapping[str, Sequence[ScheduledRequest]] | None,
) -> tuple[RunResult, TwinEngine]:
    loop = asyncio.get_running_loop()
    assert isinstance(loop, VirtualEventLoop)
    pool = config.pools[0]
    transit_s = settings.transit_ms / 1000.0
    engine = TwinEngine(config.engine_sim, loop, closed_form=settings.closed_form)
    origin_s = settings.load_starts_after_s
    controlplane = TwinControlPlane(config, clock=clock)
    urls = [f"twin://gateway-{index}" for index in range(scenario.gateways)]
    gateways: dict[str, TwinGateway] = {}
    streams: dict[str, GatewayStream] = {}
    for index in range(scenario.gateways):
        gateway_id = f"gateway-{index}"
        gateways[gateway_id] = TwinGateway(
            gateway_id, pool, config.gateway, clock=clock, engine=engine, origin_s=origin_s
        )
        streams[gateway_id] = GatewayStream(transit_s)
    baseline = run.policy == POOL_BASELINE
    tenant_of = {
        reveal(k): (POOL_BASELINE if baseline else t.name)
        for t in scenario.tenants
        for k in t.api_keys
    }
    horizon_s = warmup_s + steady_s
    client = _Client(
        clock,
        origin_s,
        {url: gateways[f"gateway-{i}"] for i, url in enumerate(urls)},
        tenant_of,
        scenario.request_timeout_s,
    )
    load = LoadGenerator(scenario, client, urls, horizon_s=horizon_s, schedule=schedule)
    samples: list[Sample] = []

    async def sample() -> None:
        while True:
            samples.append(_sample(clock, origin_s, controlplane, engine, gateways, load))
            await asyncio.sleep(scenario.sample_interval_s)

    async def start_load() -> None:
        await asyncio.sleep(origin_s)
        await load.run()

    processes: dict[str, Coroutine[Any, Any, None]] = {
        "engine": engine.run(),
        **controlplane.processes(),
        **{f"controlplane-stream/{g}": controlplane.serve(streams[g]) for g in gateways},
        **{
            f"control-stream/{g}": gw.control_stream(streams[g].gateway_end)
            for g, gw in gateways.items()
        },
    }
    processes["load"] = start_load()
    processes["sampler"] = _after(origin_s, sample)
    await run_until(processes, origin_s + horizon_s, clock)
    wall_origin = clock.wall() - clock.monotonic() + origin_s
    result = RunResult(
        run=run,
        config=config,
        stack_tenants=stack_tenants(scenario, run),
        model=config.engine_sim.model_name or engine.core.profile.model_name,
        window=Window(warmup_s, horizon_s),
        window_wall_s=(wall_origin + warmup_s, wall_origin + horizon_s),
        traces=load.traces,
        samples=samples,
        decisions=list(controlplane.decisions),
        harness={"loop_lag_p99_ms": None, "loop_lag_max_ms": None},
    )
    return result, engine


_DISCONNECT_LOGGER = "controlplane.pool_state"
"""Warns of every gateway whose stream ends: in the twin, each one at the end of each run."""


@contextlib.contextmanager
def _silenced(name: str) -> Iterator[None]:
    """Drop the records of logger `name` while the block runs (the twin's run is single-threaded:
    nothing else logs there meanwhile)."""
    silence = _Silence()
    logger = logging.getLogger(name)
    logger.addFilter(silence)
    try:
        yield
    finally:
        logger.removeFilter(silence)


class _Silence(logging.Filter):
    def filter(self, record: logging.LogRecord) -> bool:
        return False


async def run_until(
    processes: dict[str, Coroutine[Any, Any, None]], horizon_s: float, clock: VirtualClock
) -> None:
    """Run every process (by name) as a task of one group until `horizon_s` on `clock`, then
    cancel them all at once; a process that fails before ends the group with its error."""
    async with asyncio.TaskGroup() as group:
        tasks = [group.create_task(c, name=f"twin/{name}") for name, c in processes.items()]
        await asyncio.sleep(horizon_s - clock.monotonic())
        with _silenced(_DISCONNECT_LOGGER):
            for task in tasks:
                task.cancel()
            await asyncio.wait(tasks)


async def _after(delay_s: float, process: Callable[[], Coroutine[Any, Any, None]]) -> None:
    await asyncio.sleep(delay_s)
    await process()


def _sample(
    clock: VirtualClock,
    origin_s: float,
    controlplane: TwinControlPlane,
    engine: TwinEngine,
    gateways: dict[str, TwinGateway],
    load: LoadGenerator,
) -> Sample:
    """What the bench's sampler reads, read from the twin at this instant."""
    t_s = clock.monotonic() - origin_s
    state = controlplane.state
    loads = state.snapshot().tenants
    core = engine.core
    waste: dict[str, dict[str, float]] = {}
    for gateway in gateways.values():
        for name, tenant in gateway.state.tenants.items():
            kinds = waste.setdefault(name, {"discarded_output": 0.0, "recomputed_prompt": 0.0})
            kinds["discarded_output"] += tenant.discarded_output_tokens_total
            kinds["recomputed_prompt"] += tenant.recomputed_prompt_tokens_total
    return Sample(
        t_s=t_s,
        wall_s=clock.wall(),
        version=state.allocation.version,
        limits=dict(state.allocation.tenant_limits),
        granted=controlplane.granted(),
        in_flight={name: load_.in_flight for name, load_ in loads.items()},
        queued={name: load_.queued for name, load_ in loads.items()},
        outstanding={name: c.outstanding for name, c in load.counters.items()},
        completed={name: c.completed for name, c in load.counters.items()},
        engine_running=float(core.num_running),
        engine_waiting=float(core.num_waiting),
        kv_cache_usage=core.kv_cache_usage,
        engine_generation_tokens=float(engine.generation_tokens_total),
        engine_prefix_cache_queries=float(core.prefix_cache_queries_total),
        engine_prefix_cache_hits=float(core.prefix_cache_hits_total),
        engine_read_s=t_s,
        gateway_waste_tokens=waste,
        gateway_read_s=t_s,
        gpu_utilization_pct=engine.gpu_utilization_pct(),
        gpu_emulated=True,
    )
