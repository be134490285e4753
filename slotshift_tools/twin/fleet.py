"""A fleet scenario's run in the twin: several servers behind one gateway fleet.

What runs is the fleet the production services make of the stack's config
(stack_config.fleet_config_data): one EngineCore per pool (the pool's profile, model name and
engine_overrides), the production ControlPlane with every pool (twin/controlplane.py), and
gateways that front every pool, each with one GatewayState and one ControlSession per pool
(twin/gateway.py's TwinGateway, one per pool) on its own in-memory stream. A request goes where
the production router sends it: `admission_gateway.routing.route`, looked up on its module at
every request, over fronts built from the gateway's GatewayStates as the proxy's PoolFront
builds them (GatewayState.room, the one room computation both use; an engine of the twin is
never unreachable, so every front is available), with the gateway's count of routed requests
as the turn. The load is the bench's LoadGenerator, each tenant's requests naming its model.

Budgets: each engine's `EngineCore.peak_in_engine` (an exact high-water mark of its running
plus waiting requests) is its pool's in-flight peak, kept with the run.

Replica capacity (`replica_capacity`): what a replica completes per second when held at its
budget, the engine alone on the run's own mix of the model's requests; the share each replica
of a model should complete if requests follow the room.
"""

from __future__ import annotations

import asyncio
import random
import time
from collections.abc import Coroutine, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from admission_gateway import routing
from admission_gateway.gateway_state import GatewayState
from engine_sim.engine_core import EngineCore, RequestSpec
from slotshift.config import (
    EngineSimConfig,
    PoolConfig,
    SlotshiftConfig,
    apply_overrides,
    parse_config,
    reveal,
)
from slotshift_tools.bench.arrivals import PROMPT_TOKEN_ID_RANGE, RequestShape, uniform_ids
from slotshift_tools.bench.fleet import FleetRunResult, PoolRun, replica_groups
from slotshift_tools.bench.load import LoadGenerator
from slotshift_tools.bench.runner import RunResult
from slotshift_tools.bench.sampler import Sample
from slotshift_tools.bench.scenario import POOL_BASELINE, PolicyRun, Scenario
from slotshift_tools.bench.stack_config import (
    StackPorts,
    fleet_config_data,
    merged_overrides,
    stack_tenants,
)
from slotshift_tools.bench.stats import Window
from slotshift_tools.bench.trace import RequestStatus, RequestTrace
from slotshift_tools.twin.controlplane import TwinControlPlane
from slotshift_tools.twin.engine import TwinEngine
from slotshift_tools.twin.gateway import TwinGateway
from slotshift_tools.twin.run import (
    _PORTS,
    TwinStats,
    _after,
    _Client,
    run_until,
    twin_stats,
)
from slotshift_tools.twin.settings import TwinSettings
from slotshift_tools.twin.stream import GatewayStream
from slotshift_tools.twin.virtual_loop import VirtualClock, VirtualEventLoop, run_virtual


def fleet_run_config(
    scenario: Scenario, run: PolicyRun, overrides: Mapping[str, Any]
) -> SlotshiftConfig:
    """The fleet's effective config for `run`: fleet_config_data with the scenario's, the
    run's and the command line's overrides applied."""
    ports = StackPorts(**{**_PORTS.__dict__, "gateways": tuple(range(10, 10 + scenario.gateways))})
    config = parse_config(fleet_config_data(scenario, run, ports), source=f"<twin {run.name}>")
    merged = merged_overrides(scenario, run, overrides)
    return apply_overrides(config, merged) if merged else config


def pool_engine_configs(scenario: Scenario, config: SlotshiftConfig) -> dict[str, EngineSimConfig]:
    """pool -> its engine's config: the stack's engine_sim section with the pool's profile,
    first model and engine_overrides."""
    return {pool.name: pool.engine_config(config.engine_sim) for pool in scenario.pools}


