"""User-space instructions the gateway spends per relayed event, counted by callgrind: a
deterministic A/B for changes too small for `slotshift bench-gateway`'s CPU windows to resolve on
a shared machine (its side-by-side ratios move by +-10% there; instruction counts by about 1%).

    python scripts/gateway_instructions.py --streams plain --count-tokens on
    python scripts/gateway_instructions.py --streams plain --count-tokens off
    python scripts/gateway_instructions.py --streams mix --count-tokens on --events-per-s 20
    python scripts/gateway_instructions.py --streams requests

It starts the bench's processes (slotshift_tools/gateway_bench/processes.py) with one gateway
under `valgrind --tool=callgrind` (Debian's `valgrind`), turns instrumentation on for
`--window-s` after a warm-up, and prints that gateway's instructions per event received by the
clients. `plain` and `preemptible`: `--count` concurrent streams of the batch or the preemptible
tenant through the main gateway (tokens counted as `--count-tokens` says), at `--events-per-s`
each. `mix`: the accounting mix of `slotshift bench-gateway` (gateway_bench/mix.py: plain streams,
some cut by their client, preemptible ones on borrowed slots that the interactive tenant's bursts
pause) through the mix gateway that counts tokens (`on`) or the one that does not (`off`).
`requests`: the bench's non-streamed latency probe, one request after the other (the figure is
then instructions per request).
System calls and the kernel's work are not counted: the figure is the Python and C the gateway
runs. Run it from the checkout to measure (`python -m` starts the
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
from slotshift_tools.gateway_bench import command, processes
from slotshift_tools.gateway_bench.measure import StreamLoad, Target, non_streamed_s
from slotshift_tools.gateway_bench.mix import MixLoad

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


async def measure(args: argparse.Namespace, out: Path) -> tuple[int, int, int]:
    """(instructions, events, requests ended) over the window."""
    config_data = processes.stack_config_data
    service_argv = processes._service_argv

    mix_gateway = "gateway-mix-counted" if args.count_tokens == "on" else "gateway-mix-uncounted"
    measured_config = f"slotshift-{mix_gateway}.yaml" if args.streams == "mix" else "slotshift.yaml"

    def data(**kw: Any) -> dict[str, Any]:
        document = config_data(**kw)
        document["gateway"]["count_tokens"] = args.count_tokens == "on"
        return document

    def argv(service: str, config: Path) -> list[str]:
        command = service_argv(service, config)
        if service == "gateway" and config.name == measured_config:
            pattern = str(out / "callgrind.%p")
            return ["valgrind", "--tool=callgrind", "--instr-atstart=no",
                    f"--callgrind-out-file={pattern}", *command]  # fmt: skip
        return command

    processes.stack_config_data = data
    processes._service_argv = argv  # type: ignore[assignment]
    bench = processes.BenchProcesses(out, SystemClock(), ready_timeout_s=300)
    found = await bench.start(budget_slots=96, events_per_s=args.events_per_s, with_haproxy=False)
    load: StreamLoad | MixLoad | _Sequential
    if args.streams == "requests":
        pid = bench.pids["gateway"]
        load = _Sequential(Target("gateway", found.gateway, found.keys))
    elif args.streams == "mix":
        pid = bench.pids[mix_gateway]
        # The bench's mix, at the pace and length set here.
        settings = command.resolve(command.build_parser().parse_args([]))
        target = Target(mix_gateway, found.mix[mix_gateway], found.keys)
        load = command.mix_load(target, settings, args.max_tokens)
    else:
        pid = bench.pids["gateway"]
        tenant = processes.PREEMPTIBLE if args.streams == "preemptible" else processes.BATCH
        target = Target("gateway", found.gateway, found.keys)
        load = StreamLoad(target, tenant, args.count, args.max_tokens)
    try:
        async with aiohttp.ClientSession() as session:
            load.start(session)
            await asyncio.sleep(WARMUP_S)
            await _instrument(pid, "on")
            before, requests_before = load.counter.events, load.requests
            await asyncio.sleep(args.window_s)
            events, requests = load.counter.events - before, load.requests - requests_before
            await _instrument(pid, "off")
            await load.stop()
    finally:
        await bench.stop()
    if load.errors:
        raise SystemExit(f"stream errors: {load.errors[:3]}")
    files = await asyncio.to_thread(lambda: list(out.glob(f"callgrind.{pid}*")))
    return sum(_callgrind_totals(p) for p in files), events, requests


class _Sequential:
    """Non-streamed completions of the interactive tenant, one after the other; each counts as
    one event."""

    def __init__(self, target: Target) -> None:
        self._target = target
        self.counter = self
        self.events = self.requests = 0
        self.errors: list[str] = []
        self._task: asyncio.Task[None] | None = None

    def start(self, session: aiohttp.ClientSession) -> None:
        self._task = asyncio.create_task(self._run(session), name="sequential-requests")

    async def stop(self) -> None:
        if self._task is not None:
            self._task.cancel()
            await asyncio.gather(self._task, return_exceptions=True)

    async def _run(self, session: aiohttp.ClientSession) -> None:
        clock = SystemClock()
        while True:
            try:
                await non_streamed_s(session, self._target, processes.INTERACTIVE, clock)
            except Exception as exc:
                self.errors.append(repr(exc))
            self.events += 1
            self.requests += 1


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--streams", choices=("plain", "preemptible", "mix", "requests"), default="plain"
    )
    parser.add_argument("--count-tokens", choices=("on", "off"), default="on")
    parser.add_argument("--count", type=int, default=4, help="concurrent streams (default 4)")
    parser.add_argument("--events-per-s", type=float, default=50.0, help="per stream (default 50)")
    parser.add_argument("--window-s", type=float, default=6.0, help="counted window (default 6)")
    parser.add_argument("--max-tokens", type=int, default=256, help="per stream (default 256)")
    parser.add_argument(
        "--keep",
        type=Path,
        help="copy the callgrind files to this folder (read them with callgrind_annotate)",
    )
    args = parser.parse_args()
    if shutil.which("valgrind") is None:
        print("valgrind is not installed (Debian: apt-get install valgrind)", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="gateway-instructions-") as folder:
        instructions, events, requests = asyncio.run(measure(args, Path(folder)))
        if args.keep is not None:
            args.keep.mkdir(parents=True, exist_ok=True)
            for found in Path(folder).glob("callgrind.*"):
                shutil.copy(found, args.keep / found.name)
    print(
        f"streams={args.streams} count_tokens={args.count_tokens} events={events} "
        f"requests={requests} instructions_per_event={instructions / max(1, events):.0f}"
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
