"""The frontier F(a): the most total output throughput a schedule of per-tenant limits under the
budget can reach while every tenant's SLO attainment is at least a; a feasible schedule found by
search, and an upper bound no schedule can beat.

**The oracle.** A discrete-event loop of its own (no control plane, no gateways) drives the
emulator's EngineCore with the scenario's load exactly as the bench draws it: the same seeded
open-loop send times (`arrival_times`), closed-loop clients that send again as soon as an answer
ends while their process is on, and each tenant's n-th request getting the n-th draw of its
`RequestShapes`. Each tenant has one FIFO queue; a request enters the engine when its tenant
holds fewer requests there than its limit and the engine holds fewer than the budget. Limits
switch at once. With pausing, a tenant under its limit that the budget blocks pauses the
youngest request of a preemptible tenant above its own limit (borrowed work): the request leaves
the engine and continues later, at the head of its queue, with its prompt plus what it
generated, as the twin's gateway resumes it. Without pausing, lent slots come back as borrowed
requests end. The engine jumps over decode-only stretches (EngineCore.advance_decodes) up to the
next event, as the twin does.

**Feasible schedules** (`candidate_schedules`): static splits, and "forecast plus headroom"
schedules: an interactive tenant (open loop, or a closed loop that switches on and off) is given
max(its outstanding requests, the most of its requests the known arrivals will have in flight
at once within the next `lookahead_s`) + `headroom_slots`, within its floor and ceiling; the
always-on closed-loop tenants share the rest by weight. Every candidate is simulated exactly;
F(a) is the best throughput among candidates whose minimum attainment is >= a.

**The lender-safe frontier F_safe(a)**: the same, among the candidates that are lender-safe
(`is_lender_safe`): every tenant's SLO goodput (requests meeting its objectives per second, the
bench's request_goodput) is at least `LENDER_SAFE_RATIO` of what the nominal static split gives
it. Attainment alone cannot see a closed-loop tenant made slower: its requests still meet their
objectives, there are just fewer of them, and the slots they would have held serve the batch
tenant. F(a) therefore rewards slowing a lender down, which is what the product promises not to
do ("lend my idle capacity, and give it back the moment I need it"); F_safe(a) is the frontier
of the schedules that keep that promise.

**The upper bound** (`throughput_bound`), on the output tokens of the requests that end inside
the steady window W = [s, e] (the bench's output_throughput x |W|) under ANY schedule:

1. A counted request either produced a token before s (carry-in) or produced all its tokens in
   steps that end inside W. Carry-in requests were alive at s: in the engine (at most `budget`)
   or, with pausing, paused (only preemptible tenants' requests, at most a closed-loop tenant's
   clients or an open-loop tenant's arrivals before s). Their tokens are bounded by filling that
   many requests, per tenant within its count, with its longest output.
2. The rest is bounded by a linear programme over the engine's step-time model. The steps that
   end inside a segment g of W (W cut where an on/off closed-loop tenant switches) take at most
   the segment's length plus one step (the one that straddles its start); a step costs
   base + per_seq x entries + per_context x context + per_prefill x prefill tokens, holds at most
   `budget` sequences (the engine never holds more than the budget) and at most a closed-loop
   tenant's current clients of that tenant. A request of P prompt tokens and o output tokens
   produced entirely in W costs at least per_seq x o + per_context x (oP + o(o-1)/2) +
   per_prefill x P (its k-th token is computed at context P + k - 1; its prompt once, as prompts
   are random ids that share no cached block), so per token at least its tenant's cheapest
   average c_t over the tenant's shapes, and each token at least per_seq + per_context x P_min
   (c_min). The LP: variables K_g (steps in segment g), y_tg (tokens of closed-loop tenant t
   there), z_t (tokens of open-loop tenant t); constraints y_tg <= clients_tg K_g (an off
   segment: y_tg <= clients x longest output, what is still outstanding), sum_t y_tg <= budget
   K_g, base K_g + sum_t c_min_t y_tg <= |g| + one step, sum y + sum z <= budget sum K,
   base sum K + sum c_t y + sum c_t z <= |W| + one step, z_t <= the open-loop tenant's offered
   tokens (every request sent before e). Maximise sum y + sum z. It is solved by a small simplex
   and the bound taken from the dual solution (weak duality: any dual-feasible point bounds the
   LP, so float error in the pivoting cannot make the bound invalid).

The bound does not depend on a: requests that must be served to reach a would occupy slots and
time, but in every shipped scenario the interactive tenants' tokens are cheaper than the batch
tenant's, so forcing them in never lowers the LP's optimum; the bound is stated for a = 0 and
holds for every a. It is loose where the window's edges are: a schedule could start the window
with every slot (and every paused request) a token short of its end, which term 1 must allow.
`FrontierBound` reports the two terms apart.

**Averaged over window offsets** (`FrontierProblem.window_offsets_s`). The bench's
output_throughput counts a request by its end, with all its tokens, so with long answers and
cohorts of requests that start together (saturating-7b: 512-token answers of about 11 s, every
closed-loop client sending at t = 0) one window catches a cohort's ends that a window a few
seconds later misses: a candidate's figure swings by several percent with the window's offset,
and F, a maximum over some 250 candidates, picks the luckiest. So each candidate (and each
policy's twin run) is simulated once, to the end of the last window, and scored on K windows of
the same length whose starts are the warm-up plus each offset: its output throughput, each
tenant's attainment and each tenant's goodput are the means over the windows
(`mean_figures`); F(a) is the best mean throughput among the candidates whose lowest mean
attainment is >= a, and lender safety compares mean goodputs. The bound is the mean of the
windows' bounds (each bounds its window's throughput under any schedule, so their mean bounds
the mean). One offset (0) is the single window of the bench, figure for figure.
"""

from __future__ import annotations

import bisect
import itertools
import math
import time
from collections import deque
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from engine_sim.engine_core import EngineCore, FinishedRequest, RequestSpec, StepOutcome
from engine_sim.profiles import EngineProfile, effective_profile
from engine_sim.tokens import reference_output_ids
from slotshift.apportion import nominal_shares
from slotshift.config import EngineSimConfig, PoolConfig, apply_overrides, parse_config
from slotshift_tools.bench.arrivals import (
    RequestShapes,
    arrival_times,
    concurrency_at,
    is_open_loop,
    max_concurrency,
    next_on_start,
    on_windows,
    tenant_rng,
)
from slotshift_tools.bench.scenario import (
    BenchTenant,
    ClosedLoopArrival,
    OnOffArrival,
    PolicyRun,
    Scenario,
    TokenCount,
    TokenRange,
)
from slotshift_tools.bench.stack_config import StackPorts, merged_overrides, stack_config_data
from slotshift_tools.bench.stats import SloLike, Window, is_good, summarise
from slotshift_tools.bench.trace import RequestStatus, RequestTrace

