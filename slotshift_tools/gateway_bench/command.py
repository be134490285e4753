"""`slotshift bench-gateway`: the command line, and the runs one after the other.

    slotshift bench-gateway --out DIR [--runs 3] [--pairs 2000] [--quick] [--no-haproxy]

Each run measures, in order: non-streamed latency, TTFT, and the TTFT's control, a non-streamed
request after as long an idle as the TTFT probe's stream has between its tokens (`--pairs`
interleaved requests per target each), CPU per 1,000 relayed events over `--window-s` of concurrent
streams (plain and preemptible tenants through the gateway, plain through the bare TCP relay of
tcp_relay.py, the floor under any Python proxy, through the least aiohttp relay of
aiohttp_relay.py, through the relay on asyncio protocols and llhttp of protocol_relay.py, and
through HAProxy, and direct for the upstream's and the harness's own
cost), and the interactive tenant's TTFT while the batch tenant streams `--batch-events-per-s`
through each proxy, and the price of token accounting: the mixed load of mix.py (plain, cut and
paused streams) through two gateways that differ only in `gateway.count_tokens`, each in front of a
pool of its own, both at once in one window. The headline figures are the medians over the runs.
Outputs in DIR: gateway.json, gateway.png, summary.md, the generated configs and every process's
log. Exit status: 0 when every run measured, 1 when a process failed or a request of the bench
failed, 2 for bad arguments.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import logging
import math
import os
import platform
import sys
from collections.abc import Mapping
from functools import partial
from pathlib import Path
from typing import Any

import aiohttp

from slotshift.clock import Clock, SystemClock
from slotshift_tools.gateway_bench.measure import (
    TTFT_MAX_TOKENS,
    BenchRequestError,
    Load,
    StreamLoad,
    Target,
    Window,
    measure_streams,
    measure_together,
    non_streamed_after_idle_s,
    non_streamed_s,
    paired_latency,
    ttft_s,
)
from slotshift_tools.gateway_bench.mix import MixLoad
from slotshift_tools.gateway_bench.processes import (
    BATCH,
    INTERACTIVE,
    MIX_GATEWAYS,
    PREEMPTIBLE,
    BenchProcessError,
    BenchProcesses,
    Targets,
    mix_pool,
)
from slotshift_tools.gateway_bench.report import cpu_figure, latency_figures, markdown_table, plot
from slotshift_tools.gateway_bench.report import summary as summarize
from slotshift_tools.metrics_scrape import scrape_samples

logger = logging.getLogger(__name__)

SATURATED_HOST_FRACTION = 0.9
"""Busy cores over a window, as a fraction of the host's CPUs, from which the window is marked
contended: the processes competed for the CPUs, so latency there is not the proxy's alone."""
HAPROXY_MISSING = (
    "haproxy is not installed: the HAProxy peer is left out (Debian: apt-get install haproxy)"
)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="slotshift bench-gateway",
        description="What the gateway adds to the data path (latency, CPU per relayed event, "
        "interference), side by side with direct to the engine and HAProxy.",
    )
    parser.add_argument("--out", type=Path, help="results folder (default results/gateway-<time>)")
    parser.add_argument("--runs", type=int, help="runs, the figures their medians (default 3)")
    parser.add_argument(
        "--pairs", type=int, help="sequential requests per target and kind, per run (default 2000)"
    )
    parser.add_argument(
        "--interference-pairs",
        type=int,
        help="interactive requests per target under batch load, per run (default 500)",
    )
    parser.add_argument("--window-s", type=float, help="each CPU window, seconds (default 10)")
    parser.add_argument(
        "--warmup-s", type=float, help="streams running before a window starts (default 1)"
    )
    parser.add_argument(
        "--events-per-s",
        type=float,
        default=500.0,
        help="the upstream's token events a second, per stream (default %(default)s)",
    )
    parser.add_argument(
        "--batch-events-per-s",
        type=float,
        help="the streams' events a second in total, in the CPU and interference windows "
        "(default 10000)",
    )
    parser.add_argument(
        "--stream-tokens",
        type=int,
        default=256,
        help="tokens of each stream of the CPU windows (default %(default)s)",
    )
    parser.add_argument(
        "--budget-slots", type=int, default=96, help="the pool's budget (default %(default)s)"
    )
    parser.add_argument("--no-haproxy", action="store_true", help="leave the HAProxy peer out")
    parser.add_argument(
        "--quick",
        action="store_true",
        help="a short run for tests: 1 run, 60 pairs, 2 s windows, 2,000 events/s",
    )
    parser.add_argument("--log-level", default=os.environ.get("SLOTSHIFT_LOG_LEVEL", "WARNING"))
    return parser


