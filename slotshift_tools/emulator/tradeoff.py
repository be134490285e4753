"""What the step model allows: batch throughput against an interactive tenant's TTFT.

A step's duration grows with the batch (engine_sim/profiles.py). Giving the batch tenant more
slots makes more tokens per second, which is the whole gain of lending, and makes every step
longer. An interactive request's first token comes at the end of the step after the one it
arrives during, so its TTFT grows with the steps too. An admission policy decides only how many
batch requests run while the interactive tenant is active; it cannot make a step shorter.

This module measures that with the emulator's own EngineCore in virtual time: no HTTP, no event
loop, no other process, so no noise. For each batch size n it runs the interactive tenant
(Poisson arrivals) next to the batch tenant held at n requests in flight (closed loop, each
completion refilled at once), and measures the interactive tenant's TTFT and both tenants'
output throughput. From those points it bounds what any policy can reach for an interactive
tenant that is active for a fraction of the time: a policy that could switch at once (real ones
must wait for the batch tenant's requests to drain) runs the batch tenant at n while the
interactive one is active and at the whole budget minus the interactive tenant's floor while it
is idle; static runs it at its nominal share throughout.

    python -m slotshift_tools.emulator.tradeoff [--duration SECONDS] [--out DIR]
    slotshift bench-tradeoff ...

The defaults are bench/scenarios/seed.yaml's (a test keeps them equal).
"""

from __future__ import annotations

import argparse
import json
import math
import random
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path

from engine_sim.engine_core import EngineCore, RequestSpec
from engine_sim.profiles import DEFAULT_PROFILE, PROFILES
from engine_sim.tokens import synthetic_prompt_ids
from slotshift.config import EngineSimConfig
from slotshift_tools.bench.stats import percentile

INTERACTIVE = "interactive"
BATCH = "batch"


@dataclass(frozen=True)
class TradeoffSetup:
    """The two tenants and the budget (the defaults are seed.yaml's)."""

    budget_slots: int = 96
    static_batch_slots: int = 48
    """The batch tenant's nominal share: what static gives it at all times."""
    interactive_floor_slots: int = 4
    """What the interactive tenant keeps while idle: the batch tenant can have the rest."""
    interactive_rate_per_s: float = 8.0
    """Poisson arrivals while the interactive tenant is active."""
    interactive_active_fraction: float = 0.5
    """Fraction of the time it is active (seed.yaml: 5 s on, 5 s off)."""
    interactive_prompt_tokens: int = 64
    interactive_output_tokens: int = 64
    batch_prompt_tokens: int = 256
    batch_min_output_tokens: int = 448
    batch_max_output_tokens: int = 576


@dataclass(frozen=True)
class EnginePoint:
    """One steady state of the engine: the batch tenant at `batch_in_flight`."""

    batch_in_flight: int
    interactive: bool
    """Whether the interactive tenant was active."""
    batch_tokens_per_s: float
    interactive_tokens_per_s: float
    ttft_p50_ms: float | None
    ttft_p99_ms: float | None
    interactive_requests: int

    @property
    def total_tokens_per_s(self) -> float:
        return self.batch_tokens_per_s + self.interactive_tokens_per_s


@dataclass(frozen=True)
class PolicyBound:
    """The best a policy can do that runs the batch tenant at `batch_while_active` while the
    interactive tenant is active: its figures against static's."""

    batch_while_active: int
    batch_while_idle: int
    total_throughput_ratio: float
    ttft_p99_ratio: float


def measure_point(
    setup: TradeoffSetup,
    engine: EngineSimConfig,
    batch_in_flight: int,
    *,
    interactive: bool,
    duration_s: float,
    warmup_s: float,
    seed: int,
) -> EnginePoint:
    """Run the engine in virtual time for warmup_s + duration_s; measure over the last
    duration_s (tokens by when they are produced, TTFT of requests that arrive in it)."""
    core = EngineCore(engine)
    rng = random.Random(seed)
    rate = setup.interactive_rate_per_s if interactive else 0.0
    counter = 0

    def submit(tenant: str, prompt: int, output: int, at_s: float) -> None:
        nonlocal counter
        counter += 1
        request_id = f"{tenant}-{counter}"
        # Distinct prompts: the prefix cache must not turn a repeated prompt into a free prefill.
        ids = synthetic_prompt_ids(request_id, prompt)
        core.add_request(RequestSpec(request_id, ids, output, ignore_eos=True), at_s)

    def submit_batch(at_s: float) -> None:
        output = rng.randint(setup.batch_min_output_tokens, setup.batch_max_output_tokens)
        submit(BATCH, setup.batch_prompt_tokens, output, at_s)

    now_s = 0.0
    for _ in range(batch_in_flight):
        submit_batch(now_s)
    next_arrival_s = rng.expovariate(rate) if rate > 0 else math.inf
    end_s = warmup_s + duration_s
    tokens = {INTERACTIVE: 0, BATCH: 0}
    ttfts_ms: list[float] = []
    while now_s < end_s:
        while next_arrival_s <= now_s:
            submit(
                INTERACTIVE,
                setup.interactive_prompt_tokens,
                setup.interactive_output_tokens,
                next_arrival_s,
            )
            next_arrival_s += rng.expovariate(rate)
        if not core.has_work:
            now_s = next_arrival_s
            continue
        step = core.schedule(now_s)
        now_s += step.duration_s
        outcome = core.complete(step, now_s)
        for token in outcome.tokens:
            tenant = token.request_id.split("-", 1)[0]
            if now_s > warmup_s:
                tokens[tenant] += 1
            if (
                tenant == INTERACTIVE
                and token.index == 0
                and token.time_s - token.interval_s >= warmup_s
            ):
                ttfts_ms.append(token.interval_s * 1000.0)
        for finished in outcome.finished:
            if finished.request_id.startswith(BATCH):
                submit_batch(now_s)
    return EnginePoint(
        batch_in_flight=batch_in_flight,
        interactive=interactive,
        batch_tokens_per_s=tokens[BATCH] / duration_s,
        interactive_tokens_per_s=tokens[INTERACTIVE] / duration_s,
        ttft_p50_ms=percentile(ttfts_ms, 50) if ttfts_ms else None,
        ttft_p99_ms=percentile(ttfts_ms, 99) if ttfts_ms else None,
        interactive_requests=len(ttfts_ms),
    )


