"""`slotshift soak`: the local stack under mixed load for a long while, watched for leaks.

The services run as separate processes on free ports (emulator, control plane, two gateways,
agent), started and stopped in order by slotshift_tools.local_stack.LocalStack from the given
config, with a small per-gateway queue so that bursts overflow it; each writes its output to
`<name>.log` beside the results. For `duration_s` both tenants send chat and completion
requests, streamed and not, from closed-loop clients; some clients leave mid-stream, some
requests are cancelled by their client while they wait, some use a bad key or a body that is
not JSON, and bursts overflow a tenant's queue (429). Every `sample_interval_s` the soak
records each service's resident memory (VmRSS from /proc), each gateway's in flight and queued
per tenant, the engine's running and waiting requests (polled far more often, so that the
recorded maximum is a true peak), and the outcomes so far by kind. After the load it waits a
grace period for the gateways to drain.

It writes `soak.json` (samples and a summary with a pass/fail per criterion) and `soak.png` (RSS
per service and in flight over time). The criteria: in flight and queued end at 0 and every
admitted request completed exactly once; the engine never held more than the pool's budget;
no outcome outside the load's deliberate faults; each service's RSS grew by at most
RSS_GROWTH_LIMIT_MB or RSS_GROWTH_LIMIT_PERCENT from the first window's median to the last's.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import itertools
import json
import logging
import math
import os
import random
import statistics
import sys
import time
from collections import Counter
from collections.abc import Awaitable, Callable, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import aiohttp
from matplotlib.figure import Figure

from slotshift.aiotasks import Supervisor
from slotshift.config import SlotshiftConfig, apply_overrides, load_config, reveal
from slotshift_tools.engine_probe import served_model
from slotshift_tools.local_stack import (
    LocalStack,
    StackPorts,
    generated_tenant_keys,
    write_config,
)
from slotshift_tools.metrics_scrape import Samples, scrape_samples, summed

logger = logging.getLogger(__name__)

DEFAULT_DURATION_S = 600.0
SAMPLE_INTERVAL_S = 5.0
ENGINE_POLL_S = 0.25
"""The engine's running + waiting is polled this often: a 5 s sample would miss a peak."""
GRACE_S = 30.0
"""After the load, how long the gateways get to finish and release everything."""
SOAK_QUEUE_DEPTH = 32
"""Per-tenant queue depth at each gateway during the soak, so that a burst can overflow it."""
OVERSUBSCRIPTION = 1.25
"""Steady clients, all together, keep this many times the budget outstanding: the engine stays
full and the gateways keep queues, so the budget is tested all along."""
REQUEST_TIMEOUT_S = 120.0
"""No client call may hang: one that takes longer is counted as a TimeoutError."""
QUEUED_CANCEL_AFTER_S = 0.3
"""Burst requests marked for cancellation give up this soon, most of them while queued."""
RSS_GROWTH_LIMIT_MB = 50.0
RSS_GROWTH_LIMIT_PERCENT = 25.0
"""A service's RSS growth fails the soak only when it exceeds both limits."""
RSS_WINDOW_S = 60.0
"""RSS growth compares the median of the first and the last window of this length."""
READY_TIMEOUT_S = 60.0
"""Seconds each service gets to become ready."""

EXPECTED_KINDS = frozenset(
    {"ok", "http_400", "http_401", "http_429", "disconnected_by_design", "cancelled_by_design"}
)
"""Outcomes the load provokes on purpose; any other kind is an error."""


def soak_config(config: SlotshiftConfig, ports: StackPorts) -> SlotshiftConfig:
    """The config with the soak's ports and queue depth; the first pool is the one soaked, on
    the emulator whatever engine `config` names for `slotshift up`."""
    return apply_overrides(
        config,
        {
            **ports.settings(config),
            "gateway.queue_max_depth": SOAK_QUEUE_DEPTH,
            "gateway.fallback_replicas": len(ports.gateways),
            "local_stack.engine": "emulator",
            "local_stack.start_engine_sim": True,
            "local_stack.ready_timeout_s": READY_TIMEOUT_S,
        },
    )