LENDER_SAFE_RATIO = 0.99
"""A schedule is lender-safe when every tenant's SLO goodput is at least this share of the
nominal static split's (issue 12's lender goal: the lender's goodput >= 0.99x static's)."""

DEFAULT_LEVELS = (0.5, 0.6, 0.7, 0.8, 0.85, 0.9, 0.95, 0.97, 0.99, 1.0)
"""The attainments F is reported at by default."""

DEFAULT_WINDOW_OFFSETS = 8
"""Windows a candidate is scored on by default (see `window_offsets`)."""

DEFAULT_WINDOW_STEP_S = 2.0
"""Seconds between the default windows' starts. With 8 windows the starts span 14 s (16 s of
phase in 2 s steps): more than the longest answer of any shipped scenario (saturating-7b's, up
to 576 tokens, 11-13 s in a full batch), whose cohorts' ends are what one window catches or
misses, at 20% more simulated time on a 70 s run. On saturating-7b the mean still moves by
about 1% when every window starts 1 s later (docs/results/frontier.md)."""


def window_offsets(count: int, step_s: float = DEFAULT_WINDOW_STEP_S) -> tuple[float, ...]:
    """`count` window offsets from the warm-up's end, `step_s` apart, the first 0 (one offset:
    the bench's single window); ValueError for a count below 1 or a step not positive."""
    if count < 1:
        raise ValueError(f"the number of windows must be at least 1, not {count}")
    if count > 1 and not step_s > 0:
        raise ValueError(f"the windows' step must be positive, not {step_s:g} s")
    return tuple(k * step_s for k in range(count))


_PORTS = StackPorts(
    engine=1, controlplane=2, controlplane_metrics=3, agent_metrics=4, gateways=(10,)
)
"""Placeholder ports: the oracle starts nothing, but the stack's config names them."""


# --- attainment: one definition for the oracle and the policies ----------------------------


def overdue(trace: RequestTrace, slo: SloLike, at_s: float) -> bool:
    """Whether a request still unanswered at `at_s` has already missed an objective: its
    end-to-end objective has passed, or its TTFT objective has with no first token yet."""
    if trace.status in (RequestStatus.OK, RequestStatus.FAILED) and (
        trace.end_s is not None and trace.end_s <= at_s
    ):
        return False
    if slo.e2el_ms is not None and trace.start_s + slo.e2el_ms / 1000.0 < at_s:
        return True
    late_first = trace.first_token_s is None or trace.first_token_s > at_s
    return slo.ttft_ms is not None and late_first and trace.start_s + slo.ttft_ms / 1000.0 < at_s


def attainment(
    traces: Iterable[RequestTrace], window: Window, slos: Mapping[str, SloLike]
) -> dict[str, float | None]:
    """Each tenant's SLO attainment in the window: the share of its requests that meet every
    objective (`is_good`: completed, TTFT and end-to-end within the objectives), among its
    requests that count in the window (they ended inside it, done or failed, as the bench
    counts) and those still unanswered at the window's end that have already missed an
    objective (`overdue`): a schedule cannot raise its attainment by never answering. None for a
    tenant with no such request. Tenants missing from `slos` are left out."""
    good: dict[str, int] = dict.fromkeys(slos, 0)
    total: dict[str, int] = dict.fromkeys(slos, 0)
    for trace in traces:
        slo = slos.get(trace.tenant)
        if slo is None:
            continue
        if window.counts(trace):
            total[trace.tenant] += 1
            good[trace.tenant] += is_good(trace, slo)
        elif trace.start_s <= window.end_s and overdue(trace, slo, window.end_s):
            total[trace.tenant] += 1
    return {name: (good[name] / total[name] if total[name] else None) for name in slos}


def min_attainment(per_tenant: Mapping[str, float | None]) -> float:
    """The lowest attainment of the tenants that had requests (1.0 when none had)."""
    values = [v for v in per_tenant.values() if v is not None]
    return min(values) if values else 1.0


def goodput(
    traces: Iterable[RequestTrace], window: Window, slos: Mapping[str, SloLike]
) -> dict[str, float]:
    """Each tenant's SLO goodput in the window: its completed requests that count there and meet
    every objective of the tenant (`is_good`), per second of the window (the bench's
    request_goodput, per tenant). Tenants missing from `slos` are left out."""
    good: dict[str, int] = dict.fromkeys(slos, 0)
    for trace in traces:
        slo = slos.get(trace.tenant)
        if slo is not None and window.counts(trace) and is_good(trace, slo):
            good[trace.tenant] += 1
    return {name: count / window.length_s for name, count in good.items()}


def is_lender_safe(
    per_tenant: Mapping[str, float],
    static: Mapping[str, float],
    ratio: float = LENDER_SAFE_RATIO,
) -> bool:
    """Whether every tenant's goodput in `per_tenant` is at least `ratio` of its goodput in
    `static` (the nominal static split's); a tenant with none under static cannot fail."""
    return all(per_tenant.get(name, 0.0) >= ratio * value for name, value in static.items())


def output_throughput(traces: Iterable[RequestTrace], window: Window) -> float:
    """The bench's output_throughput (tokens of the completed requests that ended in the
    window, per second of it), by the bench's own `summarise`."""
    value = summarise(traces, window, {})["output_throughput"]
    assert isinstance(value, float)
    return value


@dataclass(frozen=True)
class WindowFigures:
    """What a run is scored on, in one window or as the mean over several."""

    output_throughput: float
    """Output tokens per second (`output_throughput`)."""
    attainment: dict[str, float | None]
    """Each tenant's SLO attainment (`attainment`); None for a tenant with no request that
    counts."""
    goodput: dict[str, float]
    """Each tenant's SLO goodput in requests per second (`goodput`)."""

    @property
    def min_attainment(self) -> float:
        return min_attainment(self.attainment)


