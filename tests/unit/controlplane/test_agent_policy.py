"""The agent policy uses a valid answer as it is and falls back on anything else; no answer, however
adversarial, makes it publish an allocation that breaks the budget or a bound."""

from __future__ import annotations

import dataclasses
import random

import pytest

from controlplane.core.agent_policy import AgentPolicy, AgentPolicyState
from controlplane.core.policies import make_policy
from controlplane.core.snapshot import Advice, PoolSnapshot, TenantLoad
from controlplane.core.validation import validate_limits
from slotshift.config import PoolConfig, TenantConfig
from tests.unit.controlplane.test_policies import _pool, _snapshot

POOL = PoolConfig(
    name="p",
    budget_slots=96,
    tenants=[TenantConfig(name="A", floor_slots=4), TenantConfig(name="B", floor_slots=4)],
)
LOADS = {"A": TenantLoad(in_flight=10), "B": TenantLoad(in_flight=80, queued=100)}


def _decide(
    advice: Advice | None, state: object | None = None
) -> tuple[dict[str, int], str, object | None, str | None]:
    snapshot = PoolSnapshot(
        now_s=0.0, tenants=LOADS, current_limits={"A": 48, "B": 48}, advice=advice
    )
    decision = make_policy("agent", fallback="slo").decide(snapshot, POOL, state)
    return dict(decision.limits), decision.reason, decision.state, decision.fallback


def test_a_valid_answer_is_used_as_it_is() -> None:
    limits, reason, state, fallback = _decide(
        Advice(limits={"A": 30, "B": 66}, reason="A bursts", latency_ms=42)
    )
    assert limits == {"A": 30, "B": 66}
    assert reason == "agent (42 ms): A bursts"
    assert fallback is None
    assert isinstance(state, AgentPolicyState)
    assert state.fallbacks == 0


@pytest.mark.parametrize(
    ("advice", "why"),
    [
        pytest.param(None, "no answer", id="none"),
        pytest.param(Advice(error="late: no answer within 500 ms"), "late", id="late"),
        pytest.param(Advice(error="failed: HTTP 500"), "HTTP 500", id="failed"),
        pytest.param(Advice(limits={"A": 50, "B": 50}), "sum to 100", id="over-budget"),
        pytest.param(Advice(limits={"A": 2, "B": 94}), "outside", id="below-floor"),
        pytest.param(Advice(limits={"A": 96}), "missing", id="missing-tenant"),
        pytest.param(Advice(limits={"A": 40, "B": 50, "C": 6}), "unknown", id="unknown-tenant"),
        pytest.param(Advice(limits={"A": 48.0, "B": 48}), "whole", id="float"),
        pytest.param(Advice(limits={"A": True, "B": 95}), "whole", id="bool"),
        pytest.param(Advice(limits={"A": "48", "B": 48}), "whole", id="string"),
    ],
)
def test_anything_else_falls_back_and_says_why(advice: Advice | None, why: str) -> None:
    limits, reason, state, fallback = _decide(advice)
    validate_limits(limits, POOL)
    assert fallback is not None and why in fallback
    assert reason.startswith("fell back to slo (")
    assert isinstance(state, AgentPolicyState)
    assert state.fallbacks == 1
    rule_based = make_policy("slo").decide(
        PoolSnapshot(now_s=0.0, tenants=LOADS, current_limits={"A": 48, "B": 48}), POOL, None
    )
    assert limits == dict(rule_based.limits)


def _adversarial(rng: random.Random, pool: PoolConfig) -> Advice | None:
    names = [t.name for t in pool.tenants] + rng.choice([[], ["intruder"]])
    choice = rng.random()
    if choice < 0.1:
        return None
    if choice < 0.2:
        return Advice(error=rng.choice(["late", "failed: reset", "unparseable: {"]))
    values: list[object] = [
        rng.randint(-10, pool.budget_slots * 2),
        float(rng.randint(0, 10)),
        "12",
        None,
        True,
        [1],
    ]
    if choice < 0.5:
        # Plausible answers: whole numbers that may or may not add up.
        limits: dict[str, object] = {n: rng.randint(0, pool.budget_slots) for n in names}
    else:
        limits = {n: rng.choice(values) for n in names if rng.random() < 0.9}
    return Advice(limits=limits, reason="x" * rng.randint(0, 1000))


def test_no_adversarial_answer_breaks_the_budget_or_a_bound() -> None:
    rng = random.Random(99)
    for _ in range(300):
        pool = _pool(rng)
        policy = AgentPolicy(make_policy(rng.choice(["static", "demand", "slo"])))
        state: object | None = None
        current: dict[str, int] = {}
        for step in range(10):
            snapshot = dataclasses.replace(
                _snapshot(rng, pool, now_s=step * 2.0, current=current),
                advice=_adversarial(rng, pool),
            )
            decision = policy.decide(snapshot, pool, state)
            validate_limits(decision.limits, pool)
            assert len(decision.reason) < 2000
            state = decision.state
            current = dict(decision.limits)


def test_the_agent_cannot_fall_back_to_itself() -> None:
    with pytest.raises(ValueError, match="itself"):
        make_policy("agent", fallback="agent")