@dataclass
class Outcomes:
    """What the clients saw, by kind: `ok`, `http_<status>`, a client-side exception's type
    name, `stream_error_event`, or one of the deliberate `*_by_design` endings."""

    kinds: Counter[str] = field(default_factory=Counter)

    def add(self, kind: str) -> None:
        self.kinds[kind] += 1

    @property
    def unexpected(self) -> dict[str, int]:
        return {k: n for k, n in self.kinds.items() if k not in EXPECTED_KINDS}


@dataclass(frozen=True)
class _Target:
    gateway: str
    key: str
    model: str


def _payload(rng: random.Random, chat: bool, stream: bool, model: str) -> dict[str, Any]:
    text = "soak " * rng.randint(1, 40)
    payload: dict[str, Any] = {"model": model, "max_tokens": rng.randint(8, 96), "stream": stream}
    if chat:
        payload["messages"] = [{"role": "user", "content": text}]
    else:
        payload["prompt"] = text
    return payload


async def _one_request(
    session: aiohttp.ClientSession,
    outcomes: Outcomes,
    target: _Target,
    rng: random.Random,
) -> None:
    """One request of the steady mix; streams leave early one time in eight."""
    chat = rng.random() < 0.5
    stream = rng.random() < 0.5
    leave_early = stream and rng.random() < 0.125
    payload = _payload(rng, chat, stream, target.model)
    path = "/v1/chat/completions" if chat else "/v1/completions"
    try:
        async with session.post(
            target.gateway + path,
            json=payload,
            headers={"Authorization": f"Bearer {target.key}"},
            timeout=aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S),
        ) as response:
            if response.status != 200:
                await response.read()
                outcomes.add(f"http_{response.status}")
                return
            if leave_early:
                await response.content.readany()
                # Closing without reading the rest drops the connection mid-stream.
                response.close()
                outcomes.add("disconnected_by_design")
                return
            body = await response.read()
    except (aiohttp.ClientError, TimeoutError) as exc:
        outcomes.add(type(exc).__name__)
        return
    outcomes.add("stream_error_event" if b'data: {"error"' in body else "ok")


async def _steady_client(
    session: aiohttp.ClientSession,
    outcomes: Outcomes,
    target: _Target,
    rng: random.Random,
    stop: asyncio.Event,
) -> None:
    while not stop.is_set():
        await _one_request(session, outcomes, target, rng)
        await asyncio.sleep(rng.uniform(0.0, 0.1))


async def _bad_requests(
    session: aiohttp.ClientSession,
    outcomes: Outcomes,
    targets: Sequence[_Target],
    rng: random.Random,
    stop: asyncio.Event,
) -> None:
    """Now and then a request with an unknown key, and one whose body is not JSON."""
    while not stop.is_set():
        target = rng.choice(targets)
        for key, body in (("soak-not-a-key", b'{"prompt": "x"}'), (target.key, b"{not json")):
            try:
                async with session.post(
                    target.gateway + "/v1/completions",
                    data=body,
                    headers={"Authorization": f"Bearer {key}", "Content-Type": "application/json"},
                    timeout=aiohttp.ClientTimeout(total=REQUEST_TIMEOUT_S),
                ) as response:
                    await response.read()
                    outcomes.add(f"http_{response.status}")
            except (aiohttp.ClientError, TimeoutError) as exc:
                outcomes.add(type(exc).__name__)
        await asyncio.sleep(rng.uniform(0.5, 1.5))


async def _burst_request(
    session: aiohttp.ClientSession, outcomes: Outcomes, target: _Target, cancel: bool
) -> None:
    payload = {"model": target.model, "prompt": "burst", "max_tokens": 32}
    try:
        async with asyncio.timeout(QUEUED_CANCEL_AFTER_S if cancel else REQUEST_TIMEOUT_S):
            async with session.post(
                target.gateway + "/v1/completions",
                json=payload,
                headers={"Authorization": f"Bearer {target.key}"},
            ) as response:
                await response.read()
                outcomes.add(f"http_{response.status}" if response.status != 200 else "ok")
    except TimeoutError:
        outcomes.add("cancelled_by_design" if cancel else "TimeoutError")
    except aiohttp.ClientError as exc:
        outcomes.add(type(exc).__name__)