def window_figures(
    traces: Sequence[RequestTrace], window: Window, slos: Mapping[str, SloLike]
) -> WindowFigures:
    """A run's figures in one window."""
    return WindowFigures(
        output_throughput=output_throughput(traces, window),
        attainment=attainment(traces, window, slos),
        goodput=goodput(traces, window, slos),
    )


def mean_figures(per_window: Sequence[WindowFigures]) -> WindowFigures:
    """The figures' means over the windows: throughput, each tenant's goodput, and each
    tenant's attainment over the windows where it had requests (None where it had none in
    any). One window's figures are returned as they are."""
    if not per_window:
        raise ValueError("no window to average over")
    if len(per_window) == 1:
        return per_window[0]
    count = len(per_window)
    tenants = per_window[0].attainment.keys()
    attained: dict[str, float | None] = {}
    for name in tenants:
        values = [f.attainment[name] for f in per_window if f.attainment[name] is not None]
        attained[name] = sum(v for v in values if v is not None) / len(values) if values else None
    return WindowFigures(
        output_throughput=sum(f.output_throughput for f in per_window) / count,
        attainment=attained,
        goodput={
            name: sum(f.goodput[name] for f in per_window) / count for name in per_window[0].goodput
        },
    )


def figures_by_window(
    traces: Sequence[RequestTrace], windows: Sequence[Window], slos: Mapping[str, SloLike]
) -> tuple[WindowFigures, ...]:
    """A run's figures in each of the windows, in order."""
    return tuple(window_figures(traces, window, slos) for window in windows)


# --- the problem -------------------------------------------------------------------------


@dataclass(frozen=True)
class FrontierProblem:
    """One scenario's frontier question: its load, pool, engine and steady window."""

    scenario: Scenario
    pool: PoolConfig
    """The pool as the stack would configure it (floors, ceilings, weights, preemptible)."""
    engine_config: EngineSimConfig
    warmup_s: float
    steady_s: float
    window_offsets_s: tuple[float, ...] = (0.0,)
    """Where the scored windows start, in seconds after the warm-up, in increasing order (see
    the module); (0.0,) is the bench's one window."""

    def __post_init__(self) -> None:
        offsets = self.window_offsets_s
        if not offsets or offsets[0] < 0 or any(b <= a for a, b in itertools.pairwise(offsets)):
            raise ValueError(f"window offsets must increase from >= 0, not {offsets}")

    @property
    def windows(self) -> tuple[Window, ...]:
        """The scored windows, each `steady_s` long."""
        return tuple(
            Window(self.warmup_s + offset, self.warmup_s + offset + self.steady_s)
            for offset in self.window_offsets_s
        )

    @property
    def window(self) -> Window:
        """The first window (the bench's)."""
        return self.windows[0]

    @property
    def horizon_s(self) -> float:
        """When the load stops sending and the run ends (the last window's end)."""
        return self.windows[-1].end_s

    @property
    def slos(self) -> dict[str, SloLike]:
        return {t.name: t.slo for t in self.scenario.tenants}


def frontier_problem(
    scenario: Scenario,
    *,
    warmup_s: float | None = None,
    steady_s: float | None = None,
    overrides: Mapping[str, Any] | None = None,
    window_offsets_s: Sequence[float] = (0.0,),
) -> FrontierProblem:
    """The problem for `scenario` with the stack's config as `slotshift bench` builds it (the
    scenario's overrides, then `overrides`), scored on the windows at `window_offsets_s`
    (`window_offsets`); ConfigError for a bad override."""
    run = PolicyRun(name="frontier", policy="static")
    config = parse_config(stack_config_data(scenario, run, _PORTS), source="<frontier>")
    merged = merged_overrides(scenario, run, dict(overrides or {}))
    if merged:
        config = apply_overrides(config, merged)
    return FrontierProblem(
        scenario=scenario,
        pool=config.pools[0],
        engine_config=config.engine_sim,
        warmup_s=scenario.warmup_s if warmup_s is None else warmup_s,
        steady_s=scenario.steady_s if steady_s is None else steady_s,
        window_offsets_s=tuple(window_offsets_s),
    )


def is_backlogged(tenant: BenchTenant) -> bool:
    """An always-on closed loop: it turns any slot it is given into work at once."""
    return isinstance(tenant.arrival, ClosedLoopArrival)


# --- schedules -------------------------------------------------------------------------


NOMINAL_STATIC = "static-nominal"
"""The candidate that is the nominal static split (the static policy without its control
plane): what lender safety is judged against."""


@dataclass(frozen=True)
class Schedule:
    """A family member: fixed limits (`static`), or forecast plus headroom (see the module)."""

    name: str
    pausing: bool
    static_limits: tuple[int, ...] | None = None
    """Per tenant, in the scenario's order; None for a forecast schedule."""
    headroom_slots: int = 0
    lookahead_s: float = 0.0
    guards_shares: bool = False
    """Every tenant holds what it asks up to its nominal share (a backlogged one its whole
    share) before any tenant gets more: the slo policy's guarantee (APF's MinCurrentCL). The
    nominal static split guards them too."""

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "pausing": self.pausing,
            "static_limits": list(self.static_limits) if self.static_limits else None,
            "headroom_slots": self.headroom_slots,
            "lookahead_s": self.lookahead_s,
            "guards_shares": self.guards_shares,
        }


