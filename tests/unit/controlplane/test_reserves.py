"""The reserve rule (controlplane/core/reserves.py): its repair keeps its contract on random
pools and limits, and the decision loop, validation, the agent policy and the metrics use it."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from controlplane.core.policy import PolicyDecision
from controlplane.core.reserves import (
    configured_reserves,
    hold_reserves,
    preemptible_tenants,
    reserve_excess,
    reserves_in_force,
)
from controlplane.core.snapshot import Advice, PoolSnapshot, TenantLoad
from controlplane.core.validation import InvalidAllocation, validate_limits
from controlplane.decision_log import DecisionOutcome
from controlplane.decision_loop import DecisionLoop
from controlplane.metrics import ControlPlaneMetrics
from controlplane.pool_state import PoolState
from slotshift.apportion import Claim, apportion, nominal_shares
from slotshift.clock import ManualClock
from slotshift.config import PoolConfig, PreemptionConfig, TenantConfig


@st.composite
def pools_and_limits(draw: st.DrawFn) -> tuple[PoolConfig, dict[str, int], dict[str, int]]:
    """A random pool, valid limits for it (any split within the bounds) and reserves for it
    (sometimes as configured, sometimes arbitrary, even above the nominal share)."""
    count = draw(st.integers(1, 6))
    budget = draw(st.integers(count, 300))
    tenants = []
    floors_left = budget
    for index in range(count):
        floor = draw(st.integers(0, floors_left // (count - index + 1)))
        floors_left -= floor
        ceiling = draw(st.none() | st.integers(floor, budget))
        tenants.append(
            TenantConfig(
                name=f"t{index}",
                floor_slots=floor,
                ceiling_slots=ceiling if index < count - 1 else None,
                weight=draw(st.floats(0.1, 5)),
                lendable_percent=draw(st.sampled_from([100.0, 50.0, 0.0]) | st.floats(0, 100)),
                preemptible=draw(st.booleans()),
            )
        )
    pool = PoolConfig(
        name="p",
        budget_slots=budget,
        tenants=tenants,
        preemption=PreemptionConfig(enabled=draw(st.booleans())),
    )
    targets = [draw(st.sampled_from([0.0, 1.0]) | st.floats(0, 100)) for _ in tenants]
    claims = [
        Claim(t.floor_slots, pool.ceiling_of(t), target)
        for t, target in zip(tenants, targets, strict=True)
    ]
    names = [t.name for t in tenants]
    limits = dict(zip(names, apportion(budget, claims), strict=True))
    if draw(st.booleans()):
        reserves = configured_reserves(pool)
    else:
        reserves = {name: draw(st.integers(0, budget)) for name in names}
    return pool, limits, reserves


@settings(max_examples=1_000, deadline=None)
@given(case=pools_and_limits())
def test_hold_reserves_keeps_its_contract(
    case: tuple[PoolConfig, dict[str, int], dict[str, int]],
) -> None:
    pool, limits, reserves = case
    held = hold_reserves(limits, pool, reserves)
    validate_limits(held, pool, reserves=reserves)  # budget, bounds and the rule
    assert reserve_excess(held, pool, reserves) <= 0
    assert hold_reserves(held, pool, reserves) == held, "idempotent"
    excess = reserve_excess(limits, pool, reserves)
    if excess <= 0:
        assert held == limits, "limits that obey the rule are left alone"
        return
    assert sum(abs(held[n] - limits[n]) for n in limits) == 2 * excess, "moves only the excess"
    nominal = nominal_shares(pool)
    preemptible = preemptible_tenants(pool)
    for tenant in pool.tenants:
        name = tenant.name
        if held[name] < limits[name]:
            assert name not in preemptible, "only non-preemptible borrowers give back"
            assert held[name] >= nominal[name], "never below their nominal share"
        if held[name] > limits[name]:
            assert held[name] <= min(reserves[name], nominal[name]), "only up to the reserve"


def _pool(*, b_preemptible: bool = False, enabled: bool = True, c: bool = False) -> PoolConfig:
    tenants = [
        TenantConfig(name="A", floor_slots=4, lendable_percent=50),
        TenantConfig(name="B", floor_slots=4, preemptible=b_preemptible),
    ]
    if c:
        tenants.append(TenantConfig(name="C", floor_slots=4))
    return PoolConfig(
        name="p",
        budget_slots=96 if not c else 144,
        tenants=tenants,
        preemption=PreemptionConfig(enabled=enabled),
    )


@pytest.mark.parametrize(
    ("pool", "held"),
    [
        pytest.param(_pool(), {"A": 24, "B": 72}, id="non-preemptible borrower gives back"),
        pytest.param(_pool(b_preemptible=True), {"A": 4, "B": 92}, id="preemptible keeps it"),
        pytest.param(
            _pool(b_preemptible=True, enabled=False),
            {"A": 24, "B": 72},
            id="preemption disabled: nobody is preemptible",
        ),
    ],
)
def test_a_reserve_is_lent_only_to_a_preemptible_borrower(
    pool: PoolConfig, held: dict[str, int]
) -> None:
    limits = {"A": 4, "B": 92}
    assert hold_reserves(limits, pool, configured_reserves(pool)) == held


def test_non_preemptible_borrowers_take_only_the_lendable_parts() -> None:
    """A (nominal 48, reserve 24) lends 44 slots, 20 of them out of its reserve; B (preemptible)
    borrows only 14, so C holds 6 of A's reserve: they go back to A, and C keeps the 24 slots of
    A's lendable part."""
    pool = _pool(b_preemptible=True, c=True)
    limits = {"A": 4, "B": 62, "C": 78}
    assert reserve_excess(limits, pool, configured_reserves(pool)) == 6
    assert hold_reserves(limits, pool, configured_reserves(pool)) == {"A": 10, "B": 62, "C": 72}


