"""The slo policy: lends idle slots, reclaims at once, keeps reserves, caps borrowing, favours
tenants over their SLO, holds borrowing while the engine is saturated."""

from __future__ import annotations

import random

import pytest

from controlplane.core.slo_policy import SloPolicy, SloPolicyState
from controlplane.core.snapshot import PoolSnapshot, TelemetryView, TenantLoad
from slotshift.apportion import nominal_shares
from slotshift.config import PoolConfig, SloPolicyConfig, TenantConfig
from slotshift.demand import LatencySummary


def _pool(**tenant_a: object) -> PoolConfig:
    return PoolConfig(
        name="p",
        budget_slots=96,
        policy="slo",
        tenants=[
            TenantConfig(name="A", floor_slots=4, **tenant_a),
            TenantConfig(name="B", floor_slots=4),
        ],
        slo_policy=SloPolicyConfig(max_borrow_step_slots=96, hysteresis_slots=0),
    )


def _decide(
    pool: PoolConfig,
    loads: dict[str, TenantLoad],
    current: dict[str, int],
    *,
    state: object | None = None,
    now_s: float = 0.0,
    telemetry: TelemetryView | None = None,
) -> tuple[dict[str, int], object | None]:
    snapshot = PoolSnapshot(now_s=now_s, tenants=loads, current_limits=current, telemetry=telemetry)
    decision = SloPolicy().decide(snapshot, pool, state)
    return dict(decision.limits), decision.state


def test_idle_tenant_lends_all_but_its_floor() -> None:
    limits, _ = _decide(_pool(), {"B": TenantLoad(in_flight=48, queued=200)}, {"A": 48, "B": 48})
    assert limits == {"A": 4, "B": 92}


def test_reserve_is_never_lent() -> None:
    pool = _pool(lendable_percent=50)
    limits, _ = _decide(pool, {"B": TenantLoad(in_flight=48, queued=200)}, {"A": 48, "B": 48})
    assert limits == {"A": 24, "B": 72}


def test_a_returning_tenant_gets_up_to_its_nominal_share_at_once() -> None:
    pool = _pool()
    loads = {"A": TenantLoad(queued=40), "B": TenantLoad(in_flight=92, queued=100)}
    limits, _ = _decide(pool, loads, {"A": 4, "B": 92})
    assert limits["A"] >= 40
    loads = {"A": TenantLoad(queued=70), "B": TenantLoad(in_flight=92, queued=100)}
    limits, _ = _decide(pool, loads, {"A": 4, "B": 92})
    assert limits["A"] >= 48, "asking for more than its share gets at least the share back"


def test_borrowing_limit_caps_the_borrower() -> None:
    pool = PoolConfig(
        name="p",
        budget_slots=96,
        tenants=[
            TenantConfig(name="A", floor_slots=4),
            TenantConfig(name="B", floor_slots=4, borrowing_limit_percent=50),
            TenantConfig(name="C", floor_slots=4),
        ],
    )
    limits, _ = _decide(pool, {"B": TenantLoad(queued=500)}, {"A": 32, "B": 32, "C": 32})
    assert limits["B"] == 48
    assert sum(limits.values()) == 96


def test_borrowing_grows_by_at_most_one_step() -> None:
    pool = _pool().model_copy(update={"slo_policy": SloPolicyConfig(max_borrow_step_slots=10)})
    loads = {"B": TenantLoad(in_flight=48, queued=200)}
    limits, state = _decide(pool, loads, {"A": 48, "B": 48})
    assert limits == {"A": 38, "B": 58}
    limits, _ = _decide(pool, loads, limits, state=state, now_s=2.0)
    assert limits == {"A": 28, "B": 68}


def test_saturated_engine_holds_borrowing() -> None:
    saturated = TelemetryView(age_s=0.1, fresh=True, kv_cache_usage_perc=0.99)
    loads = {"A": TenantLoad(in_flight=10), "B": TenantLoad(in_flight=60, queued=200)}
    limits, _ = _decide(_pool(), loads, {"A": 36, "B": 60}, telemetry=saturated)
    assert limits["B"] == 60, "no growth while saturated"
    stale = TelemetryView(age_s=30, fresh=False, kv_cache_usage_perc=0.99)
    limits, _ = _decide(_pool(), loads, {"A": 36, "B": 60}, telemetry=stale)
    assert limits["B"] > 60, "stale telemetry does not hold anything"


