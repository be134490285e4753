"""The twin is deterministic for a seed, and it runs the production code, not copies of it."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from admission_gateway.control_session import ControlSession
from controlplane.core import placement, policies
from controlplane.core.static_policy import StaticPolicy
from controlplane.pool_state import PoolState
from slotshift_tools.bench.scenario import Scenario, load_scenario
from slotshift_tools.twin.command import simulate_scenario
from slotshift_tools.twin.settings import TwinSettings

SEED = Path(__file__).resolve().parents[4] / "bench" / "scenarios" / "seed.yaml"


def _short_seed(*runs: str) -> Scenario:
    scenario = load_scenario(SEED)
    return scenario.model_copy(update={"policies": [scenario.run(name) for name in runs]})


def _totals(scenario: Scenario, settings: TwinSettings | None = None) -> dict[str, object]:
    runs = simulate_scenario(scenario, steady_s=8.0, warmup_s=2.0, settings=settings)
    return {name: run.record.summary["total"] for name, run in runs.items()}


def test_the_same_seed_gives_the_same_results() -> None:
    scenario = _short_seed("slo")
    first = simulate_scenario(scenario, steady_s=8.0, warmup_s=2.0)["slo"].result
    second = simulate_scenario(scenario, steady_s=8.0, warmup_s=2.0)["slo"].result
    assert [t.to_json() for t in first.traces] == [t.to_json() for t in second.traces]
    assert [s.to_json() for s in first.samples] == [s.to_json() for s in second.samples]
    assert first.decisions == second.decisions
    assert any(d.outcome == "published" for d in first.decisions)  # the policy moved slots


def test_jumping_over_decode_runs_gives_the_figures_of_stepping() -> None:
    scenario = _short_seed("demand")
    jumped = _totals(scenario)
    stepped = _totals(scenario, TwinSettings(closed_form=False))
    assert json.dumps(jumped, sort_keys=True) == json.dumps(stepped, sort_keys=True)


def test_it_runs_the_production_policies(monkeypatch: pytest.MonkeyPatch) -> None:
    scenario = _short_seed("static", "demand")
    before = _totals(scenario)
    assert before["demand"] != before["static"]
    monkeypatch.setitem(policies.POLICY_FACTORIES, "demand", StaticPolicy)
    after = _totals(scenario)
    # With the registry's demand policy replaced by static, the twin's demand run is static's.
    assert json.dumps(after["demand"], sort_keys=True) == json.dumps(
        after["static"], sort_keys=True
    )


def _never_published(self: PoolState, **_: object) -> None:
    return None


async def _never_applied(self: ControlSession, *_: object) -> None:
    return None


@pytest.mark.parametrize(
    ("owner", "name", "replacement"),
    [
        pytest.param(PoolState, "reconcile", _never_published, id="the control plane's state"),
        pytest.param(ControlSession, "_on_allocation", _never_applied, id="the gateway's session"),
    ],
)
def test_it_runs_the_production_control_plane_and_control_session(
    monkeypatch: pytest.MonkeyPatch, owner: type, name: str, replacement: object
) -> None:
    """With the production PoolState publishing nothing, or the production control session
    applying nothing it is pushed, the gateways keep their fallback split: the demand policy's
    decisions reach no gateway, and its run's figures are static's."""
    scenario = _short_seed("static", "demand")
    before = _served(_totals(scenario))
    assert before["demand"] != before["static"]
    monkeypatch.setattr(owner, name, replacement)
    after = _served(_totals(scenario))
    assert after["demand"] == after["static"]


def _served(totals: dict[str, object]) -> dict[str, tuple[object, ...]]:
    """What each run served (its decisions' counts aside: they are the policy's own)."""
    fields = ("completed", "output_throughput", "median_ttft_ms", "p99_e2el_ms", "failed")
    served: dict[str, tuple[object, ...]] = {}
    for run, total in totals.items():
        assert isinstance(total, dict)
        served[run] = tuple(total[field] for field in fields)
    return served


def _completed_at(scenario: Scenario, gateway: int) -> int:
    result = simulate_scenario(scenario, steady_s=8.0, warmup_s=2.0)["static"].result
    return sum(1 for t in result.traces if t.gateway == gateway and t.status.value == "ok")


def test_it_runs_the_production_placement(monkeypatch: pytest.MonkeyPatch) -> None:
    scenario = _short_seed("static")
    before = _completed_at(scenario, 1)
    split = placement.split_targets

    def everything_at_the_first_gateway(
        limits: placement.Counts, demand: placement.Counts
    ) -> placement.Counts:
        targets = np.zeros_like(split(limits, demand))
        if len(targets):  # the first decision comes before any gateway has connected
            targets[0] = limits
        return targets

    monkeypatch.setattr(placement, "split_targets", everything_at_the_first_gateway)
    # The second gateway's part of every limit is 0: once the split is pushed, it admits
    # nothing more (what it admitted under the fallback split before finishes).
    assert _completed_at(scenario, 1) < 0.5 * before
