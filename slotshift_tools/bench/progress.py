"""The progress display: one plain line per second while a run goes (no terminal control)."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Mapping
from typing import TextIO

from slotshift_tools.bench.load import TenantCounters
from slotshift_tools.bench.sampler import Sample


def progress_line(
    run: str,
    elapsed_s: float,
    *,
    warmup_s: float,
    total_s: float,
    counters: Mapping[str, TenantCounters],
    sample: Sample | None,
) -> str:
    """`[demand]  42/100 s steady | done A=812 B=96 | out A=48 B=128 | limits A=30 B=66 | ...`"""
    phase = "warm-up" if elapsed_s < warmup_s else "steady"
    done = " ".join(f"{t}={c.completed}" for t, c in counters.items())
    outstanding = " ".join(f"{t}={c.outstanding}" for t, c in counters.items())
    failed = sum(c.failed for c in counters.values())
    parts = [
        f"[{run}] {elapsed_s:5.0f}/{total_s:.0f} s {phase:<7}",
        f"done {done}",
        f"out {outstanding}",
    ]
    if sample is not None and sample.limits:
        parts.append("limits " + " ".join(f"{t}={v}" for t, v in sample.limits.items()))
    if sample is not None and sample.gpu_utilization_pct is not None:
        label = " (emulated)" if sample.gpu_emulated else ""
        parts.append(f"gpu {sample.gpu_utilization_pct:3.0f}%{label}")
    if failed:
        parts.append(f"failed {failed}")
    return " | ".join(parts)


async def show_progress(line: Callable[[], str], out: TextIO, interval_s: float = 1.0) -> None:
    """Print `line()` every interval until cancelled."""
    while True:
        await asyncio.sleep(interval_s)
        print(line(), file=out, flush=True)