def resolve(args: argparse.Namespace) -> dict[str, Any]:
    """The settings, --quick's or the defaults where a flag is not given."""
    quick = args.quick
    settings = {
        "runs": args.runs or (1 if quick else 3),
        "pairs": args.pairs or (60 if quick else 2000),
        "interference_pairs": args.interference_pairs or (40 if quick else 500),
        "window_s": args.window_s or (2.0 if quick else 10.0),
        "warmup_s": args.warmup_s if args.warmup_s is not None else (0.5 if quick else 1.0),
        "events_per_s": args.events_per_s,
        "batch_events_per_s": args.batch_events_per_s or (2000.0 if quick else 10000.0),
        "stream_tokens": args.stream_tokens,
        "budget_slots": args.budget_slots,
        "haproxy": not args.no_haproxy,
        "quick": quick,
    }
    settings["streams"] = max(1, math.ceil(settings["batch_events_per_s"] / args.events_per_s))
    # The accounting mix (mix.py) in a pool of 12 slots (4 each): 3 batch streams, 8 preemptible
    # ones (4 of them on borrowed slots), and the interactive tenant's bursts of 4, which take
    # its share back and so pause 3 of the borrowed streams each time.
    settings |= {
        "mix_budget_slots": 12,
        "mix_batch_streams": 3,
        "mix_preemptible_streams": 8,
        "mix_burst_streams": 4,
        "mix_burst_interval_s": 1.5,
        "mix_warmup_s": 2.0 if not quick else 1.0,
        "mix_connections": 32,
    }
    return settings


def mix_load(target: Target, settings: Mapping[str, Any], max_tokens: int) -> MixLoad:
    """The accounting mix of `settings` (`resolve`) through `target`, streams of `max_tokens`."""
    return MixLoad(
        target,
        batch_streams=settings["mix_batch_streams"],
        preemptible_streams=settings["mix_preemptible_streams"],
        burst_streams=settings["mix_burst_streams"],
        max_tokens=max_tokens,
        burst_interval_s=settings["mix_burst_interval_s"],
    )


def _targets(found: Targets) -> list[Target]:
    targets = [
        Target("direct", found.direct, None),
        Target("gateway", found.gateway, found.keys),
        Target("tcp-relay", found.tcp_relay, found.keys),
        Target("aiohttp-relay", found.aiohttp_relay, found.keys),
        Target("protocol-relay", found.protocol_relay, found.keys),
    ]
    if found.haproxy is not None:
        targets.append(Target("haproxy", found.haproxy, found.keys))
    return targets


