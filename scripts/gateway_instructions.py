"""User-space instructions the gateway spends per relayed event, counted by callgrind: a
deterministic A/B for changes too small for `slotshift bench-gateway`'s CPU windows to resolve on
a shared machine (its side-by-side ratios move by +-10% there; instruction counts by about 1%).

    python scripts/gateway_instructions.py --streams plain --count-tokens on
    python scripts/gateway_instructions.py --streams plain --count-tokens off

It starts the bench's processes (slotshift_tools/gateway_bench/processes.py) with the main
gateway under `valgrind --tool=callgrind` (Debian's `valgrind`), runs `--streams` concurrent
streams of the batch (plain) or preemptible tenant through it at `--events-per-s` each, turns
instrumentation on for `--window-s` after a warm-up, and prints the gateway's instructions per
event received by the client. System calls and the kernel's work are not counted: the figure is
the Python and C the gateway runs. Run it from the checkout to measure (`python -m` starts the
services from the current folder).
"""

from __future__ import annotations

import argparse
import asyncio
import re
import shutil
import sys
import tempfile
from pathlib import Path
from typing import Any

import aiohttp

from slotshift.clock import SystemClock
from slotshift_tools.gateway_bench import processes
from slotshift_tools.gateway_bench.measure import StreamLoad, Target

WARMUP_S = 3.0


def _callgrind_totals(path: Path) -> int:
    """The instructions a callgrind output file counted (its `totals:` or summed `summary:`)."""
    text = path.read_text()
    found = re.search(r"^totals:\s+(\d+)", text, re.MULTILINE)
    if found is not None:
        return int(found.group(1))
    return sum(int(m) for m in re.findall(r"^summary:\s+(\d+)", text, re.MULTILINE))


async def _instrument(pid: int, state: str) -> None:
    """Turn callgrind's counting in process `pid` on or off."""
    control = await asyncio.create_subprocess_exec("callgrind_control", "-i", state, str(pid))
    if await control.wait() != 0:
        raise SystemExit(f"callgrind_control -i {state} failed")


async def measure(args: argparse.Namespace, out: Path) -> tuple[int, int]:
    """(instructions, events) over the window."""
    config_data = processes.stack_config_data
    service_argv = processes._service_argv

    def data(**kw: Any) -> dict[str, Any]:
        document = config_data(**kw)
        document["gateway"]["count_tokens"] = args.count_tokens == "on"
        return document

    def argv(service: str, config: Path) -> list[str]:
        command = service_argv(service, config)
        if service == "gateway" and config.name == "slotshift.yaml":
            pattern = str(out / "callgrind.%p")
            return ["valgrind", "--tool=callgrind", "--instr-atstart=no",
                    f"--callgrind-out-file={pattern}", *command]  # fmt: skip
        return command

    processes.stack_config_data = data
    processes._service_argv = argv  # type: ignore[assignment]
    bench = processes.BenchProcesses(out, SystemClock(), ready_timeout_s=300)
    found = await bench.start(budget_slots=96, events_per_s=args.events_per_s, with_haproxy=False)
    pid = bench.pids["gateway"]
    tenant = processes.PREEMPTIBLE if args.streams == "preemptible" else processes.BATCH
    load = StreamLoad(Target("gateway", found.gateway, found.keys), tenant, args.count, 256)
    try:
        async with aiohttp.ClientSession() as session:
            load.start(session)
            await asyncio.sleep(WARMUP_S)
            await _instrument(pid, "on")
            before = load.counter.events
            await asyncio.sleep(args.window_s)
            events = load.counter.events - before
            await _instrument(pid, "off")
            await load.stop()
    finally:
        await bench.stop()
    if load.errors:
        raise SystemExit(f"stream errors: {load.errors[:3]}")
    files = await asyncio.to_thread(lambda: list(out.glob(f"callgrind.{pid}*")))
    return sum(_callgrind_totals(p) for p in files), events


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--streams", choices=("plain", "preemptible"), default="plain")
    parser.add_argument("--count-tokens", choices=("on", "off"), default="on")
    parser.add_argument("--count", type=int, default=4, help="concurrent streams (default 4)")
    parser.add_argument("--events-per-s", type=float, default=50.0, help="per stream (default 50)")
    parser.add_argument("--window-s", type=float, default=6.0, help="counted window (default 6)")
    args = parser.parse_args()
    if shutil.which("valgrind") is None:
        print("valgrind is not installed (Debian: apt-get install valgrind)", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="gateway-instructions-") as folder:
        instructions, events = asyncio.run(measure(args, Path(folder)))
    print(
        f"streams={args.streams} count_tokens={args.count_tokens} events={events} "
        f"instructions_per_event={instructions / max(1, events):.0f}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