@pytest.mark.parametrize(
    ("waiting", "held"),
    [
        pytest.param(0.0, False, id="none waiting"),
        pytest.param(4.0, False, id="a few between arrival and the next step"),
        pytest.param(5.0, True, id="5% of the budget (96) rounds up to 5"),
        pytest.param(30.0, True, id="many"),
    ],
)
def test_only_more_than_a_few_waiting_requests_mean_saturation(waiting: float, held: bool) -> None:
    telemetry = TelemetryView(age_s=0.1, fresh=True, num_requests_waiting=waiting)
    loads = {"A": TenantLoad(in_flight=10), "B": TenantLoad(in_flight=60, queued=200)}
    limits, _ = _decide(_pool(), loads, {"A": 36, "B": 60}, telemetry=telemetry)
    assert (limits["B"] == 60) is held


def test_tenant_over_its_slo_gets_more_of_the_lent_slots() -> None:
    pool = PoolConfig(
        name="p",
        budget_slots=96,
        tenants=[
            TenantConfig(name="A", floor_slots=4, ttft_slo_ms=200),
            TenantConfig(name="B", floor_slots=4),
            TenantConfig(name="C", floor_slots=4),
        ],
        slo_policy=SloPolicyConfig(max_borrow_step_slots=96, hysteresis_slots=0),
    )
    current = {"A": 32, "B": 32, "C": 32}

    def loads(p99_ms: float) -> dict[str, TenantLoad]:
        # B idles and lends; A and C both want more than their share.
        return {
            "A": TenantLoad(in_flight=32, queued=60, ttft=LatencySummary(count=50, p99_ms=p99_ms)),
            "C": TenantLoad(in_flight=32, queued=60),
        }

    within, _ = _decide(pool, loads(100), current)
    over, _ = _decide(pool, loads(400), current)
    assert within["A"] == within["C"]
    assert over["A"] > over["C"]
    assert over["B"] == within["B"] == 4


def test_demand_decays_with_its_half_life() -> None:
    pool = _pool()
    busy = {"A": TenantLoad(in_flight=40), "B": TenantLoad(in_flight=56, queued=200)}
    limits, state = _decide(pool, busy, {"A": 48, "B": 48})
    assert isinstance(state, SloPolicyState)
    assert state.smoothed_demand["A"] == 40
    idle_a = {"B": TenantLoad(in_flight=56, queued=200)}
    _, state = _decide(pool, idle_a, limits, state=state, now_s=pool.slo_policy.demand_half_life_s)
    assert isinstance(state, SloPolicyState)
    assert state.smoothed_demand["A"] == pytest.approx(20)


def test_small_changes_are_held() -> None:
    pool = _pool().model_copy(update={"slo_policy": SloPolicyConfig(hysteresis_slots=3)})
    loads = {"A": TenantLoad(in_flight=30), "B": TenantLoad(in_flight=60, queued=10)}
    limits, _ = _decide(pool, loads, {"A": 30, "B": 66})
    first, _ = _decide(pool, loads, limits)
    assert first == limits


def test_owed_shares_hold_on_random_cases() -> None:
    rng = random.Random(11)
    for _ in range(2_000):
        pool = PoolConfig(
            name="p",
            budget_slots=rng.randint(3, 200),
            tenants=[
                TenantConfig(
                    name=n,
                    floor_slots=1,
                    weight=rng.uniform(0.2, 4),
                    lendable_percent=rng.uniform(0, 100),
                    borrowing_limit_percent=rng.choice([None, rng.uniform(0, 200)]),
                )
                for n in ("A", "B", "C")
            ],
        )
        nominal = nominal_shares(pool)
        loads = {
            n: TenantLoad(in_flight=rng.randint(0, 100), queued=rng.randint(0, 100))
            for n in ("A", "B", "C")
        }
        current = dict(nominal)
        limits, _ = _decide(pool, loads, current)
        for tenant in pool.tenants:
            assert limits[tenant.name] >= min(nominal[tenant.name], loads[tenant.name].demand_slots)
            if tenant.borrowing_limit_percent is not None:
                cap = nominal[tenant.name] + round(
                    nominal[tenant.name] * tenant.borrowing_limit_percent / 100
                )
                assert limits[tenant.name] <= max(cap, nominal[tenant.name])