async def _bursts(
    session: aiohttp.ClientSession,
    outcomes: Outcomes,
    targets: Sequence[_Target],
    size: int,
    every_s: float,
    rng: random.Random,
    stop: asyncio.Event,
) -> None:
    """Every `every_s`, `size` requests at once to one tenant at one gateway: more than its
    limit and queue can hold (429s); one in eight gives up after QUEUED_CANCEL_AFTER_S."""
    while True:
        try:
            await asyncio.wait_for(stop.wait(), every_s)
            return
        except TimeoutError:
            pass
        target = rng.choice(targets)
        await asyncio.gather(
            *(_burst_request(session, outcomes, target, i % 8 == 7) for i in range(size))
        )


@dataclass
class SoakSample:
    """One instant of the soak."""

    t_s: float
    rss_mb: dict[str, float | None]
    """Each service's VmRSS in MB; None once its process is gone."""
    in_flight: dict[str, dict[str, int]]
    """gateway -> tenant -> requests admitted and not finished (None-free: a gateway that did
    not answer is left out)."""
    queued: dict[str, dict[str, int]]
    engine_running: int | None
    engine_waiting: int | None
    max_in_engine: int
    """The largest running + waiting seen since the previous sample."""
    outcomes: dict[str, int]
    """Client outcomes so far, by kind."""


def _rss_mb(pid: int) -> float | None:
    try:
        text = Path(f"/proc/{pid}/status").read_text()
    except OSError:
        return None
    for line in text.splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    return None


async def _scrape(session: aiohttp.ClientSession, url: str) -> Samples | None:
    """The endpoint's samples; None when it does not answer."""
    try:
        return await scrape_samples(session, url, timeout_s=2.0)
    except (aiohttp.ClientError, TimeoutError):
        return None


def _per_tenant(scraped: Samples, name: str) -> dict[str, int]:
    return {labels["tenant"]: round(value) for labels, value in scraped.get(name, [])}


def _engine_total(scraped: Samples, name: str) -> int:
    return round(summed(scraped, name) or 0.0)


@dataclass
class _EngineWatch:
    running: int | None = None
    waiting: int | None = None
    peak_since_sample: int = 0
    peak: int = 0


async def _watch_engine(
    session: aiohttp.ClientSession, url: str, watch: _EngineWatch, stop: asyncio.Event
) -> None:
    while not stop.is_set():
        scraped = await _scrape(session, url)
        if scraped is not None:
            watch.running = _engine_total(scraped, "vllm:num_requests_running")
            watch.waiting = _engine_total(scraped, "vllm:num_requests_waiting")
            total = watch.running + watch.waiting
            watch.peak_since_sample = max(watch.peak_since_sample, total)
            watch.peak = max(watch.peak, total)
        await asyncio.sleep(ENGINE_POLL_S)


async def _gateway_counters(
    session: aiohttp.ClientSession, ports: StackPorts
) -> dict[str, Samples]:
    scraped = await asyncio.gather(
        *(_scrape(session, f"{ports.gateway_url(i)}/metrics") for i in range(2))
    )
    return {f"gateway-{i}": s for i, s in enumerate(scraped) if s is not None}


async def _take_sample(
    session: aiohttp.ClientSession,
    ports: StackPorts,
    stack: LocalStack,
    watch: _EngineWatch,
    outcomes: Outcomes,
    origin_s: float,
) -> SoakSample:
    gateways = await _gateway_counters(session, ports)
    rss = {
        name: await asyncio.to_thread(_rss_mb, pid) if pid is not None else None
        for name, pid in stack.pids().items()
    }
    sample = SoakSample(
        t_s=round(time.monotonic() - origin_s, 3),
        rss_mb=rss,
        in_flight={
            g: _per_tenant(s, "slotshift_gateway_requests_in_flight") for g, s in gateways.items()
        },
        queued={
            g: _per_tenant(s, "slotshift_gateway_requests_queued") for g, s in gateways.items()
        },
        engine_running=watch.running,
        engine_waiting=watch.waiting,
        max_in_engine=watch.peak_since_sample,
        outcomes=dict(outcomes.kinds),
    )
    watch.peak_since_sample = 0
    return sample