async def one_run(
    index: int,
    settings: dict[str, Any],
    targets: list[Target],
    mix_targets: dict[str, Target],
    processes: BenchProcesses,
    clock: Clock,
) -> dict[str, Any]:
    """Measure one run (module docstring); its document."""
    by_name = {t.name: t for t in targets}
    proxies = [t.name for t in targets if t.name != "direct"]
    connector_limit = settings["streams"] + 8
    sessions = {
        t.name: aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=connector_limit))
        for t in targets
    }
    try:
        run: dict[str, Any] = {
            "run": index,
            "latency": {},
            "cpu": {},
            "interference": {},
            "accounting": {},
        }
        contended: list[str] = []
        # A TTFT probe's stream idles between its tokens; the control idles as long before a
        # non-streamed request.
        stream_idle_s = (TTFT_MAX_TOKENS - 1) / settings["events_per_s"]
        after_idle = partial(non_streamed_after_idle_s, idle_s=stream_idle_s)
        for kind, probe in (
            ("non_streamed", non_streamed_s),
            ("ttft", ttft_s),
            ("non_streamed_after_idle", after_idle),
        ):
            samples = await paired_latency(
                sessions,
                targets,
                probe,
                settings["pairs"],
                clock,
                tenant=INTERACTIVE,
                rotation_offset=index,
            )
            run["latency"][kind] = {p: latency_figures(samples, p) for p in proxies}
            run["latency"][kind]["direct"] = {
                "p50_ms": run["latency"][kind][proxies[0]]["direct_p50_ms"],
                "p99_ms": run["latency"][kind][proxies[0]]["direct_p99_ms"],
                "requests": len(samples["direct"]),
            }
            processes.check_alive()

        pids = dict(processes.pids)
        windows: list[tuple[str, str, str]] = [("direct", BATCH, "upstream")]
        windows += [(p, BATCH, p) for p in proxies]
        if "gateway" in proxies:
            windows.append(("gateway", PREEMPTIBLE, "gateway"))
        for name, tenant, process in windows:
            load = StreamLoad(by_name[name], tenant, settings["streams"], settings["stream_tokens"])
            window, _ = await measure_streams(
                sessions[name],
                load,
                pids,
                clock,
                warmup_s=settings["warmup_s"],
                window_s=settings["window_s"],
            )
            _require_no_errors(load, f"{name} streams of {tenant}")
            document = window.to_json()
            kind = "preemptible" if tenant == PREEMPTIBLE else "plain"
            document["cpu_ms_per_1000_events"] = cpu_figure(document, process)
            document["stream_requests"] = load.requests
            run["cpu"].setdefault(name, {})[kind] = document
            if _contended(window):
                contended.append(f"cpu/{name}/{kind}")
            processes.check_alive()

        for proxy in proxies:
            load = StreamLoad(by_name[proxy], BATCH, settings["streams"], settings["stream_tokens"])
            pair = [by_name["direct"], by_name[proxy]]

            async def probes(pair: list[Target] = pair) -> dict[str, list[float]]:
                return await paired_latency(
                    sessions,
                    pair,
                    ttft_s,
                    settings["interference_pairs"],
                    clock,
                    tenant=INTERACTIVE,
                    rotation_offset=index,
                )

            window, samples = await measure_streams(
                sessions[proxy],
                load,
                pids,
                clock,
                warmup_s=settings["warmup_s"],
                window_s=0.0,
                during=probes,
            )
            _require_no_errors(load, f"{proxy} batch streams")
            figures: dict[str, Any] = dict(latency_figures(samples, proxy))
            figures["batch_window"] = window.to_json()
            run["interference"][proxy] = figures
            if _contended(window):
                contended.append(f"interference/{proxy}")
            processes.check_alive()
        # Both mix gateways carry the mix at once, each in a pool of its own: one window, so
        # that their ratio is measured at the same moments and not across the machine's drift.
        mixes = {
            name: mix_load(target, settings, settings["stream_tokens"])
            for name, target in mix_targets.items()
        }
        pauses_before = {name: await _pauses(target) for name, target in mix_targets.items()}
        mix_sessions = {
            name: aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=settings["mix_connections"])
            )
            for name in mixes
        }
        try:
            mix_windows, _ = await measure_together(
                {name: (mix_sessions[name], mixes[name]) for name in mixes},
                pids,
                clock,
                warmup_s=settings["mix_warmup_s"],
                window_s=settings["window_s"],
            )
        finally:
            for session in mix_sessions.values():
                await session.close()
        for name, mixed in mixes.items():
            _require_no_errors(mixed, f"{name} mix")
            document = mix_windows[name].to_json()
            document["cpu_ms_per_1000_events"] = cpu_figure(document, name)
            document |= {
                "requests": mixed.requests,
                "cut_by_client": mixed.cut,
                "bursts": mixed.bursts,
                "pauses": await _pauses(mix_targets[name]) - pauses_before[name],
                "count_tokens": MIX_GATEWAYS[name],
            }
            run["accounting"][name] = document
        if _contended(mix_windows[next(iter(mixes))]):
            contended.append("accounting")
        processes.check_alive()
        run["contended_windows"] = contended
        return run
    finally:
        for session in sessions.values():
            await session.close()


def _contended(window: Window) -> bool:
    """Whether the processes competed for the host's CPUs over `window`."""
    return window.host_busy_cores >= SATURATED_HOST_FRACTION * (os.cpu_count() or 1)


def _require_no_errors(load: Load, what: str) -> None:
    if load.errors:
        raise BenchRequestError(f"{what}: {load.errors[:3]}")


