"""The fidelity benchmark: the real emulator at each calibration point, measured against the study.

For each point of slotshift_tools/emulator/calibration.py it starts an EngineSim on port 0 with the
chosen profile and drives it over HTTP (aiohttp) with closed-loop clients, as the point says: per tenant
`in_flight` clients, each sending a completion of `prompt_tokens` token ids (seeded random, distinct
for every request, so that the prefix cache never hits) with
max_tokens = `output_tokens` and ignore_eos, non-streamed, and sending the next as soon as one
completes. Each client's first request starts mid-cycle, at a different phase for each client:
the output it would already have generated is added to its prompt and taken off its max_tokens,
so the batch holds the steady state's mix of contexts from the first steps on. After a warm-up
(the first requests' long prefills), the output throughput is measured over the steady window
from the server's own `vllm:generation_tokens_total` (scraped over HTTP), and checked against
the published figure and the step model's steady-state prediction.

The benchmark runs clients and emulator in one process, on one event loop: the emulator keeps up
when the process's CPU stays below one core and the event loop lag stays well below a step.
Both are reported with each result.

    python -m slotshift_tools.emulator.fidelity [--profile NAME] [--duration SECONDS]
                                                [--warmup SECONDS] [--scenario NAME ...] [--out DIR]
"""

from __future__ import annotations

import argparse
import asyncio
import json
import math
import sys
import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import aiohttp

from engine_sim.profiles import DEFAULT_PROFILE, PROFILES, profile_named
from engine_sim.server import EngineSim
from engine_sim.tokens import synthetic_prompt_ids
from slotshift.aiotasks import Supervisor
from slotshift.clock import Clock, SystemClock
from slotshift.config import EngineSimConfig
from slotshift_tools.emulator.calibration import (
    CALIBRATION_POINTS,
    CalibrationPoint,
    ClosedLoopLoad,
    modelled_output_tokens_per_s,
)
from slotshift_tools.metrics_scrape import scrape_samples, summed

CALIBRATED_PROFILE = DEFAULT_PROFILE
"""The profile the calibration points were measured on; others have no published figure."""

DEFAULT_WARMUP_S = 3.0
"""Seconds of load before the steady window opens (initial prefills, phase spreading)."""

FIDELITY_TOLERANCE_PERCENT = 10.0
"""The goal: measured throughput within this much of each published figure."""

PROBE_PERIOD_S = 0.05
"""How often the event-loop lag probe wakes."""

GPU_SAMPLE_PERIOD_S = 1.0
"""How often the emulated GPU utilisation is scraped (it is itself a 1 s average)."""

GENERATION_TOKENS = "vllm:generation_tokens_total"
GPU_UTILIZATION = "slotshift_sim_gpu_utilization_percent"


@dataclass(frozen=True)
class FidelityResult:
    """One calibration point run on the emulator: throughput and whether the emulator kept up."""

    profile: str
    scenario: str
    published_output_tokens_per_s: float | None
    """The study's figure; None for a profile the points were not measured on."""
    modelled_output_tokens_per_s: float
    """What the profile's step model predicts for the point in steady state."""
    measured_output_tokens_per_s: float
    """Output tokens the emulator generated per second of the steady window (its counter)."""
    completed_output_tokens_per_s: float
    """Output tokens of the requests that completed in the window, per second (client side)."""
    completed_requests: int
    failed_requests: int
    window_s: float
    mean_step_ms: float
    """Steady window over the steps the engine ran in it."""
    mean_emulated_gpu_utilization_percent: float
    process_cpu_percent: float
    """CPU time of the whole benchmark process (emulator and clients) over the window, in
    percent of one core; near 100 the emulator may be falling behind its model."""
    max_event_loop_lag_ms: float

    @property
    def error_percent(self) -> float | None:
        """Measured against published, in percent; None without a published figure."""
        if self.published_output_tokens_per_s is None:
            return None
        return _percent(self.measured_output_tokens_per_s, self.published_output_tokens_per_s)

    @property
    def model_error_percent(self) -> float:
        """Measured against the step model's prediction, in percent (the emulator's overhead)."""
        return _percent(self.measured_output_tokens_per_s, self.modelled_output_tokens_per_s)

    @property
    def within_tolerance(self) -> bool:
        """Published figure (or, without one, the model) met within the fidelity goal."""
        error = self.error_percent
        if error is None:
            error = self.model_error_percent
        return abs(error) <= FIDELITY_TOLERANCE_PERCENT

    def to_json(self) -> dict[str, Any]:
        """The result as JSON-ready fields, the errors included."""
        return {
            **asdict(self),
            "error_percent": self.error_percent,
            "model_error_percent": self.model_error_percent,
            "within_tolerance": self.within_tolerance,
        }