def candidate_schedules(problem: FrontierProblem, *, quick: bool = False) -> list[Schedule]:
    """The searched family: the nominal static split and a grid of static splits, and forecast
    schedules over headroom x lookahead, without and with pausing (pausing only where a tenant
    is preemptible). `quick`: a small grid (tests)."""
    pool = problem.pool
    names = [t.name for t in pool.tenants]
    floors = [t.floor_slots for t in pool.tenants]
    budget = pool.budget_slots
    nominal = nominal_shares(pool)
    schedules = [
        Schedule(
            NOMINAL_STATIC,
            False,
            static_limits=tuple(nominal[n] for n in names),
            guards_shares=True,
        )
    ]
    interactive = [i for i, t in enumerate(problem.scenario.tenants) if not is_backlogged(t)]
    backlogged = [i for i, t in enumerate(problem.scenario.tenants) if is_backlogged(t)]
    if len(interactive) == 1 and backlogged:
        # Two kinds of tenant: move slots between the interactive one and the rest.
        steps = 4 if quick else 12
        index = interactive[0]
        free = budget - sum(floors)
        for k in range(steps + 1):
            limits = list(floors)
            limits[index] += round(free * k / steps)
            _give_rest(limits, backlogged, pool, budget)
            schedules.append(Schedule(f"static-{limits[index]}", False, tuple(limits)))
    headrooms = (0, 4) if quick else (0, 1, 2, 4, 8, 16)
    lookaheads = (0.0, 2.0) if quick else (0.0, 0.5, 1.0, 2.0, 4.0, 6.0, 8.0)
    for guard in (False, True):
        kind = "-guard" if guard else ""
        for h in headrooms:
            for w in lookaheads:
                schedules.append(Schedule(f"forecast{kind}-h{h}-w{w:g}", False, None, h, w, guard))
        if any(t.preemptible for t in pool.tenants):
            for h in (0, 4) if quick else (0, 1, 2, 4, 8, 16):
                for w in (0.0,) if quick else (0.0, 0.5, 2.0):
                    schedules.append(
                        Schedule(f"forecast-pause{kind}-h{h}-w{w:g}", True, None, h, w, guard)
                    )
    unique: dict[tuple[Any, ...], Schedule] = {}
    for schedule in schedules:
        key = (
            schedule.pausing,
            schedule.static_limits,
            schedule.headroom_slots,
            schedule.lookahead_s,
            # A static split is what it is, guarded or not (the nominal one comes first).
            schedule.guards_shares if schedule.static_limits is None else None,
        )
        unique.setdefault(key, schedule)
    return list(unique.values())


def _give_rest(limits: list[int], receivers: Sequence[int], pool: PoolConfig, budget: int) -> None:
    """Share what the budget has left over `limits` among `receivers`, by weight, each within
    its ceiling (in place); what no receiver may take stays unused."""
    left = budget - sum(limits)
    open_ = [i for i in receivers if _ceiling(pool, i) > limits[i]]
    while left > 0 and open_:
        weights = [pool.tenants[i].weight for i in open_]
        total = sum(weights)
        shares = [left * w / total for w in weights]
        grants = [math.floor(s) for s in shares]
        remainder = left - sum(grants)
        # Largest remainders get the slots the floors left over, ties in tenant order.
        order = sorted(range(len(open_)), key=lambda k: -(shares[k] - grants[k]))
        for k in order[:remainder]:
            grants[k] += 1
        for k, i in enumerate(open_):
            take = min(grants[k], _ceiling(pool, i) - limits[i])
            limits[i] += take
            left -= take
        open_ = [i for i in open_ if _ceiling(pool, i) > limits[i]]


def _ceiling(pool: PoolConfig, index: int) -> int:
    ceiling = pool.tenants[index].ceiling_slots
    return pool.budget_slots if ceiling is None else min(ceiling, pool.budget_slots)


class _Forecast:
    """A piecewise-constant function of time: the most requests the tenant will have in flight
    at once within [t, t + lookahead] as its known sends say (see the module)."""

    def __init__(self, breakpoints: list[float], values: list[int]) -> None:
        self.breakpoints = breakpoints
        self.values = values

    def at(self, t_s: float) -> int:
        index = bisect.bisect_right(self.breakpoints, t_s) - 1
        return self.values[index] if index >= 0 else 0

    def next_change_s(self, t_s: float) -> float:
        index = bisect.bisect_right(self.breakpoints, t_s)
        return self.breakpoints[index] if index < len(self.breakpoints) else math.inf


def _open_loop_forecast(times: list[float], duration_s: float, lookahead_s: float) -> _Forecast:
    """max over tau in [t, t + lookahead] of the sends in (tau - duration, tau]."""

    def in_flight(tau: float) -> int:
        return bisect.bisect_right(times, tau) - bisect.bisect_right(times, tau - duration_s)

    def value(t: float) -> int:
        best = in_flight(t)
        lo = bisect.bisect_left(times, t)
        hi = bisect.bisect_right(times, t + lookahead_s)
        for tau in times[lo:hi]:
            best = max(best, in_flight(tau))
        return best

    points = sorted({p for a in times for p in (a - lookahead_s, a + duration_s)})
    return _Forecast(points, [value(p) for p in points])


def _on_off_forecast(arrival: OnOffArrival, horizon_s: float, lookahead_s: float) -> _Forecast:
    """Its clients while a burst is on or starts within the lookahead, else 0."""
    concurrency = max_concurrency(arrival)
    points: list[float] = []
    values: list[int] = []
    for start, end in on_windows(arrival, horizon_s):
        begin = max(0.0, start - lookahead_s)
        if points and begin <= points[-1]:
            points.pop()  # the bursts' forecasts overlap: one span
            values.pop()
        else:
            points.append(begin)
            values.append(concurrency)
        points.append(end)
        values.append(0)
    if points and values[0] == concurrency and points[0] > 0.0:
        points.insert(0, 0.0)
        values.insert(0, 0)
    return _Forecast(points, values)


# --- the oracle's simulator ---------------------------------------------------------------


@dataclass
class _Request:
    trace: RequestTrace
    tenant: int
    prompt: tuple[int, ...]
    max_tokens: int
    client: int | None
    received: int = 0
    engine_id: str = ""
    attempts: int = 0


@dataclass
class OracleRun:
    """One schedule simulated: the request records, its figures and what the budget saw."""

    schedule: Schedule
    traces: list[RequestTrace]
    windows: tuple[Window, ...]
    per_window: tuple[WindowFigures, ...]
    """Its figures in each window, in order."""
    mean: WindowFigures
    """Their means (`mean_figures`): what the frontier compares."""
    max_in_engine: int
    """Most requests the engine held at once: never above the budget."""
    max_limits_sum: int
    """Largest sum of the limits in force: never above the budget."""
    share_shortfall_slots: int
    """Most slots a backlogged tenant's limit was ever below its nominal share (0 for the
    schedules that guard the shares)."""
    pauses: int
    cpu_s: float

    @property
    def output_throughput(self) -> float:
        """Mean output throughput over the windows."""
        return self.mean.output_throughput

    @property
    def attainment(self) -> dict[str, float | None]:
        """Each tenant's mean attainment over the windows."""
        return self.mean.attainment

    @property
    def goodput(self) -> dict[str, float]:
        """Each tenant's mean SLO goodput over the windows."""
        return self.mean.goodput

    @property
    def min_attainment(self) -> float:
        return self.mean.min_attainment

    def figures(self, window_index: int | None = None) -> WindowFigures:
        """Its figures in one window, or their means (None)."""
        return self.mean if window_index is None else self.per_window[window_index]