def _three(**slo: object) -> PoolConfig:
    """A lends (reserve 24 of its 48), B is preemptible, C is not; 48 each nominal."""
    return PoolConfig(
        name="p",
        budget_slots=144,
        policy="slo",
        tenants=[
            TenantConfig(name="A", floor_slots=4, lendable_percent=50),
            TenantConfig(name="B", floor_slots=4, preemptible=True),
            TenantConfig(name="C", floor_slots=4),
        ],
        slo_policy=SloPolicyConfig(max_borrow_step_slots=96, hysteresis_slots=0, **slo),
    )


def test_a_reserve_is_lent_to_a_preemptible_borrower() -> None:
    pool = _pool(lendable_percent=50)
    lender, borrower = pool.tenants
    pool = pool.model_copy(
        update={"tenants": [lender, borrower.model_copy(update={"preemptible": True})]}
    )
    snapshot = PoolSnapshot(
        now_s=0.0,
        tenants={"B": TenantLoad(in_flight=48, queued=200)},
        current_limits={"A": 48, "B": 48},
    )
    decision = SloPolicy().decide(snapshot, pool, None)
    assert dict(decision.limits) == {"A": 4, "B": 92}
    assert "20 reserve slots lent to preemptible tenants" in decision.reason


def test_a_non_preemptible_borrower_gets_only_the_lendable_parts_and_the_rest_goes_on() -> None:
    """C (non-preemptible) may hold above its share only A's lendable 24; what fairness would
    have given C beyond that goes to B (preemptible, with demand), not back into A's idle
    reserve."""
    loads = {"B": TenantLoad(in_flight=48, queued=12), "C": TenantLoad(in_flight=48, queued=552)}
    limits, _ = _decide(_three(), loads, {"A": 48, "B": 48, "C": 48})
    assert limits == {"A": 4, "B": 68, "C": 72}


def test_with_no_preemptible_borrower_the_reserve_holds_whatever_the_weights() -> None:
    pool = _three()
    pool = pool.model_copy(
        update={"tenants": [t.model_copy(update={"preemptible": False}) for t in pool.tenants]}
    )
    loads = {"B": TenantLoad(in_flight=48, queued=12), "C": TenantLoad(in_flight=48, queued=552)}
    limits, _ = _decide(pool, loads, {"A": 48, "B": 48, "C": 48})
    assert limits["A"] == 24


def _learning(**settings: object) -> PoolConfig:
    return _pool().model_copy(
        update={
            "slo_policy": SloPolicyConfig(
                max_borrow_step_slots=96,
                hysteresis_slots=0,
                learned_reserves=True,
                reserve_percentile=100,
                reserve_burst_window_s=1.0,
                **settings,
            )
        }
    )


def test_a_learned_reserve_is_a_bursts_peak_in_its_first_window() -> None:
    pool = _learning()
    batch = TenantLoad(in_flight=48, queued=200)
    steps = [
        (0.0, 0),  # A idle: its reserve is its lendable_percent one (its floor, 4)
        (2.0, 6),  # a burst starts
        (2.5, 10),  # its peak within the first second
        (3.5, 40),  # outside the window: the burst is recorded with its peak, 10
        (5.0, 0),
    ]
    state: object | None = None
    current = {"A": 48, "B": 48}
    reasons = []
    for now_s, a_demand in steps:
        loads = {"A": TenantLoad(in_flight=a_demand), "B": batch}
        snapshot = PoolSnapshot(now_s=now_s, tenants=loads, current_limits=current)
        decision = SloPolicy().decide(snapshot, pool, state)
        state, current = decision.state, dict(decision.limits)
        reasons.append(decision.reason)
        assert isinstance(state, SloPolicyState)
        assert state.reserves is not None
    assert isinstance(state, SloPolicyState)
    assert state.reserves == {"A": 10, "B": 4}
    assert current == {"A": 10, "B": 86}, "A idles again and keeps its learned reserve"
    assert reasons[0].endswith("; learned reserves A=4, B=4"), "the first decision names all"
    assert [r.count("learned reserves") for r in reasons[1:]] == [0, 0, 1, 0]
    assert reasons[3].endswith("; learned reserves A=10"), "only the reserve that changed"