async def _sample_every(
    interval_s: float,
    samples: list[SoakSample],
    stop: asyncio.Event,
    take: Callable[[], Awaitable[SoakSample]],
) -> None:
    while True:
        samples.append(await take())
        try:
            await asyncio.wait_for(stop.wait(), interval_s)
            return
        except TimeoutError:
            pass


def _held(sample: SoakSample) -> int:
    return sum(sum(t.values()) for t in sample.in_flight.values()) + sum(
        sum(t.values()) for t in sample.queued.values()
    )


def _window_median(samples: Sequence[SoakSample], service: str, first: bool) -> float | None:
    if not samples:
        return None
    span_s = samples[-1].t_s - samples[0].t_s
    window_s = min(RSS_WINDOW_S, span_s / 3) if span_s > 0 else 0.0
    if first:
        chosen = [s for s in samples if s.t_s <= samples[0].t_s + window_s]
    else:
        chosen = [s for s in samples if s.t_s >= samples[-1].t_s - window_s]
    values = [v for s in chosen if (v := s.rss_mb.get(service)) is not None]
    return statistics.median(values) if values else None


def rss_growth(samples: Sequence[SoakSample], service: str) -> dict[str, float | bool | None]:
    """Median RSS of the first window vs the last; within limit unless over both limits."""
    start = _window_median(samples, service, first=True)
    end = _window_median(samples, service, first=False)
    if start is None or end is None:
        return {"start_mb": start, "end_mb": end, "growth_mb": None, "growth_percent": None}
    growth_mb = end - start
    growth_percent = 100 * growth_mb / start if start else 0.0
    return {
        "start_mb": round(start, 2),
        "end_mb": round(end, 2),
        "growth_mb": round(growth_mb, 2),
        "growth_percent": round(growth_percent, 2),
        "within_limit": growth_mb <= RSS_GROWTH_LIMIT_MB
        or growth_percent <= RSS_GROWTH_LIMIT_PERCENT,
    }


def summarize(
    samples: Sequence[SoakSample],
    load_samples: Sequence[SoakSample],
    *,
    outcomes: Outcomes,
    counters: Mapping[str, Samples],
    budget_slots: int,
    engine_peak: int,
    duration_s: float,
    exited: Sequence[str],
) -> dict[str, Any]:
    """The soak's figures and a pass/fail per criterion."""
    final = samples[-1]
    admitted = {
        g: _per_tenant(s, "slotshift_gateway_requests_admitted_total") for g, s in counters.items()
    }
    completed = {
        g: _per_tenant(s, "slotshift_gateway_requests_completed_total") for g, s in counters.items()
    }
    growth = {name: rss_growth(load_samples, name) for name in final.rss_mb}
    unexpected = outcomes.unexpected
    criteria = {
        "in_flight_drift_zero": _held(final) == 0 and len(final.in_flight) == 2,
        "admitted_equals_completed": admitted == completed and len(admitted) == 2,
        "engine_within_budget": engine_peak <= budget_slots,
        "no_unexpected_errors": not unexpected,
        "rss_growth_within_limit": all(g.get("within_limit") is True for g in growth.values()),
        "no_service_exited": not exited,
    }
    return {
        "duration_s": duration_s,
        "budget_slots": budget_slots,
        "in_flight_drift": _held(final),
        "final_in_flight": final.in_flight,
        "final_queued": final.queued,
        "admitted_total": admitted,
        "completed_total": completed,
        "requests_completed": outcomes.kinds.get("ok", 0),
        "requests_sent": sum(outcomes.kinds.values()),
        "max_in_engine": engine_peak,
        # Gaps well over the interval mean the load generator's own loop stalled (a busy host):
        # the load paused then, not the services.
        "max_sample_gap_s": round(
            max((b.t_s - a.t_s for a, b in itertools.pairwise(samples)), default=0.0),
            3,
        ),
        "outcomes_by_kind": dict(sorted(outcomes.kinds.items())),
        "unexpected_outcomes": unexpected,
        "rss_growth": growth,
        "rss_growth_limits": {"mb": RSS_GROWTH_LIMIT_MB, "percent": RSS_GROWTH_LIMIT_PERCENT},
        "services_exited": list(exited),
        "criteria": criteria,
        "passed": all(criteria.values()),
    }