async def run_fidelity(
    profile: str,
    duration_s: float,
    *,
    warmup_s: float = DEFAULT_WARMUP_S,
    points: Sequence[CalibrationPoint] = CALIBRATION_POINTS,
) -> list[FidelityResult]:
    """Run each calibration point on a fresh emulator with `profile`, one after another.

    duration_s is each point's steady window, after warmup_s of load. ValueError for an unknown
    profile (naming the known ones).
    """
    if duration_s <= 0 or warmup_s < 0:
        raise ValueError("duration_s must be positive and warmup_s not negative")
    config = _emulator_config(profile)
    return [await _run_point(config, point, duration_s, warmup_s) for point in points]


def _emulator_config(profile: str) -> EngineSimConfig:
    profile_named(profile)  # an unknown name fails here, naming the known ones
    return EngineSimConfig.model_validate({"profile": profile, "port": 0, "shutdown_grace_s": 0.5})


@dataclass
class _Tally:
    """What the clients of one run have seen so far."""

    completed_requests: int = 0
    completed_tokens: int = 0
    failed_requests: int = 0


@dataclass(frozen=True)
class _Snapshot:
    time_s: float
    cpu_s: float
    generation_tokens: float
    gpu_utilization_percent: float
    steps: int
    completed_requests: int
    completed_tokens: int
    failed_requests: int


class _Probe:
    """Event-loop lag and emulated GPU utilisation, sampled while the window is open."""

    def __init__(self, clock: Clock) -> None:
        self._clock = clock
        self.recording = False
        self.max_lag_s = 0.0
        self.gpu_samples: list[float] = []

    async def watch_lag(self) -> None:
        while True:
            before = self._clock.monotonic()
            await asyncio.sleep(PROBE_PERIOD_S)
            lag_s = self._clock.monotonic() - before - PROBE_PERIOD_S
            if self.recording:
                self.max_lag_s = max(self.max_lag_s, lag_s)

    async def sample_gpu(self, session: aiohttp.ClientSession, url: str) -> None:
        while True:
            await asyncio.sleep(GPU_SAMPLE_PERIOD_S)
            if self.recording:
                self.gpu_samples.append((await _scrape(session, url))[GPU_UTILIZATION])


async def _run_point(
    config: EngineSimConfig, point: CalibrationPoint, duration_s: float, warmup_s: float
) -> FidelityResult:
    clock = SystemClock()
    sim = EngineSim(config, clock=clock)
    await sim.start()
    tally = _Tally()
    probe = _Probe(clock)
    supervisor = Supervisor(f"fidelity/{point.scenario}")
    try:
        async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0)) as session:
            try:
                for load in point.tenants:
                    for index in range(load.in_flight):
                        supervisor.spawn(
                            f"{load.tenant}-{index}",
                            _closed_loop_client(
                                session,
                                sim.url,
                                sim.profile.model_name,
                                load,
                                _phase_tokens(load, index),
                                tally,
                                client=f"{load.tenant}-{index}",
                            ),
                        )
                supervisor.spawn("lag-probe", probe.watch_lag())
                supervisor.spawn("gpu-probe", probe.sample_gpu(session, sim.url))
                await asyncio.sleep(warmup_s)
                start = await _snapshot(session, sim, clock, tally)
                probe.recording = True
                await asyncio.sleep(duration_s)
                probe.recording = False
                end = await _snapshot(session, sim, clock, tally)
            finally:
                await supervisor.stop()
    finally:
        await sim.stop()
    if supervisor.failures:
        name, error = supervisor.failures[0]
        raise RuntimeError(f"fidelity client {name} failed") from error
    return _result(config.profile, point, start, end, probe)