@dataclass
class _TenantState:
    queue: deque[_Request] = field(default_factory=deque)
    running: list[_Request] = field(default_factory=list)
    """In the engine, in admission order (the youngest last: it is paused first)."""
    paused_or_queued: int = 0


def simulate_schedule(problem: FrontierProblem, schedule: Schedule) -> OracleRun:
    """Run `schedule` against the scenario's load in the engine (see the module) and score it
    on the problem's windows; deterministic. Times are seconds from the load's start; the run
    ends at the horizon (the last window's end), where requests still unanswered are cancelled
    (as the twin's load is)."""
    started_cpu = time.process_time()
    sim = _Oracle(problem, schedule)
    sim.run()
    windows = problem.windows
    per_window = figures_by_window(sim.traces, windows, problem.slos)
    return OracleRun(
        schedule=schedule,
        traces=sim.traces,
        windows=windows,
        per_window=per_window,
        mean=mean_figures(per_window),
        max_in_engine=sim.max_in_engine,
        max_limits_sum=sim.max_limits_sum,
        share_shortfall_slots=sim.share_shortfall_slots,
        pauses=sim.pauses,
        cpu_s=time.process_time() - started_cpu,
    )


class _Oracle:
    def __init__(self, problem: FrontierProblem, schedule: Schedule) -> None:
        self.problem = problem
        self.schedule = schedule
        scenario = problem.scenario
        self.tenants = scenario.tenants
        self.budget = problem.pool.budget_slots
        self.horizon = problem.horizon_s
        self.core = EngineCore(problem.engine_config)
        self.state = [_TenantState() for _ in self.tenants]
        self.shapes = [
            RequestShapes(
                t.prompt_tokens, t.output_tokens, tenant_rng(scenario.seed, t.name, "requests")
            )
            for t in self.tenants
        ]
        self.sends: list[list[float]] = []
        for t in self.tenants:
            if is_open_loop(t.arrival):
                rng = tenant_rng(scenario.seed, t.name, "arrivals")
                self.sends.append(arrival_times(t.arrival, rng, self.horizon))
            else:
                self.sends.append([])
        self.next_send = [0] * len(self.tenants)
        self.wakeups: list[tuple[float, int, int]] = []
        """(time, tenant, client) of closed-loop clients waiting for a burst, sorted."""
        self.traces: list[RequestTrace] = []
        self.by_engine_id: dict[str, _Request] = {}
        self.in_engine = 0
        self.max_in_engine = 0
        self.max_limits_sum = 0
        self.share_shortfall_slots = 0
        self.pauses = 0
        self.interactive = [i for i, t in enumerate(self.tenants) if not is_backlogged(t)]
        self.backlogged = [i for i, t in enumerate(self.tenants) if is_backlogged(t)]
        self.floors = [t.floor_slots for t in problem.pool.tenants]
        shares = nominal_shares(problem.pool)
        self.nominal = [shares[t.name] for t in problem.pool.tenants]
        self.preemptible = [t.preemptible for t in problem.pool.tenants]
        self.forecasts: dict[int, _Forecast] = {}
        if schedule.static_limits is None:
            profile = self.core.profile
            for i in self.interactive:
                tenant = self.tenants[i]
                if is_open_loop(tenant.arrival):
                    duration = _typical_duration_s(problem, profile, tenant)
                    self.forecasts[i] = _open_loop_forecast(
                        self.sends[i], duration, schedule.lookahead_s
                    )
                else:
                    assert isinstance(tenant.arrival, OnOffArrival)
                    self.forecasts[i] = _on_off_forecast(
                        tenant.arrival, self.horizon, schedule.lookahead_s
                    )

    # --- load ---

    def _send(self, tenant: int, now: float, client: int | None) -> None:
        shape = self.shapes[tenant].next()
        trace = RequestTrace(
            tenant=self.tenants[tenant].name,
            gateway=0,
            prompt_tokens=len(shape.prompt_token_ids),
            max_tokens=shape.max_tokens,
            start_s=now,
        )
        self.traces.append(trace)
        request = _Request(trace, tenant, tuple(shape.prompt_token_ids), shape.max_tokens, client)
        self.state[tenant].queue.append(request)
        self.state[tenant].paused_or_queued += 1

    def _client_ready(self, tenant: int, client: int, now: float) -> None:
        """A closed-loop client is free at `now`: it sends, or waits for its next burst."""
        if now >= self.horizon:
            return
        arrival = self.tenants[tenant].arrival
        assert isinstance(arrival, ClosedLoopArrival | OnOffArrival)
        if concurrency_at(arrival, now) > client:
            self._send(tenant, now, client)
            return
        assert isinstance(arrival, OnOffArrival)
        wake = min(next_on_start(arrival, now), self.horizon)
        if wake < self.horizon:
            bisect.insort(self.wakeups, (wake, tenant, client))

    def _due(self, now: float) -> None:
        for tenant, sends in enumerate(self.sends):
            while self.next_send[tenant] < len(sends) and sends[self.next_send[tenant]] <= now:
                self._send(tenant, sends[self.next_send[tenant]], None)
                self.next_send[tenant] += 1
        while self.wakeups and self.wakeups[0][0] <= now:
            wake, tenant, client = self.wakeups.pop(0)
            self._client_ready(tenant, client, wake)

    def _next_event(self, now: float) -> float:
        nxt = self.horizon
        for tenant, sends in enumerate(self.sends):
            if self.next_send[tenant] < len(sends):
                nxt = min(nxt, sends[self.next_send[tenant]])
        if self.wakeups:
            nxt = min(nxt, self.wakeups[0][0])
        for forecast in self.forecasts.values():
            nxt = min(nxt, forecast.next_change_s(now))
        return nxt

    # --- limits and admission ---

    def _limits(self, now: float) -> list[int]:
        if self.schedule.static_limits is not None:
            return list(self.schedule.static_limits)
        pool = self.problem.pool
        limits = list(self.floors)
        wants = {}
        for i in self.interactive:
            outstanding = len(self.state[i].running) + self.state[i].paused_or_queued
            want = max(outstanding, self.forecasts[i].at(now)) + self.schedule.headroom_slots
            wants[i] = max(self.floors[i], min(_ceiling(pool, i), want))
        if self.schedule.guards_shares:
            # What each asks up to its nominal share comes first; a backlogged tenant asks all.
            for i in self.interactive:
                limits[i] = max(self.floors[i], min(self.nominal[i], wants[i]))
            for i in self.backlogged:
                limits[i] = max(self.floors[i], self.nominal[i])
        extra = {i: wants[i] - limits[i] for i in self.interactive if wants[i] > limits[i]}
        free = self.budget - sum(limits)
        if sum(extra.values()) <= free:
            for i in extra:
                limits[i] = wants[i]
        else:
            scaled = _largest_remainder(extra, free)
            for i in extra:
                limits[i] += scaled[i]
        _give_rest(limits, self.backlogged, pool, self.budget)
        # With nobody backlogged to take them, the rest is more headroom for the others.
        _give_rest(limits, self.interactive, pool, self.budget)
        return limits

    def _admit(self, now: float) -> None:
        limits = self._limits(now)
        self.max_limits_sum = max(self.max_limits_sum, sum(limits))
        for i in self.backlogged:
            shortfall = self.nominal[i] - limits[i]
            self.share_shortfall_slots = max(self.share_shortfall_slots, shortfall)
        order = self.interactive + self.backlogged
        for i in order:
            state = self.state[i]
            while state.queue and len(state.running) < limits[i]:
                if self.in_engine >= self.budget and not (
                    self.schedule.pausing and self._pause_one(limits, now)
                ):
                    break
                self._enter(state.queue.popleft(), now)

    def _pause_one(self, limits: list[int], now: float) -> bool:
        """Pause the youngest request of a preemptible tenant above its limit."""
        for j in reversed(range(len(self.tenants))):
            state = self.state[j]
            if self.preemptible[j] and len(state.running) > limits[j]:
                request = state.running.pop()
                finished = self.core.abort(request.engine_id, now)
                del self.by_engine_id[request.engine_id]
                assert finished is not None
                self.in_engine -= 1
                state.queue.appendleft(request)
                state.paused_or_queued += 1
                self.pauses += 1
                return True
        return False

    def _enter(self, request: _Request, now: float) -> None:
        state = self.state[request.tenant]
        state.paused_or_queued -= 1
        request.attempts += 1
        request.engine_id = f"{request.tenant}-{len(self.traces)}-{id(request)}-{request.attempts}"
        prompt = request.prompt
        done = request.received
        if done:
            prompt = prompt + tuple(reference_output_ids(prompt, done, ignore_eos=True))
        spec = RequestSpec(request.engine_id, prompt, request.max_tokens - done, ignore_eos=True)
        self.core.add_request(spec, now)
        self.by_engine_id[request.engine_id] = request
        state.running.append(request)
        self.in_engine += 1
        self.max_in_engine = max(self.max_in_engine, self.in_engine)

    # --- engine ---

    def _finish(self, finished: FinishedRequest) -> None:
        request = self.by_engine_id.pop(finished.request_id)
        self.state[request.tenant].running.remove(request)
        self.in_engine -= 1
        trace = request.trace
        trace.status = RequestStatus.OK
        trace.end_s = finished.finished_s
        trace.output_tokens = request.received
        trace.http_status = 200
        if request.client is not None:
            self._client_ready(request.tenant, request.client, finished.finished_s)

    def _tokens(self, outcome: StepOutcome) -> None:
        for token in outcome.tokens:
            request = self.by_engine_id[token.request_id]
            if request.trace.first_token_s is None:
                request.trace.first_token_s = token.time_s
            request.received += 1
        for finished in outcome.finished:
            self._finish(finished)

    def run(self) -> None:
        core = self.core
        now = 0.0
        for i, tenant in enumerate(self.tenants):
            if not is_open_loop(tenant.arrival):
                assert isinstance(tenant.arrival, ClosedLoopArrival | OnOffArrival)
                for client in range(max_concurrency(tenant.arrival)):
                    self._client_ready(i, client, 0.0)
        while now < self.horizon:
            self._due(now)
            self._admit(now)
            until = self._next_event(now)
            if not core.has_work:
                now = until
                continue
            decode = core.advance_decodes(now, until)
            if decode is not None:
                for request_id in decode.request_ids:
                    self.by_engine_id[request_id].received += decode.steps
                now = decode.ends_s[-1]
                for finished in decode.finished:
                    self._finish(finished)
                continue
            step = core.schedule(now)
            if step.is_empty:
                core.complete(step, now)
                now = until
                continue
            end = now + step.duration_s
            if end > self.horizon:
                break  # the load stops before this step's tokens arrive
            now = end
            self._tokens(core.complete(step, now))
        for trace in self.traces:
            if trace.status is RequestStatus.PENDING:
                trace.status = RequestStatus.CANCELLED
                trace.end_s = self.horizon


