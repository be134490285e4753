"""CPU per non-streamed request of each proxy of `slotshift bench-gateway`, read off /proc: where a
request's added latency goes, for the gateway, the least aiohttp relay (aiohttp_relay.py: what a
proxy on aiohttp's server and client pays before any work of its own), the bare TCP relay, the
relay on asyncio protocols and llhttp (protocol_relay.py, when httptools is installed) and HAProxy
(when installed).

    python scripts/gateway_request_cpu.py --requests 3000 [--out FILE.json]

It starts the bench's processes (slotshift_tools/gateway_bench/processes.py) and, per target in
turn, sends the bench's non-streamed latency probe (measure.non_streamed_s) `--requests` times one
after the other after a warm-up; each target's process CPU over them (user and system, as the
bench's CPU windows read it) per request, and the requests' mean wall time. A sequential load
keeps every process mostly idle, so the figures are each request's own cost; the machine's day is
in them, as in every absolute figure: compare targets measured in one run. Run it from the
checkout to measure (`python -m` starts the services from the current folder).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

import aiohttp

from slotshift.clock import SystemClock
from slotshift_tools.gateway_bench import processes
from slotshift_tools.gateway_bench.measure import Target, cpu_mark, non_streamed_s

WARMUP_REQUESTS = 100


async def measure(requests: int, out: Path) -> dict[str, dict[str, float]]:
    """Per target: CPU microseconds and wall milliseconds per request."""
    clock = SystemClock()
    bench = processes.BenchProcesses(out, clock, ready_timeout_s=300)
    found = await bench.start(budget_slots=96, events_per_s=500.0, with_haproxy=True)
    targets = [
        ("gateway", found.gateway),
        ("aiohttp-relay", found.aiohttp_relay),
        ("tcp-relay", found.tcp_relay),
        ("protocol-relay", found.protocol_relay),
    ]
    if found.haproxy is not None:
        targets.append(("haproxy", found.haproxy))
    figures: dict[str, dict[str, float]] = {}
    try:
        for name, url in targets:
            target = Target(name, url, found.keys)
            pids = {name: bench.pids[name]}
            async with aiohttp.ClientSession() as session:
                for _ in range(WARMUP_REQUESTS):
                    await non_streamed_s(session, target, processes.INTERACTIVE, clock)
                before = cpu_mark(pids, clock)
                for _ in range(requests):
                    await non_streamed_s(session, target, processes.INTERACTIVE, clock)
                after = cpu_mark(pids, clock)
            figures[name] = {
                "cpu_us_per_request": (after.processes_s[name] - before.processes_s[name])
                / requests
                * 1e6,
                "wall_ms_per_request": (after.at_s - before.at_s) / requests * 1e3,
            }
    finally:
        await bench.stop()
    return figures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--requests", type=int, default=3000, help="per target (default 3000)")
    parser.add_argument("--out", type=Path, help="also write the figures to this JSON file")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="gateway-request-cpu-") as folder:
        figures = asyncio.run(measure(args.requests, Path(folder)))
    for name, values in figures.items():
        print(
            f"{name}: {values['cpu_us_per_request']:.0f} us of CPU a request, "
            f"{values['wall_ms_per_request']:.3f} ms a request"
        )
    if args.out is not None:
        document: dict[str, Any] = {"requests_per_target": args.requests, "figures": figures}
        args.out.write_text(json.dumps(document, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
