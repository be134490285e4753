"""CPU per gateway message of the control plane's pool state, in process: what a demand report
costs with its re-grant, the report alone, and a re-grant alone, at T tenants x G gateways.

    python scripts/pool_state_cost.py --tenants 100 --gateways 10 [--messages 1000] [--reps 5]

One pool (policy-free: no decisions), G gateways connected past the restart hold, then delta
reports in turn from each gateway, each naming a tenth of the tenants with figures drawn anew
(in flight 0-2, queued 0-1, a TTFT window; a fixed seed), built beforehand as wire messages and
read as the gateway stream reads them. Per kind, the least of `--reps` rounds of
`--messages` (process CPU time): no gRPC, no event loop, so what it measures is the state's own
work, and two checkouts compare side by side (run it from each: `PYTHONPATH=CHECKOUT`).
`slotshift bench-scale` measures the whole process.
"""

from __future__ import annotations

import argparse
import json
import random
import time
from collections.abc import Callable

from controlplane.pool_state import PoolState
from controlplane.service.gateway_service import _demands
from slotshift.clock import ManualClock
from slotshift.config import PoolConfig, TenantConfig
from slotshift.demand import TenantDemand
from slotshift.v1 import common_pb2, gateway_pb2


def measure(tenants: int, gateways: int, messages: int, reps: int, seed: int) -> dict[str, float]:
    """Microseconds of CPU per message of each kind (the least round)."""
    names = [f"t{i}" for i in range(tenants)]
    pool = PoolConfig(
        name="p",
        budget_slots=max(96, 2 * tenants),
        tenants=[TenantConfig(name=n) for n in names],
    )
    clock = ManualClock()
    state = PoolState(
        pool,
        clock=clock,
        gateway_lease_ttl_s=10.0,
        telemetry_stale_after_s=10.0,
        decision_log_size=16,
    )
    clock.advance(20.0)
    rng = random.Random(seed)
    sessions = [
        state.connect_gateway(f"g{g}", 0, [TenantDemand(n) for n in names]) for g in range(gateways)
    ]
    named = max(1, tenants // 10)

    def drawn(k: int) -> gateway_pb2.DemandReport:
        return gateway_pb2.DemandReport(
            tenants=[
                common_pb2.TenantDemand(
                    tenant=names[i],
                    in_flight=rng.randint(0, 2),
                    queued=rng.randint(0, 1),
                    admitted_total=k,
                    limit_slots=2,
                    ttft=common_pb2.LatencySummary(count=3, p50_ms=80.0, p90_ms=95.0, p99_ms=99.0),
                )
                for i in rng.sample(range(tenants), named)
            ]
        )

    reports = [drawn(k) for k in range(messages)]

    def report(k: int) -> None:
        # Read off the wire as the gateway stream reads a report (_demands, whichever shape the
        # checkout reads into).
        figures = _demands(reports[k])
        state.record_demand(sessions[k % gateways], state.allocation.version, figures, delta=True)

    def cpu_per_message(run: Callable[[int], object]) -> float:
        best = float("inf")
        for _ in range(reps):
            began = time.process_time()
            for k in range(messages):
                run(k)
            best = min(best, time.process_time() - began)
        return 1e6 * best / messages

    def report_and_regrant(k: int) -> None:
        state.reconcile_soon = None  # every message re-grants at once
        report(k)

    def report_only(k: int) -> None:
        state.reconcile_soon = lambda: None  # a runtime would re-grant later: none here
        report(k)

    return {
        "report_and_regrant_us": cpu_per_message(report_and_regrant),
        "report_us": cpu_per_message(report_only),
        "regrant_us": cpu_per_message(lambda _k: state.reconcile()),
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--tenants", type=int, default=100)
    parser.add_argument("--gateways", type=int, default=10)
    parser.add_argument("--messages", type=int, default=1000)
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    figures = measure(args.tenants, args.gateways, args.messages, args.reps, args.seed)
    print(json.dumps({"tenants": args.tenants, "gateways": args.gateways, **figures}))


if __name__ == "__main__":
    main()
