"""The `slotshift` command: one subcommand per service, `up` for the local stack, `state` for
the control plane's state store.

Environment variables and flags are read here and nowhere else; they become config overrides
(`--set section.field=value`, values parsed as YAML) before the services see the config.
"""

from __future__ import annotations

import argparse
import asyncio
import os
import signal
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

from slotshift.config import (
    ConfigError,
    ConfigSource,
    SlotshiftConfig,
    parse_overrides,
)
from slotshift_tools.logs import configure_logging

DEFAULT_CONFIG = "deploy/local/slotshift.yaml"

EVENT_LOOPS = ("uvloop", "asyncio")
"""The event loops a service may run on (--event-loop)."""

ServiceRun = Callable[..., Awaitable[None]]


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="slotshift",
        description="Share one LLM inference server's slots among tenants, zero-sum.",
    )
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument(
        "--config",
        type=Path,
        default=Path(os.environ.get("SLOTSHIFT_CONFIG", DEFAULT_CONFIG)),
        help="the YAML config file every service reads (env SLOTSHIFT_CONFIG; default %(default)s)",
    )
    common.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="SECTION.FIELD=VALUE",
        help="override one config field, e.g. --set gateway.port=8081 (repeatable)",
    )
    common.add_argument(
        "--event-loop",
        choices=EVENT_LOOPS,
        default=os.environ.get("SLOTSHIFT_EVENT_LOOP", "uvloop"),
        help="a service's event loop (with up: every service's): uvloop (libuv; less CPU per "
        "message) or asyncio's own (env SLOTSHIFT_EVENT_LOOP; default %(default)s)",
    )
    common.add_argument(
        "--log-level",
        default=os.environ.get("SLOTSHIFT_LOG_LEVEL", "INFO"),
        help="DEBUG, INFO, WARNING or ERROR (env SLOTSHIFT_LOG_LEVEL; default %(default)s)",
    )
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    commands.add_parser("controlplane", parents=[common], help="run the control plane")
    gateway = commands.add_parser("gateway", parents=[common], help="run one admission gateway")
    gateway.add_argument(
        "--gateway-id",
        default=os.environ.get("SLOTSHIFT_GATEWAY_ID"),
        help="this replica's id (env SLOTSHIFT_GATEWAY_ID; default host name and port)",
    )
    gateway.add_argument("--port", type=int, help="HTTP port (overrides gateway.port)")
    agent = commands.add_parser("agent", parents=[common], help="run the telemetry agent")
    agent.add_argument(
        "--agent-id",
        default=os.environ.get("SLOTSHIFT_AGENT_ID"),
        help="this agent's id (env SLOTSHIFT_AGENT_ID; default the host name)",
    )
    commands.add_parser("engine-sim", parents=[common], help="run the vLLM emulator")
    commands.add_parser(
        "soak",
        add_help=False,
        help="run the stack under mixed load (10 minutes by default); report drift, RSS, errors",
    )
    commands.add_parser(
        "bench-scale",
        add_help=False,
        help="one real control plane against many simulated gateways: its cost, decision times "
        "and the budget at every instant, over a grid of tenants x gateways",
    )
    commands.add_parser(
        "bench-gateway",
        add_help=False,
        help="what the gateway adds to the data path (latency, CPU per relayed event, "
        "interference), side by side with direct to the engine and HAProxy",
    )
    commands.add_parser(
        "bench-fidelity",
        add_help=False,
        help="run the emulator at the study's calibration points; print measured vs published",
    )
    commands.add_parser(
        "bench-tradeoff",
        add_help=False,
        help="batch throughput against interactive TTFT as the step model sets them "
        "(the emulator's engine in virtual time)",
    )
    up = commands.add_parser(
        "up",
        parents=[common],
        help="run the whole local stack (emulator, control plane, agent, gateways)",
    )
    up.add_argument(
        "--demo",
        action="store_true",
        help="run a short demo load, print how the slots moved, then stop the stack",
    )
    up.add_argument(
        "--demo-duration-s",
        type=float,
        default=24.0,
        help="length of the demo load in seconds (default %(default)s)",
    )
    up.add_argument(
        "--engine",
        choices=["emulator", "vllm"],
        help="the engine to start: the emulator, or real vLLM on the CPU with a tiny local model "
        "(slotshift_tools/vllm_cpu; builds its venv the first time); default local_stack.engine",
    )
    state = commands.add_parser(
        "state",
        parents=[common],
        help="show or reset what the control plane's state store holds over the config file",
    )
    state.add_argument(
        "action",
        choices=["show", "reset"],
        help="show: the stored admin changes and counters; reset: delete the stored changes "
        "(stop the control plane first; the next start runs the config file as it is)",
    )
    state.add_argument("--pool", help="only this pool (default: every pool)")
    _add_bench_parser(commands)
    _add_simulate_parser(commands)
    return parser