def _largest_remainder(wants: Mapping[int, int], total: int) -> dict[int, int]:
    """`total` split in proportion to `wants` (integers summing to total, each <= its want)."""
    whole = sum(wants.values())
    shares = {i: total * w / whole for i, w in wants.items()}
    grants = {i: math.floor(s) for i, s in shares.items()}
    left = total - sum(grants.values())
    for i in sorted(wants, key=lambda i: -(shares[i] - grants[i]))[:left]:
        grants[i] += 1
    return grants


def _longest(count: TokenCount) -> int:
    return count.max_tokens if isinstance(count, TokenRange) else count


def _shortest(count: TokenCount) -> int:
    return count.min_tokens if isinstance(count, TokenRange) else count


def _typical_duration_s(
    problem: FrontierProblem, profile: EngineProfile, tenant: BenchTenant
) -> float:
    """How long the tenant's longest request takes in a full batch of the scenario's longest
    contexts: the forecast's in-flight span."""
    context = max(
        _longest(t.prompt_tokens) + _longest(t.output_tokens) // 2 for t in problem.scenario.tenants
    )
    budget = problem.pool.budget_slots
    step_ms = profile.step.step_ms(budget, budget * context, 0)
    return _longest(tenant.output_tokens) * step_ms / 1000.0


# --- the upper bound ------------------------------------------------------------------------


@dataclass(frozen=True)
class FrontierBound:
    """The upper bound on output throughput (tokens per second of the window), as two terms."""

    carry_in_tok_s: float
    """Term 1: requests alive at the window's start that end inside it."""
    inside_tok_s: float
    """Term 2: the LP bound on requests produced wholly inside the window."""

    @property
    def total_tok_s(self) -> float:
        return self.carry_in_tok_s + self.inside_tok_s


