"""A gateway change's price in CPU per relayed event, measured side by side with a baseline: two
whole bench stacks (slotshift_tools/gateway_bench/processes.py), one from this checkout and one
from `--baseline` (another checkout, e.g. `git worktree add /tmp/base COMMIT`), under the same
load at the same moments, so that the ratio does not carry the machine's drift (on a shared
machine every process's CPU per event moves by tens of percent over minutes; the ratio of two
gateways measured in one window moves by about 1%).

    python scripts/gateway_side_by_side.py --baseline /tmp/base --reps 5

Per repetition and kind (the batch tenant's plain streams, the preemptible tenant's resumable
ones): `--streams` streams through each gateway at once, `--window-s` after a warm-up; each
gateway's CPU (/proc) over the events its clients received. Prints each window's figures and the
median ratio this checkout / baseline per kind. The services start from the current folder of
each stack (`python -m` puts it first on the path): run this from this checkout.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import statistics
import sys
import tempfile
from pathlib import Path

import aiohttp

from slotshift.clock import SystemClock
from slotshift_tools.gateway_bench import processes
from slotshift_tools.gateway_bench.measure import StreamLoad, Target, measure_together

WARMUP_S = 1.5
KINDS = {"plain": processes.BATCH, "preemptible": processes.PREEMPTIBLE}


async def compare(args: argparse.Namespace, out: Path) -> dict[str, list[float]]:
    """Per kind, each repetition's ratio of CPU per event, this checkout / baseline."""
    stacks: dict[str, tuple[processes.BenchProcesses, processes.Targets]] = {}
    here = Path.cwd()
    try:
        for name, root in (("baseline", args.baseline.resolve()), ("this", here)):
            os.chdir(root)  # the stack's services import the code of their current folder
            (out / name).mkdir()
            bench = processes.BenchProcesses(out / name, SystemClock(), ready_timeout_s=120)
            found = await bench.start(
                budget_slots=96, events_per_s=args.events_per_s, with_haproxy=False
            )
            stacks[name] = (bench, found)
        os.chdir(here)
        ratios: dict[str, list[float]] = {kind: [] for kind in KINDS}
        for rep in range(args.reps):
            for kind, tenant in KINDS.items():
                per_event = await _window(stacks, tenant, args)
                ratios[kind].append(per_event["this"] / per_event["baseline"])
                figures = ", ".join(f"{n} {v * 1e6:.2f}" for n, v in per_event.items())
                print(f"{rep} {kind}: ms per 1,000 events {figures}; ratio {ratios[kind][-1]:.3f}")
        return ratios
    finally:
        os.chdir(here)
        for bench, _ in stacks.values():
            await bench.stop()


async def _window(
    stacks: dict[str, tuple[processes.BenchProcesses, processes.Targets]],
    tenant: str,
    args: argparse.Namespace,
) -> dict[str, float]:
    """CPU seconds per relayed event of each stack's gateway over one window under one load."""
    loads = {
        name: StreamLoad(Target(name, found.gateway, found.keys), tenant, args.streams, 256)
        for name, (_, found) in stacks.items()
    }
    pids = {name: bench.pids["gateway"] for name, (bench, _) in stacks.items()}
    async with aiohttp.ClientSession() as session:
        windows, _ = await measure_together(
            {name: (session, load) for name, load in loads.items()},
            pids,
            SystemClock(),
            warmup_s=WARMUP_S,
            window_s=args.window_s,
        )
    for load in loads.values():
        if load.errors:
            raise SystemExit(f"stream errors: {load.errors[:3]}")
    return {name: window.cpu_s[name] / max(1, window.events) for name, window in windows.items()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--baseline", type=Path, required=True, help="the baseline's checkout")
    parser.add_argument("--reps", type=int, default=5, help="windows per kind (default 5)")
    parser.add_argument("--streams", type=int, default=10, help="per gateway (default 10)")
    parser.add_argument("--events-per-s", type=float, default=500.0, help="per stream")
    parser.add_argument("--window-s", type=float, default=10.0, help="(default 10)")
    args = parser.parse_args()
    if not (args.baseline / "slotshift_tools").is_dir():
        print(f"{args.baseline} is not a checkout of this project", file=sys.stderr)
        return 2
    with tempfile.TemporaryDirectory(prefix="gateway-side-by-side-") as folder:
        ratios = asyncio.run(compare(args, Path(folder)))
    medians = ", ".join(f"{kind} {statistics.median(r):.3f}" for kind, r in ratios.items())
    print(f"median ratio this / baseline: {medians}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