class _Front:
    """routing.Front over one pool's GatewayState, as admission_gateway.proxy.PoolFront is: the
    pool's name and models, the tenant's room there (GatewayState.room). Always available: the
    twin's engines cannot be unreachable."""

    __slots__ = ("_state", "models")

    def __init__(self, state: GatewayState, models: Sequence[str]) -> None:
        self._state = state
        self.models = tuple(models)

    @property
    def name(self) -> str:
        return self._state.pool_name

    @property
    def available(self) -> bool:
        return True

    def room(self, tenant: str) -> tuple[int, int] | None:
        return self._state.room(tenant)


@dataclass
class _PoolCounters:
    """One pool's requests as the clients see them, per scenario tenant (for its samples)."""

    outstanding: dict[str, int] = field(default_factory=dict)
    completed: dict[str, int] = field(default_factory=dict)


class TwinFleetGateway:
    """One gateway replica fronting every pool of the fleet: a TwinGateway per pool (its
    GatewayState and ControlSession, one control stream each, all under this gateway's id) and
    the production router in front of them."""

    def __init__(
        self,
        gateway_id: str,
        pools: Sequence[PoolConfig],
        gateways: Mapping[str, TwinGateway],
        model_of: Mapping[str, str | None],
        counters: Mapping[str, _PoolCounters],
        clock: VirtualClock,
        origin_s: float,
    ) -> None:
        """gateways: pool -> this gateway's TwinGateway there; model_of: scenario tenant -> the
        model its requests name; counters: pool -> the fleet's per-pool client counts."""
        self.gateway_id = gateway_id
        self.pools = dict(gateways)
        self._fronts = [_Front(gateways[p.name].state, p.models) for p in pools]
        self._model_of = model_of
        self._counters = counters
        self._clock = clock
        self._origin_s = origin_s
        self._turn = 0
        """Requests routed so far: replicas tied on room take turns by it (as the proxy)."""

    async def serve(self, trace: RequestTrace, tenant_name: str, shape: RequestShape) -> None:
        """Route the request of stack tenant `tenant_name` (trace.tenant sent it) as the proxy
        does, then serve it in the chosen pool; a routing refusal fails it with the proxy's
        status (404 model_not_found, 400 missing_model)."""
        self._turn += 1
        try:
            # Looked up on the module at every request: the production router, and whatever a
            # test puts in its place.
            routed = routing.route(
                self._fronts, tenant_name, self._model_of[trace.tenant], self._turn
            )
        except routing.RoutingError as exc:
            status = 404 if isinstance(exc, routing.ModelNotFound) else 400
            trace.fail(self._clock.monotonic() - self._origin_s, f"HTTP {status}: {exc}", status)
            return
        trace.pool = routed.pool
        counters = self._counters[routed.pool]
        tenant = trace.tenant
        counters.outstanding[tenant] = counters.outstanding.get(tenant, 0) + 1
        try:
            await self.pools[routed.pool].serve(trace, tenant_name, shape)
        finally:
            counters.outstanding[tenant] -= 1
            if trace.status is RequestStatus.OK:
                counters.completed[tenant] = counters.completed.get(tenant, 0) + 1


def simulate_fleet_run(
    scenario: Scenario,
    run: PolicyRun,
    *,
    warmup_s: float,
    steady_s: float,
    overrides: dict[str, Any] | None = None,
    settings: TwinSettings | None = None,
) -> tuple[FleetRunResult, TwinStats]:
    """Run `run` of fleet scenario `scenario` in virtual time: the fleet's RunResult, each
    pool's, the engines' peaks and the replicas' capacities; and the twin's stats (engine steps
    summed over the engines; capacities are measured after, outside the run's CPU time)."""
    if not scenario.fleet:
        raise ValueError(f"scenario {scenario.name} is not a fleet (it sets no pools)")
    settings = settings or TwinSettings()
    config = fleet_run_config(scenario, run, dict(overrides or {}))
    clock = VirtualClock()
    cpu_before = time.process_time()
    result, engines = run_virtual(
        _simulate(scenario, run, config, clock, warmup_s, steady_s, settings), clock
    )
    return result, twin_stats(cpu_before, clock, engines.values())


