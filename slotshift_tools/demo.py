"""The demo load of `slotshift up --demo`: the study's two tenants in three phases.

B is a batch tenant with more requests outstanding than the budget (closed loop: each finished
request is replaced at once). A is interactive: idle, then a burst, then idle again. The demo
samples the control plane's allocation every second through the gateways' own API and prints how
the slots moved, then checks that they moved the way the study says they should and that the
engine never held more than the budget.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import aiohttp
import grpc

from slotshift.apportion import nominal_shares
from slotshift.config import PoolConfig, SlotshiftConfig, reveal
from slotshift.v1 import query_pb2, query_pb2_grpc
from slotshift_tools.engine_probe import requests_inside, served_model
from slotshift_tools.metrics_scrape import scrape_samples

B_OUTSTANDING = 120
A_BURST_OUTSTANDING = 48
B_MAX_TOKENS = 96
A_MAX_TOKENS = 32


@dataclass
class Sample:
    t_s: float
    phase: str
    version: int
    limits: dict[str, int]
    in_flight: dict[str, int]
    queued: dict[str, int]
    engine_in_server: int | None


@dataclass
class TenantCounters:
    completed: int = 0
    failed: int = 0
    tokens: int = 0
    short: int = 0
    """Answers with fewer (or more) tokens than asked: a pause that lost or repeated some."""


@dataclass
class DemoResult:
    samples: list[Sample] = field(default_factory=list)
    counters: dict[str, TenantCounters] = field(default_factory=dict)
    pauses: dict[str, int] = field(default_factory=dict)
    """Times each tenant's requests were paused (summed over the gateways), at the end."""


class Phases:
    """Which tenants send load when, over the demo's duration."""

    def __init__(self, duration_s: float) -> None:
        self.duration_s = duration_s
        self.burst_start_s = duration_s / 3
        self.burst_end_s = 2 * duration_s / 3

    def name(self, t_s: float) -> str:
        if t_s < self.burst_start_s:
            return "A idle"
        if t_s < self.burst_end_s:
            return "A burst"
        return "A idle again"


async def run_demo(config: SlotshiftConfig, *, duration_s: float) -> bool:
    """Run the demo against the running stack; print the table; True when every check held."""
    pools = config.fronted_pools()
    if len(pools) != 1:
        print(
            "the demo load is the study's, on one pool: run it with a one-pool config "
            "(deploy/local/slotshift.yaml); the fleet demo is `slotshift up --config "
            "deploy/local/fleet.yaml` and any OpenAI client",
            flush=True,
        )
        return False
    (pool,) = pools
    keys = {t.name: reveal(t.api_keys[0]) for t in pool.tenants if t.api_keys}
    if set(keys) < {"A", "B"}:
        print("the demo needs tenants A and B with API keys in the pool", flush=True)
        return False
    gateways = [f"http://{config.gateway.host}:{p}" for p in config.local_stack.gateway_ports]
    phases = Phases(duration_s)
    result = DemoResult(counters={t: TenantCounters() for t in keys})
    started = time.monotonic()
    cp = config.controlplane
    print(
        f"\nDemo: {duration_s:.0f} s; B keeps {B_OUTSTANDING} requests outstanding; "
        f"A bursts with {A_BURST_OUTSTANDING} from {phases.burst_start_s:.0f} s "
        f"to {phases.burst_end_s:.0f} s.\n",
        flush=True,
    )
    timeout = aiohttp.ClientTimeout(total=120)
    # No connection limit: every worker holds one connection for its whole request, and the
    # sampler must never queue behind them.
    async with (
        aiohttp.ClientSession(timeout=timeout, connector=aiohttp.TCPConnector(limit=0)) as session,
        grpc.aio.insecure_channel(f"{cp.grpc_host}:{cp.grpc_port}") as channel,
    ):
        model = await served_model(session, gateways[0], keys["B"])
        elapsed: Callable[[], float] = lambda: time.monotonic() - started  # noqa: E731

        def b_active() -> bool:
            return elapsed() < duration_s

        def a_active() -> bool:
            return phases.burst_start_s <= elapsed() < phases.burst_end_s

        workers = [
            _worker(
                session,
                gateways[i % len(gateways)],
                keys["B"],
                model,
                B_MAX_TOKENS,
                b_active,
                result.counters["B"],
                start_s=0.0,
                elapsed=elapsed,
            )
            for i in range(B_OUTSTANDING)
        ] + [
            _worker(
                session,
                gateways[i % len(gateways)],
                keys["A"],
                model,
                A_MAX_TOKENS,
                a_active,
                result.counters["A"],
                start_s=phases.burst_start_s,
                elapsed=elapsed,
            )
            for i in range(A_BURST_OUTSTANDING)
        ]
        stub = query_pb2_grpc.AllocationServiceStub(channel)
        sampler = _sample(stub, session, config, pool, phases, result, elapsed)
        await asyncio.gather(sampler, *workers)
        result.pauses = await _pauses(session, gateways)
    _print_table(result, pool)
    return _check(result, pool, phases)


async def _worker(
    session: aiohttp.ClientSession,
    gateway: str,
    key: str,
    model: str,
    max_tokens: int,
    active: Callable[[], bool],
    counters: TenantCounters,
    *,
    start_s: float,
    elapsed: Callable[[], float],
) -> None:
    """Closed loop: one request outstanding at a time while the tenant's phase lasts."""
    if elapsed() < start_s:
        await asyncio.sleep(start_s - elapsed())
    payload = {
        "model": model,
        "prompt": "Summarise the quarterly report in one paragraph.",
        "max_tokens": max_tokens,
        "ignore_eos": True,
    }
    headers = {"Authorization": f"Bearer {key}"}
    while active():
        try:
            async with session.post(
                f"{gateway}/v1/completions", json=payload, headers=headers
            ) as response:
                body = await response.json()
                if response.status == 200:
                    counters.completed += 1
                    tokens = int(body["usage"]["completion_tokens"])
                    counters.tokens += tokens
                    counters.short += tokens != max_tokens
                else:
                    counters.failed += 1
                    await asyncio.sleep(0.2)
        except (aiohttp.ClientError, TimeoutError):
            counters.failed += 1
            await asyncio.sleep(0.2)