def _add_simulate_parser(commands: Any) -> None:
    simulate = commands.add_parser(
        "simulate",
        help="run a benchmark scenario in the deterministic twin: the production policies, "
        "placement and admission against the emulator's engine, in virtual time",
    )
    simulate.add_argument("scenario", type=Path, help="the scenario file (bench/scenarios/*.yaml)")
    simulate.add_argument(
        "--duration",
        type=float,
        metavar="SECONDS",
        help="steady window of each run (default: the scenario's steady_s)",
    )
    simulate.add_argument(
        "--warmup",
        type=float,
        metavar="SECONDS",
        help="warm-up of each run (default: the scenario's, shortened with a shorter --duration)",
    )
    simulate.add_argument(
        "--out",
        type=Path,
        metavar="DIR",
        help="results folder (default results/<scenario>-twin-<timestamp>/)",
    )
    simulate.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="SECTION.FIELD=VALUE",
        help="override a field of every run's stack config (repeatable)",
    )
    simulate.add_argument(
        "--runs",
        type=lambda text: [name.strip() for name in text.split(",") if name.strip()],
        metavar="NAME[,NAME]",
        help="simulate only these of the scenario's runs",
    )
    simulate.add_argument(
        "--transit-ms",
        type=float,
        default=1.0,
        help="one-way gateway <-> control plane delay in ms (default %(default)s)",
    )
    simulate.add_argument(
        "--step-by-step",
        action="store_true",
        help="run every engine step instead of jumping over decode runs (the same figures, slower)",
    )
    simulate.add_argument(
        "--frontier",
        action="store_true",
        help="print F(a), the most output throughput any schedule of limits reaches at every "
        "tenant's SLO attainment >= a (feasible and upper bound), with where each policy lands",
    )
    simulate.add_argument(
        "--window-offsets",
        type=int,
        metavar="K",
        help="with --frontier: score every schedule and policy on K windows, their starts "
        "--window-step apart, and take the means (default 8; 1: the bench's one window)",
    )
    simulate.add_argument(
        "--window-step",
        type=float,
        metavar="SECONDS",
        help="with --frontier: seconds between the windows' starts (default 2)",
    )
    simulate.add_argument(
        "--replay",
        type=Path,
        nargs="+",
        metavar="LOG",
        help="replay these request logs (gateway.request_log files, several gateways' and "
        "rotated parts merged by arrival) instead of the scenario's arrivals; the run lasts "
        "the log's span",
    )
    simulate.add_argument(
        "--replay-pool",
        metavar="POOL",
        help="with --replay: the pool whose requests are replayed (default: the log's only one)",
    )
    simulate.add_argument(
        "--log-level",
        default=os.environ.get("SLOTSHIFT_LOG_LEVEL", "WARNING"),
        help="log level (default %(default)s)",
    )


