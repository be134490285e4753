"""Every policy keeps the contract of controlplane.core.policy.AllocationPolicy."""

from __future__ import annotations

import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from controlplane.core.demand_policy import DemandPolicy
from controlplane.core.policies import POLICY_FACTORIES, make_policy
from controlplane.core.reserves import hold_reserves, reserve_excess, reserves_in_force
from controlplane.core.snapshot import PoolSnapshot, TelemetryView, TenantLoad
from controlplane.core.validation import InvalidAllocation, validate_limits
from slotshift.config import PoolConfig, SloPolicyConfig, TenantConfig
from slotshift.demand import LatencySummary


def _pool(rng: random.Random, *, reserves: bool = False) -> PoolConfig:
    """A random pool. reserves: also random preemptible tenants and learned-reserve settings
    (drawn after everything else, so that the pools drawn without them stay the same)."""
    count = rng.randint(1, 6)
    budget = rng.randint(count, 300)
    tenants = []
    floors_left = budget
    for index in range(count):
        floor = rng.randint(0, max(0, floors_left // (count - index + 1)))
        floors_left -= floor
        ceiling = rng.choice([None, rng.randint(floor, budget)])
        tenants.append(
            TenantConfig(
                name=f"t{index}",
                floor_slots=floor,
                ceiling_slots=ceiling,
                weight=rng.uniform(0.1, 5),
                lendable_percent=rng.choice([100.0, rng.uniform(0, 100)]),
                borrowing_limit_percent=rng.choice([None, rng.uniform(0, 300)]),
                ttft_slo_ms=rng.choice([None, rng.uniform(10, 5000)]),
                e2e_slo_ms=rng.choice([None, rng.uniform(100, 20000)]),
            )
        )
    # Make the ceilings able to absorb the budget: the last tenant takes any amount.
    last = tenants[-1]
    tenants[-1] = TenantConfig(name=last.name, floor_slots=last.floor_slots, weight=last.weight)
    slo_policy = SloPolicyConfig(
        demand_half_life_s=rng.uniform(0.5, 30),
        hysteresis_slots=rng.randint(0, 4),
        max_borrow_step_slots=rng.randint(1, 50),
        slo_boost=rng.uniform(0, 5),
    )
    if reserves:
        tenants = [
            t.model_copy(
                update={
                    "preemptible": rng.random() < 0.4,
                    "lendable_percent": rng.choice([100.0, rng.uniform(0, 100)]),
                }
            )
            for t in tenants
        ]
        slo_policy = slo_policy.model_copy(
            update={
                "learned_reserves": rng.random() < 0.5,
                "reserve_percentile": rng.uniform(50, 100),
                "reserve_burst_window_s": rng.uniform(0.5, 5),
                "reserve_idle_demand_slots": rng.randint(0, 3),
                "reserve_history_half_life_s": rng.uniform(1, 100),
                "reserve_max_percent": rng.uniform(0, 100),
            }
        )
    return PoolConfig(name="p", budget_slots=budget, tenants=tenants, slo_policy=slo_policy)


def _latency(rng: random.Random) -> LatencySummary:
    if rng.random() < 0.3:
        return LatencySummary()
    p50 = rng.uniform(1, 5000)
    return LatencySummary(
        count=rng.randint(1, 500), p50_ms=p50, p90_ms=p50 * 2, p99_ms=p50 * rng.uniform(2, 20)
    )


def _snapshot(
    rng: random.Random, pool: PoolConfig, now_s: float, current: dict[str, int]
) -> PoolSnapshot:
    loads = {
        t.name: TenantLoad(
            in_flight=rng.choice([0, rng.randint(0, pool.budget_slots)]),
            queued=rng.choice([0, 0, rng.randint(0, 1000)]),
            ttft=_latency(rng),
            e2e=_latency(rng),
        )
        for t in pool.tenants
    }
    telemetry = rng.choice(
        [
            None,
            TelemetryView(
                age_s=rng.uniform(0, 20),
                fresh=rng.random() < 0.7,
                kv_cache_usage_perc=rng.random(),
                num_requests_waiting=rng.choice([0.0, float(rng.randint(0, 50))]),
            ),
        ]
    )
    return PoolSnapshot(now_s=now_s, tenants=loads, current_limits=current, telemetry=telemetry)


@pytest.mark.parametrize("name", sorted(POLICY_FACTORIES))
def test_policy_contract_on_random_sequences_of_snapshots(name: str) -> None:
    rng = random.Random(f"policy-{name}")
    for _ in range(300):
        pool = _pool(rng)
        policy = make_policy(name)
        state: object | None = None
        current: dict[str, int] = {}
        for step in range(10):
            snapshot = _snapshot(rng, pool, now_s=step * pool.decision_period_s, current=current)
            decision = policy.decide(snapshot, pool, state)
            validate_limits(decision.limits, pool)
            again = make_policy(name).decide(snapshot, pool, state)
            assert again.limits == decision.limits, "a policy must be a function of its arguments"
            state = decision.state
            current = dict(decision.limits)


@pytest.mark.parametrize("name", sorted(POLICY_FACTORIES))
def test_every_policy_holds_the_reserves_once_the_loop_has_held_them(name: str) -> None:
    """The decision loop applies hold_reserves to every decision; the slo policy needs no help."""
    rng = random.Random(f"reserves-{name}")
    for _ in range(200):
        pool = _pool(rng, reserves=True)
        policy = make_policy(name)
        state: object | None = None
        current: dict[str, int] = {}
        for step in range(10):
            snapshot = _snapshot(rng, pool, now_s=step * pool.decision_period_s, current=current)
            decision = policy.decide(snapshot, pool, state)
            reserves = reserves_in_force(pool, decision.state)
            held = hold_reserves(decision.limits, pool, reserves)
            validate_limits(held, pool, reserves=reserves)
            if name == "slo":
                assert reserve_excess(decision.limits, pool, reserves) <= 0, "slo holds them"
                assert held == dict(decision.limits)
            state = decision.state
            current = held


@settings(max_examples=300, deadline=None)
@given(
    demands=st.lists(st.integers(min_value=0, max_value=10_000), min_size=2, max_size=5),
    budget=st.integers(min_value=10, max_value=500),
)
def test_demand_policy_gives_more_to_more_demand(demands: list[int], budget: int) -> None:
    tenants = [TenantConfig(name=f"t{i}", floor_slots=1) for i in range(len(demands))]
    pool = PoolConfig(name="p", budget_slots=budget, tenants=tenants)
    snapshot = PoolSnapshot(
        now_s=0.0,
        tenants={f"t{i}": TenantLoad(queued=d) for i, d in enumerate(demands)},
        current_limits={},
    )
    limits = DemandPolicy().decide(snapshot, pool, None).limits
    validate_limits(limits, pool)
    for i, di in enumerate(demands):
        for j, dj in enumerate(demands):
            if di > dj:
                assert limits[f"t{i}"] >= limits[f"t{j}"]


def test_demand_policy_reproduces_the_study_final_caps() -> None:
    """A idle, B backlogged: B gets all but A's floor ({A:4, B:92} in the study)."""
    pool = PoolConfig(
        name="p",
        budget_slots=96,
        tenants=[TenantConfig(name="A", floor_slots=4), TenantConfig(name="B", floor_slots=4)],
    )
    snapshot = PoolSnapshot(
        now_s=0.0,
        tenants={"A": TenantLoad(), "B": TenantLoad(in_flight=92, queued=40)},
        current_limits={"A": 48, "B": 48},
    )
    assert DemandPolicy().decide(snapshot, pool, None).limits == {"A": 4, "B": 92}


def test_demand_policy_at_rest_is_the_static_split() -> None:
    pool = PoolConfig(
        name="p", budget_slots=96, tenants=[TenantConfig(name="A"), TenantConfig(name="B")]
    )
    idle = PoolSnapshot(now_s=0.0, tenants={}, current_limits={})
    assert (
        DemandPolicy().decide(idle, pool, None).limits
        == make_policy("static").decide(idle, pool, None).limits
        == {"A": 48, "B": 48}
    )


def test_unknown_policy_names_the_known_ones() -> None:
    with pytest.raises(ValueError, match="demand"):
        make_policy("nope")


@pytest.mark.parametrize(
    ("limits", "message"),
    [
        pytest.param({"A": 48}, "missing", id="missing-tenant"),
        pytest.param({"A": 48, "B": 47, "C": 1}, "unknown", id="unknown-tenant"),
        pytest.param({"A": 50, "B": 50}, "sum to 100", id="over-budget"),
        pytest.param({"A": 2, "B": 94}, "outside", id="below-floor"),
        pytest.param({"A": 48.0, "B": 48}, "whole", id="not-whole"),
    ],
)
def test_validation_rejects_invalid_limits(limits: dict[str, int], message: str) -> None:
    pool = PoolConfig(
        name="p",
        budget_slots=96,
        tenants=[TenantConfig(name="A", floor_slots=4), TenantConfig(name="B", floor_slots=4)],
    )
    with pytest.raises(InvalidAllocation, match=message):
        validate_limits(limits, pool)