def policy_bounds(
    setup: TradeoffSetup, active: Sequence[EnginePoint], idle: Sequence[EnginePoint]
) -> list[PolicyBound]:
    """For each measured batch size while active: throughput and p99 TTFT against static's.

    `active` holds points with the interactive tenant active, among them the static share;
    `idle` the batch tenant alone at the static share and at budget minus the interactive floor.
    """
    by_size = {p.batch_in_flight: p for p in active}
    alone = {p.batch_in_flight: p for p in idle}
    idle_size = setup.budget_slots - setup.interactive_floor_slots
    static_active = by_size[setup.static_batch_slots]
    on = setup.interactive_active_fraction

    def throughput(while_active: EnginePoint, while_idle: EnginePoint) -> float:
        return on * while_active.total_tokens_per_s + (1 - on) * while_idle.total_tokens_per_s

    static = throughput(static_active, alone[setup.static_batch_slots])
    if static_active.ttft_p99_ms is None or static <= 0:
        raise ValueError("the static point measured no interactive request or no throughput")
    bounds = []
    for size in sorted(by_size):
        point = by_size[size]
        if point.ttft_p99_ms is None:
            continue
        bounds.append(
            PolicyBound(
                batch_while_active=size,
                batch_while_idle=idle_size,
                total_throughput_ratio=throughput(point, alone[idle_size]) / static,
                ttft_p99_ratio=point.ttft_p99_ms / static_active.ttft_p99_ms,
            )
        )
    return bounds


def batch_sizes(setup: TradeoffSetup, step: int = 4) -> list[int]:
    """Static's share, then every `step` slots up to budget minus the interactive floor."""
    top = setup.budget_slots - setup.interactive_floor_slots
    return sorted({*range(setup.static_batch_slots, top, step), top})


def format_table(active: Sequence[EnginePoint], bounds: Sequence[PolicyBound]) -> str:
    by_size = {b.batch_while_active: b for b in bounds}
    lines = [
        "| batch in flight while active | step-bound TTFT p50 (ms) | p99 (ms) | total (tok/s) "
        "| best total vs static | p99 TTFT vs static |",
        "| ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for point in active:
        bound = by_size.get(point.batch_in_flight)
        lines.append(
            f"| {point.batch_in_flight} | {point.ttft_p50_ms or 0:.1f} | {point.ttft_p99_ms or 0:.1f} "
            f"| {point.total_tokens_per_s:,.0f} "
            f"| {bound.total_throughput_ratio:.3f} | {bound.ttft_p99_ratio:.2f} |"
            if bound is not None
            else f"| {point.batch_in_flight} | - | - | - | - | - |"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Measure every batch size, print the table, write --out DIR/tradeoff.json."""
    parser = argparse.ArgumentParser(
        prog="slotshift bench-tradeoff",
        description="Throughput against interactive TTFT as the step model sets them, measured "
        "with the emulator's engine in virtual time (seed.yaml's tenants).",
    )
    parser.add_argument("--profile", default=DEFAULT_PROFILE, choices=sorted(PROFILES))
    parser.add_argument("--duration", type=float, default=300.0, help="virtual seconds per point")
    parser.add_argument("--warmup", type=float, default=30.0, help="virtual seconds per point")
    parser.add_argument("--seed", type=int, default=20250601)
    parser.add_argument("--out", type=Path, help="directory for tradeoff.json")
    args = parser.parse_args(argv)
    setup = TradeoffSetup()
    engine = EngineSimConfig.model_validate({"profile": args.profile})

    def point(size: int, interactive: bool) -> EnginePoint:
        return measure_point(
            setup,
            engine,
            size,
            interactive=interactive,
            duration_s=args.duration,
            warmup_s=args.warmup,
            seed=args.seed,
        )

    active = [point(size, True) for size in batch_sizes(setup)]
    idle_sizes = (setup.static_batch_slots, setup.budget_slots - setup.interactive_floor_slots)
    idle = [point(size, False) for size in idle_sizes]
    bounds = policy_bounds(setup, active, idle)
    print(
        f"profile {args.profile}, {args.duration:g} virtual seconds per point; the interactive "
        f"tenant active {setup.interactive_active_fraction:.0%} of the time; 'best' switches "
        f"at once to {idle_sizes[1]} batch requests while it is idle"
    )
    print(format_table(active, bounds))
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        report = {
            "profile": args.profile,
            "duration_s": args.duration,
            "warmup_s": args.warmup,
            "seed": args.seed,
            "setup": asdict(setup),
            "active": [asdict(p) for p in active],
            "idle": [asdict(p) for p in idle],
            "bounds": [asdict(b) for b in bounds],
        }
        path = args.out / "tradeoff.json"
        path.write_text(json.dumps(report, indent=2) + "\n")
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