def _result(
    profile: str, point: CalibrationPoint, start: _Snapshot, end: _Snapshot, probe: _Probe
) -> FidelityResult:
    window_s = end.time_s - start.time_s
    steps = end.steps - start.steps
    # The gauge is a 1 s average; the window's end is sampled too, so short windows have one.
    gpu_samples = [*probe.gpu_samples, end.gpu_utilization_percent]
    profile_costs = PROFILES[profile].step
    return FidelityResult(
        profile=profile,
        scenario=point.scenario,
        published_output_tokens_per_s=point.published_output_tokens_per_s
        if profile == CALIBRATED_PROFILE
        else None,
        modelled_output_tokens_per_s=modelled_output_tokens_per_s(point, profile_costs),
        measured_output_tokens_per_s=(end.generation_tokens - start.generation_tokens) / window_s,
        completed_output_tokens_per_s=(end.completed_tokens - start.completed_tokens) / window_s,
        completed_requests=end.completed_requests - start.completed_requests,
        failed_requests=end.failed_requests - start.failed_requests,
        window_s=window_s,
        mean_step_ms=window_s / steps * 1000.0 if steps else math.inf,
        mean_emulated_gpu_utilization_percent=sum(gpu_samples) / len(gpu_samples),
        process_cpu_percent=(end.cpu_s - start.cpu_s) / window_s * 100.0,
        max_event_loop_lag_ms=probe.max_lag_s * 1000.0,
    )


def _phase_tokens(load: ClosedLoopLoad, index: int) -> int:
    # Clients started together would finish together and the batch would breathe in lockstep;
    # spreading their first requests' phases evenly gives the steady state at once.
    return (index * load.output_tokens) // load.in_flight


async def _closed_loop_client(
    session: aiohttp.ClientSession,
    url: str,
    model: str,
    load: ClosedLoopLoad,
    phase_tokens: int,
    tally: _Tally,
    *,
    client: str,
) -> None:
    # Token ids, so the prompt is exactly as long as meant; with ignore_eos their values do not
    # matter, but they differ from request to request, so that the prefix cache finds nothing to
    # reuse, as in the study's measurements. The first request stands for one already
    # phase_tokens into its output.
    number = 0
    prompt = list(synthetic_prompt_ids(f"{client}-{number}", load.prompt_tokens + phase_tokens))
    max_tokens = load.output_tokens - phase_tokens
    while True:
        body = {
            "model": model,
            "prompt": prompt,
            "max_tokens": max_tokens,
            "ignore_eos": True,
            "stream": False,
        }
        output_tokens: int | None = None
        try:
            async with session.post(f"{url}/v1/completions", json=body) as response:
                payload = await response.json()
                if response.status == 200:
                    output_tokens = int(payload["usage"]["completion_tokens"])
        except aiohttp.ClientError:
            pass  # counted as failed below, as vllm bench serve counts it
        if output_tokens is None:
            tally.failed_requests += 1
        else:
            tally.completed_requests += 1
            tally.completed_tokens += output_tokens
        number += 1
        prompt = list(synthetic_prompt_ids(f"{client}-{number}", load.prompt_tokens))
        max_tokens = load.output_tokens