def plot_soak(samples: Sequence[SoakSample], budget_slots: int, path: Path) -> None:
    """RSS per service, and in flight per gateway with the engine's peak, over time."""
    figure = Figure(figsize=(10, 7), layout="constrained")
    rss_axes, load_axes = figure.subplots(2, 1, sharex=True)
    t = [s.t_s for s in samples]
    for service in samples[0].rss_mb if samples else ():
        values = [s.rss_mb.get(service) for s in samples]
        rss_axes.plot(t, [float("nan") if v is None else v for v in values], label=service)
    rss_axes.set_ylabel("RSS (MB)")
    rss_axes.set_title("Resident memory per service")
    rss_axes.legend(loc="upper left", fontsize="small")
    for gateway in ("gateway-0", "gateway-1"):
        load_axes.plot(
            t,
            [sum(s.in_flight.get(gateway, {}).values()) for s in samples],
            label=f"{gateway} in flight",
        )
    load_axes.plot(t, [s.max_in_engine for s in samples], label="engine peak (running+waiting)")
    load_axes.axhline(budget_slots, color="tab:gray", linestyle="--", label="budget")
    load_axes.set_xlabel("time (s)")
    load_axes.set_ylabel("requests")
    load_axes.set_title("In flight")
    load_axes.legend(loc="upper left", fontsize="small")
    figure.savefig(path, dpi=110)


async def _drain(
    take: Callable[[], Awaitable[SoakSample]],
    samples: list[SoakSample],
    grace_s: float,
    interval_s: float,
) -> SoakSample:
    """Samples until nothing is held at either gateway, or grace_s has passed."""
    deadline = time.monotonic() + grace_s
    while True:
        sample = await take()
        samples.append(sample)
        if (_held(sample) == 0 and len(sample.in_flight) == 2) or time.monotonic() > deadline:
            return sample
        await asyncio.sleep(min(interval_s, 0.5))


async def run_soak(
    config: SlotshiftConfig,
    duration_s: float = DEFAULT_DURATION_S,
    out_dir: Path = Path("results/soak"),
    *,
    sample_interval_s: float = SAMPLE_INTERVAL_S,
    grace_s: float = GRACE_S,
    seed: int = 0,
) -> dict[str, Any]:
    """Soak the local stack described by `config` for `duration_s`; write soak.json and
    soak.png into `out_dir`; return the summary (its `passed` says whether every criterion
    held)."""
    await asyncio.to_thread(out_dir.mkdir, parents=True, exist_ok=True)
    ports = StackPorts.free(gateways=2)
    config = soak_config(config, ports)
    digests = config.tenant_keys
    if not (
        digests.key_digest_secret_file or digests.key_digest_secret or digests.unkeyed_key_digests
    ):
        # A config built in code: the file the services read must name a secret.
        section = await asyncio.to_thread(generated_tenant_keys, out_dir)
        config = apply_overrides(config, {f"tenant_keys.{k}": v for k, v in section.items()})
    config_path = out_dir / "slotshift.yaml"
    await asyncio.to_thread(write_config, config_path, config)
    pool = config.pools[0]
    # No --log-level: each service logs at its own default, into its file in out_dir.
    stack = LocalStack(config, config_path, [], None, log_dir=out_dir)
    outcomes = Outcomes()
    watch = _EngineWatch()
    samples: list[SoakSample] = []
    rng = random.Random(seed)
    tasks = Supervisor("soak")
    stop_load, stop_sampling = asyncio.Event(), asyncio.Event()
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector) as session:
        try:
            await stack.start()
            keys = [reveal(t.api_keys[0]) for t in pool.tenants if t.api_keys]
            probe = _Target(ports.gateway_url(0), keys[0], "")
            model = await served_model(session, probe.gateway, probe.key, timeout_s=10)
            targets = [_Target(ports.gateway_url(g), key, model) for g in range(2) for key in keys]
            origin_s = time.monotonic()

            async def take() -> SoakSample:
                return await _take_sample(session, ports, stack, watch, outcomes, origin_s)

            tasks.spawn(
                "engine-watch",
                _watch_engine(session, f"{ports.engine_url}/metrics", watch, stop_sampling),
                forever=False,
            )
            sampler = tasks.spawn(
                "sampler",
                _sample_every(sample_interval_s, samples, stop_sampling, take),
                forever=False,
            )
            load = [
                tasks.spawn(
                    f"client-{i}-{n}",
                    _steady_client(
                        session, outcomes, target, random.Random(rng.random()), stop_load
                    ),
                    forever=False,
                )
                for i, target in enumerate(targets)
                for n in range(math.ceil(OVERSUBSCRIPTION * pool.budget_slots / len(targets)))
            ]
            load.append(
                tasks.spawn(
                    "bad-requests",
                    _bad_requests(session, outcomes, targets, random.Random(seed + 1), stop_load),
                    forever=False,
                )
            )
            burst_size = pool.budget_slots + SOAK_QUEUE_DEPTH + 16
            load.append(
                tasks.spawn(
                    "bursts",
                    _bursts(
                        session,
                        outcomes,
                        targets,
                        burst_size,
                        min(30.0, duration_s / 3),
                        random.Random(seed + 2),
                        stop_load,
                    ),
                    forever=False,
                )
            )
            logger.info("soak: load running for %.0f s on %s", duration_s, ports)
            await asyncio.sleep(duration_s)
            stop_load.set()
            await asyncio.gather(*load)
            load_samples = list(samples)
            await _drain(take, samples, grace_s, sample_interval_s)
            stop_sampling.set()
            await sampler
            counters = await _gateway_counters(session, ports)
            summary = summarize(
                samples,
                load_samples,
                outcomes=outcomes,
                counters=counters,
                budget_slots=pool.budget_slots,
                engine_peak=watch.peak,
                duration_s=duration_s,
                exited=stack.failed(),
            )
        finally:
            stop_load.set()
            stop_sampling.set()
            await tasks.stop()
            await stack.stop()
    report = {"summary": summary, "samples": [asdict(s) for s in samples]}
    await asyncio.to_thread((out_dir / "soak.json").write_text, json.dumps(report, indent=2))
    await asyncio.to_thread(plot_soak, samples, pool.budget_slots, out_dir / "soak.png")
    return summary