async def _sample(
    stub: query_pb2_grpc.AllocationServiceAsyncStub,
    session: aiohttp.ClientSession,
    config: SlotshiftConfig,
    pool: PoolConfig,
    phases: Phases,
    result: DemoResult,
    elapsed: Callable[[], float],
) -> None:
    while (t := elapsed()) < phases.duration_s:
        allocation = await stub.GetAllocation(query_pb2.GetAllocationRequest(pool=pool.name))
        tenants = await stub.ListTenants(query_pb2.ListTenantsRequest(pool=pool.name))
        result.samples.append(
            Sample(
                t_s=t,
                phase=phases.name(t),
                version=allocation.version,
                limits={a.tenant: a.limit_slots for a in allocation.tenants},
                in_flight={i.allocation.tenant: i.in_flight for i in tenants.tenants},
                queued={i.allocation.tenant: i.queued for i in tenants.tenants},
                engine_in_server=await _engine_in_server(session, config),
            )
        )
        await asyncio.sleep(max(0.0, 1.0 - (elapsed() - t)))


async def _pauses(session: aiohttp.ClientSession, gateways: list[str]) -> dict[str, int]:
    """Pauses per tenant, summed over the gateways' /metrics (a gateway that does not answer
    counts nothing)."""
    pauses: dict[str, int] = {}
    for gateway in gateways:
        with contextlib.suppress(aiohttp.ClientError, TimeoutError):
            samples = await scrape_samples(session, f"{gateway}/metrics", timeout_s=5.0)
            for labels, value in samples.get("slotshift_gateway_pauses_total", []):
                tenant = labels.get("tenant", "")
                pauses[tenant] = pauses.get(tenant, 0) + round(value)
    return pauses


async def _engine_in_server(session: aiohttp.ClientSession, config: SlotshiftConfig) -> int | None:
    """Requests inside the engine (running plus waiting), from its /metrics."""
    url = config.agent.engine_of(config.fronted_pools()[0].name).metrics_url
    with contextlib.suppress(aiohttp.ClientError, TimeoutError):
        async with session.get(url) as response:
            return requests_inside(await response.text())
    return None


def _print_table(result: DemoResult, pool: PoolConfig) -> None:
    header = (
        f"{'t (s)':>6}  {'phase':<13}{'version':>8}  {'limit A':>8}{'limit B':>8}"
        f"  {'A run/queue':>12}{'B run/queue':>12}  {'in engine':>9}"
    )
    print(header)
    print("-" * len(header))
    for s in result.samples:
        engine = "-" if s.engine_in_server is None else str(s.engine_in_server)
        print(
            f"{s.t_s:>6.1f}  {s.phase:<13}{s.version:>8}  {s.limits['A']:>8}{s.limits['B']:>8}"
            f"  {s.in_flight['A']:>5}/{s.queued['A']:<6}{s.in_flight['B']:>5}/{s.queued['B']:<6}"
            f"  {engine:>9}"
        )
    print()
    for tenant, c in sorted(result.counters.items()):
        print(
            f"tenant {tenant}: {c.completed} completed, {c.failed} failed, {c.tokens} output tokens"
        )
    print(f"budget {pool.budget_slots} slots; nominal split {nominal_shares(pool)}\n", flush=True)


def _check(result: DemoResult, pool: PoolConfig, phases: Phases) -> bool:
    nominal = nominal_shares(pool)
    settle_s = 2 * pool.decision_period_s
    checks: list[tuple[str, bool]] = []
    idle = [s for s in result.samples if settle_s <= s.t_s < phases.burst_start_s]
    checks.append(
        (
            f"while A idles, B holds more than its nominal {nominal['B']} slots",
            bool(idle) and all(s.limits["B"] > nominal["B"] for s in idle),
        )
    )
    burst = [
        s for s in result.samples if phases.burst_start_s + settle_s <= s.t_s < phases.burst_end_s
    ]
    floor_a = next(t.floor_slots for t in pool.tenants if t.name == "A")
    checks.append(
        (
            f"when A bursts, A gets slots back above its floor of {floor_a}",
            bool(burst) and all(s.limits["A"] > floor_a for s in burst),
        )
    )
    engine = [s.engine_in_server for s in result.samples if s.engine_in_server is not None]
    checks.append(
        (
            f"the engine never held more than the budget ({max(engine, default=0)} at most)",
            all(n <= pool.budget_slots for n in engine),
        )
    )
    checks.append(
        (
            "limits always summed to the budget",
            all(sum(s.limits.values()) == pool.budget_slots for s in result.samples),
        )
    )
    failed = sum(c.failed for c in result.counters.values())
    checks.append((f"no request failed ({failed} failed)", failed == 0))
    preemptible = [t.name for t in pool.tenants if t.preemptible and pool.preemption.enabled]
    for name in preemptible:
        pauses = result.pauses.get(name, 0)
        counters = result.counters.get(name, TenantCounters())
        checks.append(
            (
                f"{name}'s borrowed work paused {pauses} times for A and resumed without loss "
                f"({counters.short} answers of a wrong length)",
                pauses > 0 and counters.short == 0,
            )
        )
    for text, ok in checks:
        print(f"  [{'PASS' if ok else 'FAIL'}] {text}")
    print(flush=True)
    return all(ok for _, ok in checks)