async def _simulate(
    scenario: Scenario,
    run: PolicyRun,
    config: SlotshiftConfig,
    clock: VirtualClock,
    warmup_s: float,
    steady_s: float,
    settings: TwinSettings,
) -> tuple[FleetRunResult, dict[str, TwinEngine]]:
    loop = asyncio.get_running_loop()
    assert isinstance(loop, VirtualEventLoop)
    transit_s = settings.transit_ms / 1000.0
    origin_s = settings.load_starts_after_s
    engine_configs = pool_engine_configs(scenario, config)
    engines = {
        name: TwinEngine(engine, loop, closed_form=settings.closed_form)
        for name, engine in engine_configs.items()
    }
    pools = config.fronted_pools()
    controlplane = TwinControlPlane(config, clock=clock)
    counters = {p.name: _PoolCounters() for p in pools}
    model_of = {t.name: scenario.model_of(t) for t in scenario.tenants}
    gateways: dict[str, TwinFleetGateway] = {}
    streams: dict[tuple[str, str], GatewayStream] = {}
    for index in range(scenario.gateways):
        gateway_id = f"gateway-{index}"
        per_pool = {
            p.name: TwinGateway(
                gateway_id,
                p,
                config.gateway,
                clock=clock,
                engine=engines[p.name],
                origin_s=origin_s,
            )
            for p in pools
        }
        for p in pools:
            streams[(gateway_id, p.name)] = GatewayStream(transit_s)
        gateways[gateway_id] = TwinFleetGateway(
            gateway_id, pools, per_pool, model_of, counters, clock, origin_s
        )
    baseline = run.policy == POOL_BASELINE
    tenant_of = {
        reveal(k): (POOL_BASELINE if baseline else t.name)
        for t in scenario.tenants
        for k in t.api_keys
    }
    urls = [f"twin://{g}" for g in gateways]
    horizon_s = warmup_s + steady_s
    client = _Client(
        clock,
        origin_s,
        {url: gateways[url.removeprefix("twin://")] for url in urls},
        tenant_of,
        scenario.request_timeout_s,
    )
    load = LoadGenerator(scenario, client, urls, horizon_s=horizon_s)
    samples: dict[str, list[Sample]] = {p.name: [] for p in pools}

    async def sample() -> None:
        while True:
            for pool in pools:
                samples[pool.name].append(
                    _pool_sample(
                        clock,
                        origin_s,
                        controlplane,
                        pool.name,
                        engines[pool.name],
                        [g.pools[pool.name] for g in gateways.values()],
                        counters[pool.name],
                    )
                )
            await asyncio.sleep(scenario.sample_interval_s)

    async def start_load() -> None:
        await asyncio.sleep(origin_s)
        await load.run()

    processes: dict[str, Coroutine[Any, Any, None]] = {
        **{f"engine/{name}": engine.run() for name, engine in engines.items()},
        **controlplane.processes(),
        **{
            f"controlplane-stream/{g}/{p}": controlplane.serve(stream)
            for (g, p), stream in streams.items()
        },
        **{
            f"control-stream/{g}/{p}": gateways[g].pools[p].control_stream(stream.gateway_end)
            for (g, p), stream in streams.items()
        },
    }
    processes["load"] = start_load()
    processes["sampler"] = _after(origin_s, sample)
    await run_until(processes, origin_s + horizon_s, clock)
    wall_origin = clock.wall() - clock.monotonic() + origin_s
    window = Window(warmup_s, horizon_s)
    window_wall_s = (wall_origin + warmup_s, wall_origin + horizon_s)
    pool_runs: dict[str, PoolRun] = {}
    for pool in pools:
        engine_config = engine_configs[pool.name]
        pool_config = config.model_copy(update={"pools": [pool], "engine_sim": engine_config})
        pool_runs[pool.name] = PoolRun(
            result=RunResult(
                run=run,
                config=pool_config,
                stack_tenants=stack_tenants(scenario, run, pool.name),
                model=pool.models[0],
                window=window,
                window_wall_s=window_wall_s,
                traces=[t for t in load.traces if t.pool == pool.name],
                samples=samples[pool.name],
                decisions=list(controlplane.decisions_of[pool.name]),
                harness={"loop_lag_p99_ms": None, "loop_lag_max_ms": None},
            ),
            budget_slots=pool.budget_slots,
            engine_in_flight_peak=engines[pool.name].core.peak_in_engine,
        )
    fleet = RunResult(
        run=run,
        config=config,
        stack_tenants=stack_tenants(scenario, run),
        model="+".join(sorted({m for p in pools for m in p.models[:1]})),
        window=window,
        window_wall_s=window_wall_s,
        traces=load.traces,
        samples=_fleet_samples(samples),
        decisions=[],
        harness={"loop_lag_p99_ms": None, "loop_lag_max_ms": None},
    )
    return FleetRunResult(fleet=fleet, pools=pool_runs), engines