async def _snapshot(
    session: aiohttp.ClientSession, sim: EngineSim, clock: Clock, tally: _Tally
) -> _Snapshot:
    values = await _scrape(session, sim.url)
    return _Snapshot(
        time_s=clock.monotonic(),
        cpu_s=time.process_time(),
        generation_tokens=values[GENERATION_TOKENS],
        gpu_utilization_percent=values[GPU_UTILIZATION],
        steps=sim.engine.core.steps_total,
        completed_requests=tally.completed_requests,
        completed_tokens=tally.completed_tokens,
        failed_requests=tally.failed_requests,
    )


async def _scrape(session: aiohttp.ClientSession, url: str) -> dict[str, float]:
    """The emulator's figures the benchmark reads, by name."""
    samples = await scrape_samples(session, f"{url}/metrics")
    figures = {}
    for name in (GENERATION_TOKENS, GPU_UTILIZATION):
        value = summed(samples, name)
        if value is None:
            raise RuntimeError(f"the emulator's /metrics has no {name}")
        figures[name] = value
    return figures


def _percent(value: float, reference: float) -> float:
    return (value - reference) / reference * 100.0


def format_table(results: Sequence[FidelityResult]) -> str:
    """A markdown table: scenario | published | modelled | measured | error % | ..."""
    lines = [
        "| scenario | published tok/s | modelled tok/s | measured tok/s | error % "
        "| vs model % | mean step ms | cpu % | max loop lag ms |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for result in results:
        published = result.published_output_tokens_per_s
        error = result.error_percent
        lines.append(
            f"| {result.scenario} "
            f"| {'n/a' if published is None else f'{published:,.0f}'} "
            f"| {result.modelled_output_tokens_per_s:,.0f} "
            f"| {result.measured_output_tokens_per_s:,.0f} "
            f"| {'n/a' if error is None else f'{error:+.1f}'} "
            f"| {result.model_error_percent:+.1f} "
            f"| {result.mean_step_ms:.2f} "
            f"| {result.process_cpu_percent:.0f} "
            f"| {result.max_event_loop_lag_ms:.1f} |"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    """Run the benchmark, print the table, write --out DIR/fidelity.json; 1 if a point misses."""
    parser = argparse.ArgumentParser(
        prog="slotshift bench-fidelity",
        description="Run the emulator at the study's calibration points and compare.",
    )
    parser.add_argument("--profile", default=DEFAULT_PROFILE, choices=sorted(PROFILES))
    parser.add_argument(
        "--duration", type=float, default=20.0, help="steady window per point, seconds"
    )
    parser.add_argument("--warmup", type=float, default=DEFAULT_WARMUP_S, help="seconds")
    parser.add_argument("--out", type=Path, help="directory for fidelity.json")
    parser.add_argument(
        "--scenario",
        action="append",
        choices=[point.scenario for point in CALIBRATION_POINTS],
        help="run only this calibration point (repeatable; default: all)",
    )
    args = parser.parse_args(argv)

    chosen = args.scenario or [point.scenario for point in CALIBRATION_POINTS]
    points = [point for point in CALIBRATION_POINTS if point.scenario in chosen]
    results = asyncio.run(
        run_fidelity(args.profile, args.duration, warmup_s=args.warmup, points=points)
    )
    print(
        f"emulator fidelity, profile {args.profile}: {args.duration:g} s steady window per "
        f"point after {args.warmup:g} s warm-up (goal: within {FIDELITY_TOLERANCE_PERCENT:g}%)"
    )
    print(format_table(results))
    if args.out is not None:
        args.out.mkdir(parents=True, exist_ok=True)
        report = {
            "profile": args.profile,
            "duration_s": args.duration,
            "warmup_s": args.warmup,
            "tolerance_percent": FIDELITY_TOLERANCE_PERCENT,
            "results": [result.to_json() for result in results],
        }
        path = args.out / "fidelity.json"
        path.write_text(json.dumps(report, indent=2) + "\n")
        print(f"wrote {path}")
    return 0 if all(result.within_tolerance for result in results) else 1


if __name__ == "__main__":
    sys.exit(main())