def throughput_bound(problem: FrontierProblem, *, pausing: bool) -> FrontierBound:
    """The bound of the module's docstring on the mean throughput over the problem's windows
    (the mean of each window's bound, `window_bound`), for schedules without (False) or with
    (True) pausing. Valid for every attainment level."""
    bounds = [window_bound(problem, window, pausing=pausing) for window in problem.windows]
    if len(bounds) == 1:
        return bounds[0]
    return FrontierBound(
        carry_in_tok_s=sum(b.carry_in_tok_s for b in bounds) / len(bounds),
        inside_tok_s=sum(b.inside_tok_s for b in bounds) / len(bounds),
    )


def window_bound(problem: FrontierProblem, window: Window, *, pausing: bool) -> FrontierBound:
    """The bound of the module's docstring on the throughput in `window` (one of the
    problem's), without (False) or with (True) pausing."""
    scenario = problem.scenario
    profile = effective_profile(problem.engine_config)
    costs = profile.step
    budget = problem.pool.budget_slots
    s, e = window.start_s, window.end_s
    tenants = scenario.tenants

    # Term 1: carry-in.
    caps: list[tuple[int, int, bool]] = []  # (longest output, count cap, may be paused)
    for t in tenants:
        if is_open_loop(t.arrival):
            rng = tenant_rng(scenario.seed, t.name, "arrivals")
            cap = sum(1 for a in arrival_times(t.arrival, rng, problem.horizon_s) if a < s)
        else:
            assert isinstance(t.arrival, ClosedLoopArrival | OnOffArrival)
            cap = max_concurrency(t.arrival)
        pauseable = (
            pausing
            and problem.pool.tenants[
                [p.name for p in problem.pool.tenants].index(t.name)
            ].preemptible
        )
        caps.append((_longest(t.output_tokens), cap, pauseable))
    carry = 0
    engine_slots = budget
    # Paused requests hold no slot: a preemptible tenant's carry-in is its whole count; the
    # rest share the engine's slots, longest outputs first.
    for longest, cap, pauseable in caps:
        if pauseable:
            carry += longest * cap
    for longest, cap, pauseable in sorted(caps, key=lambda c: -c[0]):
        if pauseable:
            continue
        take = min(cap, engine_slots)
        carry += longest * take
        engine_slots -= take

    # Term 2: the LP.
    max_context = max(_longest(t.prompt_tokens) + _longest(t.output_tokens) for t in tenants)
    max_prefill = min(
        profile.max_num_batched_tokens, budget * max(_longest(t.prompt_tokens) for t in tenants)
    )
    max_step_ms = costs.step_ms(budget, budget * max_context, max_prefill)

    def average_cost_ms(t: BenchTenant) -> float:
        prompt = _shortest(t.prompt_tokens)
        best = math.inf
        for o in range(_shortest(t.output_tokens), _longest(t.output_tokens) + 1):
            total = (
                costs.per_seq_ms * o
                + costs.per_context_token_us / 1000.0 * (o * prompt + o * (o - 1) / 2)
                + costs.per_prefill_token_us / 1000.0 * prompt
            )
            best = min(best, total / o)
        return best

    def min_cost_ms(t: BenchTenant) -> float:
        return costs.per_seq_ms + costs.per_context_token_us / 1000.0 * _shortest(t.prompt_tokens)

    closed = [i for i, t in enumerate(tenants) if not is_open_loop(t.arrival)]
    opened = [i for i, t in enumerate(tenants) if is_open_loop(t.arrival)]
    cuts = {s, e}
    for i in closed:
        arrival = tenants[i].arrival
        if isinstance(arrival, OnOffArrival):
            for start, end in on_windows(arrival, e):
                cuts.update(c for c in (start, end) if s < c < e)
    edges = sorted(cuts)
    segments = list(itertools.pairwise(edges))
    g_count = len(segments)
    # Variables: K_g, then y_{t,g} for t in closed (row-major), then z_t for t in opened.
    n_k = g_count
    n_y = len(closed) * g_count
    n_vars = n_k + n_y + len(opened)

    def y(ci: int, g: int) -> int:
        return n_k + ci * g_count + g

    def z(oi: int) -> int:
        return n_k + n_y + oi

    rows: list[np.ndarray] = []
    rhs: list[float] = []

    def row() -> np.ndarray:
        return np.zeros(n_vars)

    for g, (start, end) in enumerate(segments):
        mid = (start + end) / 2
        for ci, i in enumerate(closed):
            arrival = tenants[i].arrival
            assert isinstance(arrival, ClosedLoopArrival | OnOffArrival)
            clients = max_concurrency(arrival)
            r = row()
            r[y(ci, g)] = 1.0
            if concurrency_at(arrival, mid) > 0:
                r[g] = -float(clients)
                rows.append(r)
                rhs.append(0.0)
            else:
                rows.append(r)
                rhs.append(float(clients * _longest(tenants[i].output_tokens)))
        r = row()
        for ci in range(len(closed)):
            r[y(ci, g)] = 1.0
        r[g] = -float(budget)
        rows.append(r)
        rhs.append(0.0)
        r = row()
        r[g] = costs.base_ms
        for ci, i in enumerate(closed):
            r[y(ci, g)] = min_cost_ms(tenants[i])
        rows.append(r)
        rhs.append((end - start) * 1000.0 + max_step_ms)
    r = row()
    r[n_k:] = 1.0
    r[:n_k] = -float(budget)
    rows.append(r)
    rhs.append(0.0)
    r = row()
    r[:n_k] = costs.base_ms
    for ci, i in enumerate(closed):
        for g in range(g_count):
            r[y(ci, g)] = average_cost_ms(tenants[i])
    for oi, i in enumerate(opened):
        r[z(oi)] = average_cost_ms(tenants[i])
    rows.append(r)
    rhs.append((e - s) * 1000.0 + max_step_ms)
    for oi, i in enumerate(opened):
        t = tenants[i]
        rng = tenant_rng(scenario.seed, t.name, "arrivals")
        sends = sum(1 for a in arrival_times(t.arrival, rng, problem.horizon_s) if a < e)
        r = row()
        r[z(oi)] = 1.0
        rows.append(r)
        rhs.append(float(sends * _longest(t.output_tokens)))
    objective = np.zeros(n_vars)
    objective[n_k:] = 1.0
    inside = lp_dual_bound(np.array(rows), np.array(rhs), objective)
    length = window.length_s
    return FrontierBound(carry_in_tok_s=carry / length, inside_tok_s=inside / length)