def _pool_sample(
    clock: VirtualClock,
    origin_s: float,
    controlplane: TwinControlPlane,
    pool: str,
    engine: TwinEngine,
    gateways: Sequence[TwinGateway],
    counters: _PoolCounters,
) -> Sample:
    """What the bench's sampler would read of one pool at this instant."""
    t_s = clock.monotonic() - origin_s
    state = controlplane.states[pool]
    loads = state.snapshot().tenants
    core = engine.core
    waste: dict[str, dict[str, float]] = {}
    for gateway in gateways:
        for name, tenant in gateway.state.tenants.items():
            kinds = waste.setdefault(name, {"discarded_output": 0.0, "recomputed_prompt": 0.0})
            kinds["discarded_output"] += tenant.discarded_output_tokens_total
            kinds["recomputed_prompt"] += tenant.recomputed_prompt_tokens_total
    return Sample(
        t_s=t_s,
        wall_s=clock.wall(),
        version=state.allocation.version,
        limits=dict(state.allocation.tenant_limits),
        granted=controlplane.granted(pool),
        in_flight={name: load_.in_flight for name, load_ in loads.items()},
        queued={name: load_.queued for name, load_ in loads.items()},
        outstanding=dict(counters.outstanding),
        completed=dict(counters.completed),
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


def _fleet_samples(samples: Mapping[str, Sequence[Sample]]) -> list[Sample]:
    """The fleet's samples: the pools' samples of each instant combined. Per tenant, limits,
    grants, in flight, queued and waste are summed over the pools (a tenant's fleet-wide
    figures); the engines' counters and running and waiting are summed, KV usage and GPU
    utilisation averaged over the engines; the version is the sum of the pools' (it moves when
    any does). Outstanding and completed are the pools' sums (a request refused before it is
    routed is in no pool's)."""
    per_instant = list(zip(*samples.values(), strict=True))
    combined: list[Sample] = []
    for instant in per_instant:
        first = instant[0]
        waste: dict[str, dict[str, float]] = {}
        for sample in instant:
            for tenant, kinds in (sample.gateway_waste_tokens or {}).items():
                into = waste.setdefault(tenant, dict.fromkeys(kinds, 0.0))
                for kind, tokens in kinds.items():
                    into[kind] = into.get(kind, 0.0) + tokens
        combined.append(
            Sample(
                t_s=first.t_s,
                wall_s=first.wall_s,
                version=sum(s.version or 0 for s in instant),
                limits=_summed(s.limits for s in instant),
                granted=_summed(s.granted for s in instant),
                in_flight=_summed(s.in_flight for s in instant),
                queued=_summed(s.queued for s in instant),
                outstanding=_summed(s.outstanding for s in instant),
                completed=_summed(s.completed for s in instant),
                engine_running=sum(s.engine_running or 0.0 for s in instant),
                engine_waiting=sum(s.engine_waiting or 0.0 for s in instant),
                kv_cache_usage=_mean_of(s.kv_cache_usage for s in instant),
                engine_generation_tokens=sum(s.engine_generation_tokens or 0.0 for s in instant),
                engine_prefix_cache_queries=sum(
                    s.engine_prefix_cache_queries or 0.0 for s in instant
                ),
                engine_prefix_cache_hits=sum(s.engine_prefix_cache_hits or 0.0 for s in instant),
                engine_read_s=first.engine_read_s,
                gateway_waste_tokens=waste,
                gateway_read_s=first.gateway_read_s,
                gpu_utilization_pct=_mean_of(s.gpu_utilization_pct for s in instant),
                gpu_emulated=True,
            )
        )
    return combined


def _summed(maps: Any) -> dict[str, int]:
    total: dict[str, int] = {}
    for mapping in maps:
        for key, value in mapping.items():
            total[key] = total.get(key, 0) + value
    return total


def _mean_of(values: Any) -> float | None:
    present = [v for v in values if v is not None]
    return sum(present) / len(present) if present else None


def replica_capacity(
    engine: EngineSimConfig,
    budget_slots: int,
    lengths: Sequence[tuple[int, int]],
    *,
    seed: int,
    warmup_s: float = 5.0,
    measured_s: float = 30.0,
) -> float:
    """Requests per second the engine of `engine` completes when held at `budget_slots`
    requests (each that ends replaced at once by the next), the n-th request having the n-th
    (prompt tokens, output tokens) of `lengths` (cycled), with random prompts drawn from `seed`;
    counted over `measured_s` after `warmup_s`. The engine alone, stepping as the twin does
    (decode-only stretches at once), on a clock of its own. ValueError without lengths."""
    if not lengths:
        raise ValueError("no request lengths to hold the engine at")
    rng = random.Random(seed)
    core = EngineCore(engine)
    low, high = PROMPT_TOKEN_ID_RANGE
    now_s = 0.0
    sent = 0
    completed = 0
    end_s = warmup_s + measured_s

    def add() -> None:
        nonlocal sent
        prompt, output = lengths[sent % len(lengths)]
        spec = RequestSpec(
            f"capacity-{sent}", tuple(uniform_ids(rng, low, high, prompt)), output, ignore_eos=True
        )
        core.add_request(spec, now_s)
        sent += 1

    for _ in range(budget_slots):
        add()
    while now_s < end_s:
        run = core.advance_decodes(now_s, end_s)
        if run is not None:
            now_s = run.ends_s[-1]
            finished = run.finished
        else:
            step = core.schedule(now_s)
            now_s += step.duration_s
            finished = core.complete(step, now_s).finished
        for _ in finished:
            if warmup_s <= now_s < end_s:
                completed += 1
            add()
    return completed / measured_s


def replica_capacities(scenario: Scenario, result: FleetRunResult) -> dict[str, float]:
    """pool -> replica_capacity of each pool whose model other pools also serve, on the mix
    of that model's requests completed in the run's window (in completion order)."""
    capacities: dict[str, float] = {}
    window = result.fleet.window
    engines = {p.name: p for p in scenario.pools}
    for replicas in replica_groups(scenario).values():
        done = sorted(
            (
                t
                for name in replicas
                for t in result.pools[name].result.traces
                if t.status is RequestStatus.OK and t.end_s is not None and window.holds(t.end_s)
            ),
            key=lambda t: t.end_s or 0.0,
        )
        lengths = [(t.prompt_tokens, t.max_tokens) for t in done]
        if not lengths:
            continue
        for name in replicas:
            engine = result.pools[name].result.config.engine_sim
            capacities[name] = replica_capacity(
                engine, engines[name].budget_slots, lengths, seed=scenario.seed
            )
    return capacities