async def _pauses(target: Target) -> float:
    """Times the mix's gateway paused a request so far (its /metrics)."""
    async with aiohttp.ClientSession() as session:
        samples = await scrape_samples(session, f"{target.url}/metrics", timeout_s=5.0)
    return sum(
        value
        for labels, value in samples.get("slotshift_gateway_pauses_total", [])
        if labels.get("pool") == mix_pool(target.name) and labels.get("tenant") == PREEMPTIBLE
    )


async def run_bench(settings: dict[str, Any], out_dir: Path, clock: Clock) -> dict[str, Any]:
    """Start the processes, make the runs, stop; the whole document (also written to DIR)."""
    processes = BenchProcesses(out_dir, clock)
    peers: dict[str, Any] = {}
    try:
        found = await processes.start(
            budget_slots=settings["budget_slots"],
            events_per_s=settings["events_per_s"],
            with_haproxy=settings["haproxy"],
            mix_budget_slots=settings["mix_budget_slots"],
        )
        if found.haproxy is None:
            message = HAPROXY_MISSING if settings["haproxy"] else "left out (--no-haproxy)"
            peers["haproxy"] = {"available": False, "message": message}
            if settings["haproxy"]:
                logger.warning("%s", HAPROXY_MISSING)
        else:
            peers["haproxy"] = {"available": True, "version": processes.haproxy_version}
        targets = _targets(found)
        mix_targets = {name: Target(name, url, found.keys) for name, url in found.mix.items()}
        runs = []
        for index in range(settings["runs"]):
            logger.warning("run %d of %d", index + 1, settings["runs"])
            runs.append(await one_run(index, settings, targets, mix_targets, processes, clock))
    finally:
        await processes.stop()
    proxies = [t.name for t in targets if t.name != "direct"]
    document = {
        "settings": settings,
        "host": {
            "cpus": os.cpu_count(),
            "python": platform.python_version(),
            "loadavg_at_end": list(os.getloadavg()),
        },
        "peers": peers,
        "figures": summarize(runs, proxies),
        "runs": runs,
        "contended": any(run["contended_windows"] for run in runs),
    }
    await asyncio.to_thread(_write_outputs, out_dir, document)
    return document


def _write_outputs(out_dir: Path, document: dict[str, Any]) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "gateway.json").write_text(json.dumps(document, indent=2) + "\n", encoding="utf-8")
    table = markdown_table(document["figures"])
    (out_dir / "summary.md").write_text(table, encoding="utf-8")
    settings = document["settings"]
    plot(
        document["figures"],
        out_dir / "gateway.png",
        f"slotshift bench-gateway: medians of {settings['runs']} runs, "
        f"{settings['pairs']} pairs per target, {settings['batch_events_per_s']:g} events/s",
    )


def main(argv: list[str] | None = None) -> int:
    """`slotshift bench-gateway ARGS`; returns the exit status (module docstring)."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(), format="bench-gateway %(levelname)s %(message)s"
    )
    for name in ("runs", "pairs", "interference_pairs", "window_s", "warmup_s"):
        value = getattr(args, name)
        if value is not None and (value < 0 or (value == 0 and name != "warmup_s")):
            print(
                f"slotshift bench-gateway: --{name.replace('_', '-')} must be positive",
                file=sys.stderr,
            )
            return 2
    if args.events_per_s <= 0 or args.stream_tokens < 2:
        print(
            "slotshift bench-gateway: --events-per-s must be positive and --stream-tokens "
            "at least 2",
            file=sys.stderr,
        )
        return 2
    settings = resolve(args)
    # Absolute: the generated configs name files in it, read relative to the config's folder.
    out_dir = (
        args.out
        or Path("results") / ("gateway-" + datetime.datetime.now().strftime("%Y%m%d-%H%M%S"))
    ).resolve()
    out_dir.mkdir(parents=True, exist_ok=True)
    try:
        document = asyncio.run(run_bench(settings, out_dir, SystemClock()))
    except (BenchProcessError, BenchRequestError) as exc:
        print(f"slotshift bench-gateway: {exc}", file=sys.stderr)
        return 1
    haproxy = document["peers"]["haproxy"]
    if not haproxy["available"]:
        print(f"note: {haproxy['message']}")
    print(markdown_table(document["figures"]), end="")
    if document["contended"]:
        print(
            "note: the host's CPUs were saturated in some windows (contended_windows in the JSON)"
        )
    print(f"results in {out_dir}")
    return 0