def _add_bench_parser(commands: Any) -> None:
    # No --config: the benchmark generates the stack's config from the scenario for each run.
    bench = commands.add_parser(
        "bench",
        help="run a benchmark scenario: the local stack once per policy, results and plots",
    )
    bench.add_argument("scenario", type=Path, help="the scenario file (bench/scenarios/*.yaml)")
    bench.add_argument(
        "--duration",
        type=float,
        metavar="SECONDS",
        help="steady window of each run (default: the scenario's steady_s)",
    )
    bench.add_argument(
        "--warmup",
        type=float,
        metavar="SECONDS",
        help="warm-up of each run (default: the scenario's, shortened with a shorter --duration)",
    )
    bench.add_argument(
        "--out",
        type=Path,
        metavar="DIR",
        help="results folder (default results/<scenario>-<timestamp>/)",
    )
    bench.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="SECTION.FIELD=VALUE",
        help="override a field of every run's stack config, e.g. "
        "--set engine_sim.profile=h200-qwen2.5-7b (repeatable)",
    )
    bench.add_argument(
        "--runs",
        type=lambda text: [name.strip() for name in text.split(",") if name.strip()],
        metavar="NAME[,NAME]",
        help="make only these of the scenario's runs (default: all, in the scenario's order)",
    )
    bench.add_argument(
        "--log-level",
        default=os.environ.get("SLOTSHIFT_LOG_LEVEL", "WARNING"),
        help="log level of the harness and the stack's services (default %(default)s)",
    )


def load(args: argparse.Namespace) -> SlotshiftConfig:
    return config_source(args).load()


def config_source(args: argparse.Namespace) -> ConfigSource:
    """The config file and the `--set` overrides: what a service reads, and reads again."""
    return ConfigSource(args.config, parse_overrides(args.overrides))


def main(argv: list[str] | None = None) -> int:
    """Run the command `argv` names (default: the process's arguments); its exit status. A
    config the loader refuses, or that a service refuses as it starts (ConfigError), is said in
    one line on stderr, status 2; a service that exits on its own (the control plane's
    DEPOSED_EXIT_STATUS) raises SystemExit with its status."""
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] == ["bench-fidelity"]:
        # The fidelity benchmark has its own flags (--profile, --duration-s, --out, ...).
        from slotshift_tools.emulator.fidelity import main as fidelity_main

        return fidelity_main(argv[1:])
    if argv[:1] == ["bench-tradeoff"]:
        from slotshift_tools.emulator.tradeoff import main as tradeoff_main

        return tradeoff_main(argv[1:])
    if argv[:1] == ["bench-scale"]:
        # The scale benchmark has its own flags (--grid, --interval-s, --dynamics, ...).
        from slotshift_tools.scale.command import main as scale_main

        return scale_main(argv[1:])
    if argv[:1] == ["bench-gateway"]:
        from slotshift_tools.gateway_bench.command import main as gateway_bench_main

        return gateway_bench_main(argv[1:])
    if argv[:1] == ["soak"]:
        # The soak benchmark has its own flags (--duration-s, --out-dir, ...).
        from slotshift_tools.soak import main as soak_main

        return soak_main(argv[1:])
    args = build_parser().parse_args(argv)
    configure_logging(args.command, args.log_level)
    if args.command == "bench":
        return _bench(args)
    if args.command == "simulate":
        return _simulate(args)
    if args.command == "up" and args.engine is not None:
        # An override like any other, so that it reaches the children's config too.
        args.overrides.append(f"local_stack.engine={args.engine}")
    try:
        config = load(args)
    except ConfigError as exc:
        print(f"slotshift: invalid configuration: {exc}", file=sys.stderr)
        return 2
    if args.command == "state":
        from slotshift_tools.state_command import run_state

        return run_state(config, args.action, pool=args.pool)
    if args.command == "up":
        from slotshift_tools.local_stack import run_local_stack

        # The stack's services are its children: they read the choice from their environment.
        os.environ["SLOTSHIFT_EVENT_LOOP"] = args.event_loop

        return asyncio.run(
            run_local_stack(
                config,
                config_path=args.config,
                overrides=args.overrides,
                log_level=args.log_level,
                demo=args.demo,
                demo_duration_s=args.demo_duration_s,
            )
        )
    run, identity = _service(args)
    try:
        with asyncio.Runner(loop_factory=_loop_factory(args.event_loop)) as runner:
            runner.run(_serve(run, config, identity))
    except ConfigError as exc:
        # A setting a service can check only as it starts (a secret's file, the streams'
        # credentials) is the operator's to fix, as one the loader refused: one line, status 2.
        print(f"slotshift {args.command}: invalid configuration: {exc}", file=sys.stderr)
        return 2
    return 0