@pytest.mark.parametrize(
    ("settings", "peak", "reserve"),
    [
        pytest.param({}, 10, 10, id="the peak"),
        pytest.param({"reserve_max_percent": 10}, 10, 5, id="at most 10% of 48, rounded"),
        pytest.param({"reserve_max_percent": 0}, 10, 4, id="never below the floor"),
        pytest.param({}, 1, 4, id="a small burst: the floor"),
    ],
)
def test_a_learned_reserve_is_bounded(settings: dict[str, object], peak: int, reserve: int) -> None:
    pool = _learning(**settings)
    state: object | None = None
    for now_s, a_demand in [(0.0, 0), (1.0, peak), (3.0, 0)]:
        loads = {"A": TenantLoad(queued=a_demand)}
        snapshot = PoolSnapshot(now_s=now_s, tenants=loads, current_limits={})
        state = SloPolicy().decide(snapshot, pool, state).state
    assert isinstance(state, SloPolicyState)
    assert state.reserves is not None
    assert state.reserves["A"] == reserve


def test_without_learned_reserves_the_state_names_none() -> None:
    _, state = _decide(_pool(lendable_percent=50), {"A": TenantLoad(in_flight=3)}, {})
    assert isinstance(state, SloPolicyState)
    assert state.reserves is None
    assert state.bursts == {}


def _with_preemptible_b(pool: PoolConfig, **slo: object) -> PoolConfig:
    lender, borrower = pool.tenants
    return pool.model_copy(
        update={
            "tenants": [lender, borrower.model_copy(update={"preemptible": True})],
            "slo_policy": pool.slo_policy.model_copy(update=slo),
        }
    )


def test_an_active_lender_holds_its_reserve_even_beside_a_preemptible_borrower() -> None:
    """Idle, A's reserve of 24 goes to B (preemptible); from A's first request on, A holds it
    all, so that the requests of its burst that follow are admitted at once."""
    pool = _with_preemptible_b(_pool(lendable_percent=50))
    idle, _ = _decide(pool, {"B": TenantLoad(in_flight=92, queued=100)}, {"A": 4, "B": 92})
    assert idle == {"A": 4, "B": 92}
    loads = {"A": TenantLoad(queued=1), "B": TenantLoad(in_flight=92, queued=100)}
    active, _ = _decide(pool, loads, {"A": 4, "B": 92})
    assert active["A"] == 24


@pytest.mark.parametrize(
    ("demand", "b_limit"),
    [
        pytest.param(24, 92 - 24 + 4, id="half its share: B keeps borrowing"),
        pytest.param(40, 48, id="most of its share: nobody holds more than its own share"),
        pytest.param(48, 48, id="all of its share"),
    ],
)
def test_a_lender_using_its_share_gets_static_speed(demand: int, b_limit: int) -> None:
    """(A tenant asking more than its share does not hold the others: see
    test_a_non_preemptible_borrower_gets_only_the_lendable_parts_and_the_rest_goes_on.)"""
    pool = _with_preemptible_b(_pool())
    loads = {"A": TenantLoad(in_flight=demand), "B": TenantLoad(in_flight=48, queued=100)}
    limits, _ = _decide(pool, loads, {"A": 48, "B": 48})
    assert limits["B"] == b_limit


def test_the_full_share_hold_can_be_switched_off() -> None:
    pool = _with_preemptible_b(_pool(), full_share_hold_percent=None)
    loads = {"A": TenantLoad(in_flight=40), "B": TenantLoad(in_flight=48, queued=100)}
    limits, _ = _decide(pool, loads, {"A": 48, "B": 48})
    assert limits["B"] > 48


@pytest.mark.parametrize(
    ("p99_ms", "reserve"),
    [
        pytest.param(150.0, 12, id="within its SLO: the configured reserve"),
        pytest.param(250.0, 18, id="25% over: x1.5 (slo_boost 2)"),
        pytest.param(2000.0, 48, id="far over: up to its nominal share"),
    ],
)
def test_a_lender_over_its_slo_holds_a_reserve_grown_by_its_pressure(
    p99_ms: float, reserve: int
) -> None:
    """A's reserve is a quarter of its share (12); while its p99 TTFT is over its objective, its
    bursts outgrow the reserve, so the reserve grows with the SLO pressure, up to the share."""
    pool = _with_preemptible_b(_pool(lendable_percent=75, ttft_slo_ms=200))
    ttft = LatencySummary(count=50, p99_ms=p99_ms)
    loads = {"A": TenantLoad(in_flight=2, ttft=ttft), "B": TenantLoad(in_flight=84, queued=100)}
    limits, _ = _decide(pool, loads, {"A": 12, "B": 84})
    assert limits["A"] == reserve
