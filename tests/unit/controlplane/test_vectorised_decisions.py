"""The vectorised slo policy, reserve rule and validation return exactly what their per-tenant
references return (tests/unit/controlplane/reference_policy.py): the same limits in the same
order, the same reasons, the same states and the same errors, on random pools and random
sequences of snapshots (floors, ceilings, weights, reserves, lendable and borrowing limits, SLOs,
preemptible tenants, learned reserves, saturation, hysteresis)."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

from hypothesis import given, settings
from hypothesis import strategies as st

from controlplane.core import publishable, reserves, validation
from controlplane.core.policy import PolicyDecision
from controlplane.core.slo_policy import SloPolicy, SloPolicyState
from controlplane.core.snapshot import PoolSnapshot, TelemetryView, TenantLoad
from slotshift.apportion import nominal_shares
from slotshift.config import PoolConfig, PreemptionConfig, SloPolicyConfig, TenantConfig
from slotshift.demand import LatencySummary
from tests.unit.controlplane import reference_policy as reference

_LATENCIES_MS = st.sampled_from([100.0, 200.0, 250.0, 300.0]) | st.floats(1, 2_000)


@st.composite
def _pools(draw: st.DrawFn) -> PoolConfig:
    count = draw(st.integers(1, 7))
    budget = draw(st.integers(count, 200))
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
                weight=draw(st.sampled_from([1.0, 2.0]) | st.floats(0.1, 5)),
                lendable_percent=draw(st.sampled_from([100.0, 50.0, 0.0]) | st.floats(0, 100)),
                borrowing_limit_percent=draw(st.none() | st.sampled_from([0.0, 50.0, 200.0])),
                preemptible=draw(st.booleans()),
                ttft_slo_ms=draw(st.none() | _LATENCIES_MS),
                e2e_slo_ms=draw(st.none() | _LATENCIES_MS),
            )
        )
    slo = SloPolicyConfig(
        hysteresis_slots=draw(st.integers(0, 3)),
        max_borrow_step_slots=draw(st.integers(1, 30)),
        full_share_hold_percent=draw(st.none() | st.sampled_from([75.0, 100.0, 10.0])),
        learned_reserves=draw(st.booleans()),
        slo_boost=draw(st.sampled_from([0.0, 2.0])),
    )
    return PoolConfig(
        name="p",
        budget_slots=budget,
        policy="slo",
        tenants=tenants,
        preemption=PreemptionConfig(enabled=draw(st.booleans())),
        slo_policy=slo,
    )


@st.composite
def _load(draw: st.DrawFn) -> TenantLoad:
    def latency() -> LatencySummary:
        if not draw(st.booleans()):
            return LatencySummary()
        p99 = draw(_LATENCIES_MS)
        return LatencySummary(
            count=draw(st.integers(1, 50)), p50_ms=p99 / 2, p90_ms=p99, p99_ms=p99
        )

    return TenantLoad(
        in_flight=draw(st.integers(0, 60)),
        queued=draw(st.sampled_from([0, 0, 5]) | st.integers(0, 80)),
        ttft=latency(),
        e2e=latency(),
    )


@st.composite
def _snapshots(
    draw: st.DrawFn, pool: PoolConfig, now_s: float
) -> tuple[dict[str, TenantLoad], TelemetryView | None]:
    names = [t.name for t in pool.tenants]
    # Some tenants named, some not (no figures yet), some idle.
    loads = {
        name: draw(st.just(TenantLoad()) | _load()) for name in names if draw(st.integers(0, 4)) > 0
    }
    telemetry = draw(
        st.none()
        | st.builds(
            TelemetryView,
            age_s=st.just(0.1),
            fresh=st.booleans(),
            kv_cache_usage_perc=st.sampled_from([0.2, 0.99]),
            num_requests_waiting=st.sampled_from([0.0, 50.0]),
        )
    )
    return loads, telemetry


def _outcome(function: Callable[..., object], *args: object, **kwargs: object) -> object:
    """function(*args, **kwargs), or its error as (type, message)."""
    try:
        return function(*args, **kwargs)
    except Exception as exc:  # both sides must raise the same
        return (type(exc), str(exc))


@given(st.data())
@settings(max_examples=400, deadline=None)
def test_the_slo_policy_decides_as_its_per_tenant_reference(data: st.DataObject) -> None:
    pool = data.draw(_pools())
    fast, slow = SloPolicy(), reference.ReferenceSloPolicy()
    fast_state: object | None = None
    slow_state: object | None = None
    current = nominal_shares(pool)
    now_s = 0.0
    for _ in range(data.draw(st.integers(1, 6))):
        now_s += data.draw(st.sampled_from([0.5, 2.0, 30.0]))
        loads, telemetry = data.draw(_snapshots(pool, now_s))
        if data.draw(st.integers(0, 5)) == 0:
            # Limits from elsewhere (a config change, the agent): any split, some tenant unnamed.
            current = {
                name: value for name, value in current.items() if data.draw(st.integers(0, 6))
            }
        snapshot = PoolSnapshot(
            now_s=now_s, tenants=loads, current_limits=current, telemetry=telemetry
        )
        got = _outcome(fast.decide, snapshot, pool, fast_state)
        expected = _outcome(slow.decide, snapshot, pool, slow_state)
        if not isinstance(expected, PolicyDecision):
            assert got == expected
            return
        assert isinstance(got, PolicyDecision)
        assert list(got.limits.items()) == list(expected.limits.items())
        assert got.reason == expected.reason
        assert got.state == expected.state
        assert isinstance(got.state, SloPolicyState)
        assert list(got.state.smoothed_demand.items()) == list(
            expected.state.smoothed_demand.items()  # type: ignore[attr-defined]
        )
        held = _outcome(publishable.holding_reserves, got, pool)
        assert held == _outcome(reference.holding_reserves, expected, pool)
        fast_state, slow_state = got.state, expected.state
        if isinstance(held, PolicyDecision):
            current = dict(held.limits)


@st.composite
def _limits(draw: st.DrawFn, pool: PoolConfig) -> dict[str, object]:
    """Limits for `pool`: mostly a valid split, sometimes off the budget, a bound, a type or a
    name."""
    names = [t.name for t in pool.tenants]
    limits: dict[str, object] = dict(nominal_shares(pool))
    for _ in range(draw(st.integers(0, 4))):
        giver, taker = draw(st.sampled_from(names)), draw(st.sampled_from(names))
        limits[giver] = int(limits[giver]) - 1  # type: ignore[call-overload]
        limits[taker] = int(limits[taker]) + 1  # type: ignore[call-overload]
    broken = draw(st.integers(0, 8))
    name = draw(st.sampled_from(names))
    if broken == 0:
        limits[name] = int(limits[name]) + 1  # type: ignore[call-overload]
    elif broken == 1:
        limits[name] = float(limits[name])  # type: ignore[arg-type]
    elif broken == 2:
        limits[name] = True
    elif broken == 3:
        del limits[name]
    elif broken == 4:
        limits["stranger"] = 0
    elif broken == 5:
        limits[name] = 10**30
    return limits


@dataclasses.dataclass(frozen=True)
class _Named:
    reserves: dict[str, int] | None


@given(st.data())
@settings(max_examples=600, deadline=None)
def test_the_reserve_rule_and_validation_answer_as_their_references(data: st.DataObject) -> None:
    pool = data.draw(_pools())
    names = [t.name for t in pool.tenants]
    limits = data.draw(_limits(pool))
    named = data.draw(
        st.none() | st.dictionaries(st.sampled_from(names), st.integers(0, pool.budget_slots))
    )
    state = _Named(named)
    assert reserves.reserves_in_force(pool, state) == reference.reserves_in_force(pool, state)
    assert reserves.configured_reserves(pool) == reference.configured_reserves(pool)
    assert reserves.preemptible_tenants(pool) == reference.preemptible_tenants(pool)
    in_force = reference.reserves_in_force(pool, state)
    checked = _outcome(validation.validate_limits, limits, pool)
    assert checked == _outcome(reference.validate_limits, limits, pool)
    with_reserves = _outcome(validation.validate_limits, limits, pool, reserves=in_force)
    assert with_reserves == _outcome(reference.validate_limits, limits, pool, reserves=in_force)
    decision = PolicyDecision(limits, "why", state)  # type: ignore[arg-type]
    assert _outcome(publishable.holding_reserves, decision, pool) == _outcome(
        reference.holding_reserves, decision, pool
    )
    if checked is None:
        valid: dict[str, int] = limits  # type: ignore[assignment]
        for any_reserves in (in_force, named or {}):
            assert reserves.reserve_excess(valid, pool, any_reserves) == reference.reserve_excess(
                valid, pool, any_reserves
            )
            held = reserves.hold_reserves(valid, pool, any_reserves)
            expected = reference.hold_reserves(valid, pool, any_reserves)
            assert list(held.items()) == list(expected.items())