def _print_summary(summary: Mapping[str, Any], out_dir: Path) -> None:
    print(f"soak: {summary['duration_s']:.0f} s, results in {out_dir}")
    print(f"  requests completed    {summary['requests_completed']} of {summary['requests_sent']}")
    print(f"  in-flight drift       {summary['in_flight_drift']}")
    print(f"  max in engine         {summary['max_in_engine']} (budget {summary['budget_slots']})")
    print(f"  outcomes by kind      {summary['outcomes_by_kind']}")
    for service, growth in summary["rss_growth"].items():
        print(
            f"  RSS {service:<13} {growth['start_mb']} -> {growth['end_mb']} MB "
            f"({growth['growth_mb']:+} MB, {growth['growth_percent']:+}%)"
        )
    for criterion, held in summary["criteria"].items():
        print(f"  [{'PASS' if held else 'FAIL'}] {criterion}")


def main(argv: Sequence[str] | None = None) -> int:
    """`slotshift soak [--config FILE] [--duration-s S] [--out-dir DIR]`; 0 when it passed."""
    parser = argparse.ArgumentParser(prog="slotshift soak", description=__doc__.splitlines()[0])
    parser.add_argument(
        "--config",
        type=Path,
        default=Path(os.environ.get("SLOTSHIFT_CONFIG", "deploy/local/slotshift.yaml")),
    )
    parser.add_argument("--duration-s", type=float, default=DEFAULT_DURATION_S)
    parser.add_argument("--sample-interval-s", type=float, default=SAMPLE_INTERVAL_S)
    parser.add_argument("--out-dir", type=Path, default=None)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    out_dir: Path = args.out_dir or Path("results") / (
        "soak-" + datetime.datetime.now(datetime.UTC).strftime("%Y%m%dT%H%M%SZ")
    )
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s")
    summary = asyncio.run(
        run_soak(
            load_config(args.config),
            args.duration_s,
            out_dir,
            sample_interval_s=args.sample_interval_s,
            seed=args.seed,
        )
    )
    _print_summary(summary, out_dir)
    return 0 if summary["passed"] else 1


if __name__ == "__main__":
    sys.exit(main())
