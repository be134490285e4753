"""Synthetic run records for the summary and plot tests."""

from __future__ import annotations

from slotshift.config import parse_config
from slotshift_tools.bench.decisions import HELD, PUBLISHED, DecisionView
from slotshift_tools.bench.runner import RunResult
from slotshift_tools.bench.sampler import Sample
from slotshift_tools.bench.scenario import Scenario
from slotshift_tools.bench.stack_config import StackPorts, stack_config_data, stack_tenants
from slotshift_tools.bench.stats import Window
from slotshift_tools.bench.trace import RequestTrace
from tests.unit.slotshift_tools.bench.traces import done

PORTS = StackPorts(8000, 50051, 9100, 9101, (8080, 8081))
WALL_ORIGIN_S = 1_700_000_000.0


def sample(t_s: float, limits: dict[str, int], gpu: float | None = 80.0) -> Sample:
    return Sample(
        t_s=t_s,
        wall_s=WALL_ORIGIN_S + t_s,
        version=1,
        limits=limits,
        granted=limits,
        in_flight=dict.fromkeys(limits, 1),
        queued=dict.fromkeys(limits, 0),
        outstanding={"A": 2, "B": 6},
        completed={"A": 0, "B": 0},
        engine_generation_tokens=1000.0 * t_s,
        gpu_utilization_pct=gpu,
        gpu_emulated=gpu is not None,
    )


def run_result(
    scenario: Scenario,
    run_name: str,
    *,
    traces: list[RequestTrace] | None = None,
    samples: list[Sample] | None = None,
    decisions: list[DecisionView] | None = None,
) -> RunResult:
    """A run of `run_name` with a 2 s warm-up and an 8 s steady window."""
    run = scenario.run(run_name)
    window = Window(2.0, 10.0)
    if traces is None:
        traces = [
            done("A", 3.0, 0.1, [0.01] * 3),
            done("A", 4.0, 0.2, [0.01] * 3),
            done("B", 3.0, 0.5, [0.02] * 7),
        ]
    if samples is None:
        limits = {"pool": 8} if run.policy == "pool" else {"A": 4, "B": 4}
        samples = [sample(t / 2, limits) for t in range(21)]
    if decisions is None:
        decisions = [
            DecisionView(1, WALL_ORIGIN_S + 1.0, HELD, {"A": 4, "B": 4}),
            DecisionView(2, WALL_ORIGIN_S + 3.0, PUBLISHED, {"A": 2, "B": 6}),
            DecisionView(3, WALL_ORIGIN_S + 5.0, HELD, {"A": 2, "B": 6}),
        ]
    return RunResult(
        run=run,
        config=parse_config(stack_config_data(scenario, run, PORTS)),
        stack_tenants=stack_tenants(scenario, run),
        model="test-model",
        window=window,
        window_wall_s=(WALL_ORIGIN_S + 2.0, WALL_ORIGIN_S + 10.0),
        traces=traces,
        samples=samples,
        decisions=decisions,
        harness={"loop_lag_p99_ms": 1.0},
    )