def _bench(args: argparse.Namespace) -> int:
    from slotshift_tools.bench.command import run_bench

    try:
        overrides = parse_overrides(args.overrides)
    except ConfigError as exc:
        print(f"slotshift: {exc}", file=sys.stderr)
        return 2
    return run_bench(
        args.scenario,
        duration_s=args.duration,
        warmup_s=args.warmup,
        out_dir=args.out,
        overrides=overrides,
        runs=args.runs,
        log_level=args.log_level,
    )


def _simulate(args: argparse.Namespace) -> int:
    from slotshift_tools.twin.command import run_simulate
    from slotshift_tools.twin.settings import TwinSettings

    try:
        overrides = parse_overrides(args.overrides)
        settings = TwinSettings(transit_ms=args.transit_ms, closed_form=not args.step_by_step)
    except (ConfigError, ValueError) as exc:
        print(f"slotshift: {exc}", file=sys.stderr)
        return 2
    if args.replay_pool is not None and args.replay is None:
        print("slotshift: --replay-pool needs --replay", file=sys.stderr)
        return 2
    if args.frontier and args.replay is not None:
        # The oracle knows a scenario's drawn arrivals, not a log's.
        print("slotshift: --frontier and --replay do not go together", file=sys.stderr)
        return 2
    if not args.frontier and (args.window_offsets is not None or args.window_step is not None):
        print("slotshift: --window-offsets and --window-step need --frontier", file=sys.stderr)
        return 2
    if args.frontier:
        from slotshift_tools.twin.frontier import DEFAULT_WINDOW_OFFSETS, DEFAULT_WINDOW_STEP_S
        from slotshift_tools.twin.frontier_command import run_frontier

        return run_frontier(
            args.scenario,
            duration_s=args.duration,
            warmup_s=args.warmup,
            out_dir=args.out,
            overrides=overrides,
            settings=settings,
            windows=DEFAULT_WINDOW_OFFSETS if args.window_offsets is None else args.window_offsets,
            window_step_s=DEFAULT_WINDOW_STEP_S if args.window_step is None else args.window_step,
        )
    return run_simulate(
        args.scenario,
        duration_s=args.duration,
        warmup_s=args.warmup,
        out_dir=args.out,
        overrides=overrides,
        runs=args.runs,
        settings=settings,
        replay=args.replay,
        replay_pool=args.replay_pool,
    )


def _service(args: argparse.Namespace) -> tuple[ServiceRun, dict[str, Any]]:
    # Imported lazily: each process loads only the service it runs.
    if args.command == "controlplane":
        from controlplane.main import run as controlplane_run

        # The control plane reads the file again on SIGHUP and when it changes.
        return controlplane_run, {"source": config_source(args)}
    if args.command == "gateway":
        from admission_gateway.main import run as gateway_run

        return gateway_run, {"gateway_id": args.gateway_id, "port": args.port}
    if args.command == "agent":
        from telemetry_agent.main import run as agent_run

        return agent_run, {"agent_id": args.agent_id}
    if args.command == "engine-sim":
        from engine_sim.main import run as engine_run

        return engine_run, {}
    raise AssertionError(f"unhandled command {args.command}")


def _loop_factory(name: str) -> Callable[[], asyncio.AbstractEventLoop] | None:
    """The loop factory of --event-loop `name`: uvloop's (the services' every message and
    relayed event cost less CPU on it), or None for asyncio's own."""
    if name == "uvloop":
        import uvloop

        return uvloop.new_event_loop
    return None


async def _serve(run: ServiceRun, config: SlotshiftConfig, identity: dict[str, Any]) -> None:
    """Run a service until SIGINT or SIGTERM, then let it shut down in order."""
    stop = asyncio.Event()
    loop = asyncio.get_running_loop()
    for signum in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(signum, stop.set)
    await run(config, stop, **identity)