def test_validation_rejects_a_reserve_held_by_a_non_preemptible_tenant() -> None:
    pool = _pool()
    validate_limits({"A": 4, "B": 92}, pool)  # without reserves: budget and bounds only
    with pytest.raises(InvalidAllocation, match="hold 20 slots of the lenders' reserves"):
        validate_limits({"A": 4, "B": 92}, pool, reserves=configured_reserves(pool))
    validate_limits({"A": 24, "B": 72}, pool, reserves=configured_reserves(pool))


@dataclass(frozen=True)
class _Learned:
    reserves: dict[str, int] | None


def test_reserves_in_force_are_the_states_within_floor_and_nominal_share() -> None:
    pool = _pool()
    assert reserves_in_force(pool, None) == {"A": 24, "B": 4}
    assert reserves_in_force(pool, _Learned(None)) == {"A": 24, "B": 4}
    assert reserves_in_force(pool, _Learned({"A": 60, "B": 0})) == {"A": 48, "B": 4}
    assert reserves_in_force(pool, _Learned({"A": 10})) == {"A": 10, "B": 4}, "B as configured"


class _Lender:
    """A policy that lends all of A's share but its floor, as the demand policy would."""

    name = "lender"
    needs_advice = False

    def __init__(self, state: object | None = None) -> None:
        self.state = state

    def decide(self, snapshot: PoolSnapshot, pool: PoolConfig, state: object | None) -> object:
        return PolicyDecision(limits={"A": 4, "B": 92}, reason="lend", state=self.state)


def _loop_state(pool: PoolConfig) -> tuple[PoolState, ManualClock]:
    clock = ManualClock()
    state = PoolState(
        pool, clock=clock, gateway_lease_ttl_s=6.0, telemetry_stale_after_s=5.0, decision_log_size=8
    )
    clock.advance(6.0)
    return state, clock


def test_the_decision_loop_holds_every_policys_reserves_and_says_so() -> None:
    state, clock = _loop_state(_pool())
    loop = DecisionLoop(state, _Lender(), clock=clock)  # type: ignore[arg-type]
    record = loop.decide_once()
    assert record.outcome is DecisionOutcome.PUBLISHED
    assert dict(state.allocation.tenant_limits) == {"A": 24, "B": 72}
    assert record.reason == "lend; reserves held: A +20, B -20"


def test_the_decision_loop_holds_the_reserves_the_policy_state_names() -> None:
    state, clock = _loop_state(_pool())
    loop = DecisionLoop(state, _Lender(_Learned({"A": 10})), clock=clock)  # type: ignore[arg-type]
    loop.decide_once()
    assert dict(state.allocation.tenant_limits) == {"A": 10, "B": 86}


def test_the_decision_loop_leaves_a_preemptible_borrower_its_loan() -> None:
    state, clock = _loop_state(_pool(b_preemptible=True))
    record = DecisionLoop(state, _Lender(), clock=clock).decide_once()  # type: ignore[arg-type]
    assert dict(state.allocation.tenant_limits) == {"A": 4, "B": 92}
    assert record.reason == "lend"


@pytest.mark.parametrize(
    ("b_preemptible", "limits", "reason"),
    [
        pytest.param(False, {"A": 24, "B": 72}, "; reserves held: A +20, B -20", id="held"),
        pytest.param(True, {"A": 4, "B": 92}, "", id="lent to a preemptible tenant"),
    ],
)
def test_an_agent_answer_holds_the_reserves(
    b_preemptible: bool, limits: dict[str, int], reason: str
) -> None:
    """Before, an answer that lent A's reserve out was used as it was (issue #12)."""
    from controlplane.core.policies import make_policy

    pool = _pool(b_preemptible=b_preemptible)
    snapshot = PoolSnapshot(
        now_s=0.0,
        tenants={"B": TenantLoad(in_flight=48, queued=100)},
        current_limits={"A": 48, "B": 48},
        advice=Advice(limits={"A": 4, "B": 92}, reason="A idles", latency_ms=7),
    )
    decision = make_policy("agent", fallback="slo").decide(snapshot, pool, None)
    assert dict(decision.limits) == limits
    assert decision.reason == f"agent (7 ms): A idles{reason}"
    assert decision.fallback is None


def test_the_reserve_gauge_reads_the_reserves_the_last_decision_held() -> None:
    state, clock = _loop_state(_pool())
    metrics = ControlPlaneMetrics({"p": state})

    def reserve(tenant: str) -> float | None:
        return metrics.registry.get_sample_value(
            "slotshift_controlplane_tenant_reserve_slots", {"pool": "p", "tenant": tenant}
        )

    assert (reserve("A"), reserve("B")) == (24, 4)
    DecisionLoop(state, _Lender(_Learned({"A": 10})), clock=clock).decide_once()  # type: ignore[arg-type]
    assert (reserve("A"), reserve("B")) == (10, 4)