def lp_dual_bound(a: np.ndarray, b: np.ndarray, c: np.ndarray) -> float:
    """An upper bound on max c.x subject to a x <= b, x >= 0 (b >= 0): the LP is solved by the
    simplex method (Bland's rule) and the bound read from a dual-feasible point y >= 0 with
    a^T y >= c (weak duality: b.y bounds every feasible x), made exactly feasible by scaling,
    so rounding in the pivots cannot yield an invalid bound. ValueError if unbounded."""
    rows, cols = a.shape
    if np.any(b < 0):
        raise ValueError("the right-hand side must not be negative")
    tableau = np.zeros((rows + 1, cols + rows + 1))
    tableau[:rows, :cols] = a
    tableau[:rows, cols : cols + rows] = np.eye(rows)
    tableau[:rows, -1] = b
    tableau[-1, :cols] = -c
    basis = list(range(cols, cols + rows))
    for _ in range(50 * (rows + cols)):
        entering = next((j for j in range(cols + rows) if tableau[-1, j] < -1e-12), None)
        if entering is None:
            break
        column = tableau[:rows, entering]
        ratios = [
            (tableau[i, -1] / column[i], basis[i], i) for i in range(rows) if column[i] > 1e-12
        ]
        if not ratios:
            raise ValueError("the LP is unbounded")
        _, _, pivot = min(ratios)
        tableau[pivot] /= tableau[pivot, entering]
        for i in range(rows + 1):
            if i != pivot and tableau[i, entering] != 0.0:
                tableau[i] -= tableau[i, entering] * tableau[pivot]
        basis[pivot] = entering
    dual = np.maximum(tableau[-1, cols : cols + rows], 0.0)
    # Make the point exactly feasible: scale it up for the columns with c > 0, and cover what
    # rounding left short on a column with a row whose entries are all non-negative (raising
    # that row's dual lowers no other column's a^T y).
    reduced = a.T @ dual
    factor = 1.0
    for j in range(cols):
        if c[j] > 0:
            if reduced[j] <= 0:
                raise ValueError("no dual-feasible point found")
            factor = max(factor, c[j] / reduced[j])
    dual = dual * factor
    covering = [i for i in range(rows) if np.all(a[i] >= 0)]
    for j in range(cols):
        shortfall = c[j] - float(a[:, j] @ dual)
        if shortfall > 0:
            row = next((i for i in covering if a[i, j] > 0), None)
            if row is None:
                raise ValueError("the dual point cannot be made feasible")
            # A hair more than short: the product is rounded again at the check below, and a
            # point a rounding error from feasible would be refused (covering rows are
            # non-negative, so more on them keeps every column feasible and only raises the
            # bound, here by about 1e-9 x the row's right-hand side).
            dual[row] += (shortfall + 1e-9 * max(1.0, abs(float(c[j])))) / a[row, j]
    if np.any(a.T @ dual < c):
        raise ValueError("the dual point is not feasible")
    return float(b @ dual)


# --- the frontier ------------------------------------------------------------------------


@dataclass(frozen=True)
class FrontierPoint:
    """F at one attainment level."""

    level: float
    feasible_tok_s: float | None
    """The best simulated candidate with min attainment >= level; None if none reaches it."""
    schedule: str | None
    bound_tok_s: float
    by_window_tok_s: tuple[float | None, ...] = ()
    """F at this level in each window alone (the best candidate there, its throughput there):
    how much of F one window's luck moves."""

    @property
    def gap(self) -> float | None:
        """(bound - feasible) / bound."""
        if self.feasible_tok_s is None:
            return None
        return (self.bound_tok_s - self.feasible_tok_s) / self.bound_tok_s


def nominal_static_run(runs: Sequence[OracleRun]) -> OracleRun | None:
    """The nominal static split's run (the first candidate), what lender safety is judged
    against; None when it was not simulated."""
    return next((r for r in runs if r.schedule.name == NOMINAL_STATIC), None)


def lender_safe_runs(runs: Sequence[OracleRun]) -> list[OracleRun]:
    """The candidates that keep the slo policy's promises: they guard the nominal shares
    (`Schedule.guards_shares`) and are lender-safe (`is_lender_safe` against the nominal
    static split, on each tenant's mean goodput over the windows)."""
    static = nominal_static_run(runs)
    if static is None:
        return []
    return [
        r for r in runs if r.schedule.guards_shares and is_lender_safe(r.goodput, static.goodput)
    ]


def frontier_points(
    runs: Sequence[OracleRun], bound_tok_s: float, levels: Sequence[float]
) -> list[FrontierPoint]:
    """F(a) at each level from the simulated candidates' mean figures (non-increasing in a by
    construction: a higher level only removes candidates), with F in each window alone."""
    points = []
    window_count = len(runs[0].per_window) if runs else 0
    for level in levels:
        best = feasible_at(runs, level)
        by_window = []
        for index in range(window_count):
            there = feasible_at(runs, level, window_index=index)
            by_window.append(None if there is None else there.per_window[index].output_throughput)
        points.append(
            FrontierPoint(
                level=level,
                feasible_tok_s=None if best is None else best.output_throughput,
                schedule=None if best is None else best.schedule.name,
                bound_tok_s=bound_tok_s,
                by_window_tok_s=tuple(by_window),
            )
        )
    return points


def feasible_at(
    runs: Sequence[OracleRun], level: float, *, window_index: int | None = None
) -> OracleRun | None:
    """The best candidate whose min attainment is >= level, by the mean figures, or by those
    of the one window `window_index`."""
    eligible = [r for r in runs if r.figures(window_index).min_attainment >= level]
    return max(eligible, key=lambda r: r.figures(window_index).output_throughput, default=None)


def search(
    problem: FrontierProblem,
    schedules: Sequence[Schedule],
    *,
    cpu_budget_s: float = 600.0,
    progress: Callable[[OracleRun], None] | None = None,
) -> tuple[list[OracleRun], int]:
    """Simulate the schedules in order until the CPU budget is spent; the runs and how many
    schedules were left out for lack of time."""
    started = time.process_time()
    runs: list[OracleRun] = []
    for index, schedule in enumerate(schedules):
        if time.process_time() - started > cpu_budget_s:
            return runs, len(schedules) - index
        run = simulate_schedule(problem, schedule)
        runs.append(run)
        if progress is not None:
            progress(run)
    return runs, 0
