"""`slotshift bench-scale`: the command line, and the grid run point after point.

    slotshift bench-scale --grid 10x2,100x10,1000x10@1 --interval-s 0.25 \\
        --dynamics fluctuating --duration-s 60 --out DIR

Each point gets a folder `DIR/<T>x<G>/` (its generated config, the control plane's log,
point.json); the grid gets `DIR/grid.json`, `DIR/scale.png` and `DIR/summary.md`. Exit status:
0 when every point ran and the budget held at every instant of each, 1 when the budget was
exceeded or a point could not be measured, 2 for bad arguments.
"""

from __future__ import annotations

import argparse
import asyncio
import datetime
import json
import logging
import os
import platform
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import Any, cast

from slotshift.clock import Clock, SystemClock
from slotshift.config import ConfigError
from slotshift_tools.scale.dynamics import DYNAMICS, Dynamics
from slotshift_tools.scale.grid import DEFAULT_GRID, GridError, GridPoint, budget_for, parse_grid
from slotshift_tools.scale.point import PointError, PointSettings, run_point
from slotshift_tools.scale.report import grid_document, markdown_table, plot_grid

logger = logging.getLogger(__name__)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="slotshift bench-scale",
        description="One real control plane against G simulated gateways on real gRPC streams, "
        "T tenants: its CPU, memory, decision times and the budget at every instant, per point.",
    )
    parser.add_argument(
        "--grid",
        default=DEFAULT_GRID,
        help="points TENANTSxGATEWAYS[@REPORT_INTERVAL_S], comma-separated (default %(default)s)",
    )
    parser.add_argument(
        "--interval-s",
        type=float,
        default=0.25,
        help="the gateways' report interval where a point names none (default %(default)s, "
        "the gateways' shipped report_interval_s)",
    )
    parser.add_argument("--dynamics", choices=DYNAMICS, default="fluctuating")
    parser.add_argument(
        "--duration-s", type=float, default=60.0, help="measured window per point (default 60)"
    )
    parser.add_argument(
        "--warmup-s",
        type=float,
        default=5.0,
        help="from all gateways connected to the window (default %(default)s)",
    )
    parser.add_argument("--out", type=Path, help="results folder (default results/scale-<time>/)")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument(
        "--generator-processes",
        type=int,
        help="load-generator processes per point (default: half the CPUs, at least one, at "
        "most one per gateway)",
    )
    parser.add_argument(
        "--budget-per-tenant",
        type=int,
        default=2,
        help="the pool's budget is this many slots a tenant (default %(default)s) ...",
    )
    parser.add_argument(
        "--min-budget", type=int, default=96, help="... and at least this many (default 96)"
    )
    parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="SECTION.FIELD=VALUE",
        help="override a field of the control plane's generated config, e.g. "
        "--set pools.0.decision_period_s=1 (repeatable)",
    )
    parser.add_argument(
        "--log-level",
        default=os.environ.get("SLOTSHIFT_LOG_LEVEL", "WARNING"),
        help="the control plane's and the harness's log level (default %(default)s)",
    )
    parser.add_argument(
        "--keep-recordings",
        action="store_true",
        help="keep the generators' raw recordings (generator-*.npz) in each point's folder",
    )
    return parser


def default_generator_processes(cpus: int | None = None) -> int:
    """Half the CPUs, at least one: the other half is the control plane's."""
    return max(1, (cpus if cpus is not None else os.cpu_count() or 1) // 2)


def point_settings(point: GridPoint, args: argparse.Namespace) -> PointSettings:
    """The settings of one point under the command line's."""
    processes = args.generator_processes or default_generator_processes()
    return PointSettings(
        tenants=point.tenants,
        gateways=point.gateways,
        budget_slots=budget_for(
            point.tenants, per_tenant=args.budget_per_tenant, minimum=args.min_budget
        ),
        report_interval_s=point.report_interval_s or args.interval_s,
        dynamics=cast(Dynamics, args.dynamics),
        duration_s=args.duration_s,
        warmup_s=args.warmup_s,
        seed=args.seed,
        generator_processes=min(processes, point.gateways),
        overrides=tuple(args.overrides),
        log_level=args.log_level,
        keep_recordings=args.keep_recordings,
    )


async def run_grid(
    points: Sequence[PointSettings], out_dir: Path, settings: dict[str, Any], clock: Clock
) -> dict[str, Any]:
    """Measure the points one after the other; write grid.json, scale.png and summary.md."""
    documents = []
    failures: dict[str, str] = {}
    for index, point in enumerate(points):
        logger.warning(
            "point %d of %d: %s tenants x gateways, reports every %g s, %s demand, %g s",
            index + 1,
            len(points),
            point.label,
            point.report_interval_s,
            point.dynamics,
            point.duration_s,
        )
        folder = out_dir / f"{point.label}@{point.report_interval_s:g}s"
        try:
            document = await run_point(point, folder, clock)
        except PointError as exc:
            logger.error("point %s failed: %s", point.label, exc)
            failures[point.label] = str(exc)
            continue
        documents.append(document)
        logger.warning(
            "point %s: control plane %.2f cores, %d decisions, budget %s%s",
            point.label,
            document["controlplane"]["cpu_cores"],
            document["decisions"]["made"],
            "ok" if document["budget"]["ok"] else "EXCEEDED",
            ""
            if document["valid"]
            else " (invalid: " + "; ".join(document["invalid_reasons"]) + ")",
        )
    grid = grid_document(documents, settings, failures)
    await asyncio.to_thread(_write_outputs, out_dir, grid, documents)
    return grid


def _write_outputs(out_dir: Path, grid: dict[str, Any], documents: list[dict[str, Any]]) -> None:
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "grid.json").write_text(json.dumps(grid, indent=2) + "\n", encoding="utf-8")
    (out_dir / "summary.md").write_text(markdown_table(documents), encoding="utf-8")
    if documents:
        plot_grid(documents, out_dir / "scale.png")


def main(argv: list[str] | None = None) -> int:
    """`slotshift bench-scale ARGS`; returns the exit status (module docstring)."""
    args = build_parser().parse_args(argv)
    logging.basicConfig(
        level=args.log_level.upper(), format="bench-scale %(levelname)s %(message)s"
    )
    try:
        grid = parse_grid(args.grid)
    except GridError as exc:
        print(f"slotshift bench-scale: {exc}", file=sys.stderr)
        return 2
    if args.duration_s <= 0 or args.warmup_s < 0 or args.interval_s <= 0:
        print("slotshift bench-scale: durations and intervals must be positive", file=sys.stderr)
        return 2
    # Absolute: the generated configs name files in it, read relative to the config's folder.
    out_dir = (
        args.out or Path("results") / ("scale-" + datetime.datetime.now().strftime("%Y%m%d-%H%M%S"))
    ).resolve()
    points = [point_settings(point, args) for point in grid]
    settings = {
        "argv": sys.argv[1:] if argv is None else list(argv),
        "grid": args.grid,
        "interval_s": args.interval_s,
        "dynamics": args.dynamics,
        "duration_s": args.duration_s,
        "warmup_s": args.warmup_s,
        "seed": args.seed,
        "host": {"cpus": os.cpu_count(), "python": platform.python_version()},
    }
    try:
        grid_result = asyncio.run(run_grid(points, out_dir, settings, SystemClock()))
    except ConfigError as exc:
        print(f"slotshift bench-scale: invalid configuration: {exc}", file=sys.stderr)
        return 2
    print(markdown_table(grid_result["points"]), end="")
    print(f"results in {out_dir}")
    if grid_result["failed_points"] or not grid_result["budget_ok"]:
        return 1
    return 0
