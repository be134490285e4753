"""PoolState with preemptible borrowers: a queued lender has borrowed work paused at once, the
budget holds while work pauses and resumes, and nothing within a borrower's share is paused."""

from __future__ import annotations

import random
from dataclasses import dataclass

import numpy as np
import pytest

from controlplane.core.allocation import NO_PAUSE
from controlplane.core.slo_policy import SloPolicy
from controlplane.decision_loop import DecisionLoop
from controlplane.pool_state import PoolState
from slotshift.clock import ManualClock
from slotshift.config import PoolConfig, PreemptionConfig, TenantConfig
from slotshift.demand import TenantDemand
from tests.unit.controlplane.test_pool_state import SimGateway, random_walk

POOL = PoolConfig(
    name="p",
    budget_slots=96,
    policy="slo",
    tenants=[
        TenantConfig(name="A", floor_slots=4),
        TenantConfig(name="B", floor_slots=4, preemptible=True),
    ],
)


@dataclass
class PausingGateway(SimGateway):
    """A SimGateway that pauses down to the level it is sent: paused work leaves at once and
    waits at the head of the tenant's queue, counted as queued."""

    paused_total: int = 0

    def apply_pending(self, state: PoolState) -> bool:
        assert self.session is not None
        delivery = self.session.mailbox.take_nowait()
        if delivery is None or delivery.allocation.version <= self.applied_version:
            return False
        limits = delivery.allocation.gateways[self.gateway_id]
        self.limits = {t: lim.limit_slots for t, lim in limits.items()}
        self.applied_version = delivery.allocation.version
        for tenant, lim in limits.items():
            level = lim.pause_above_slots
            if level is not None and self.in_flight[tenant] > level:
                moved = self.in_flight[tenant] - level
                self.in_flight[tenant] = level
                self.queued[tenant] += moved
                self.paused_total += moved
        state.record_ack(self.session, self.applied_version, self.demand())
        return True


def _state(clock: ManualClock, pool: PoolConfig = POOL) -> PoolState:
    state = PoolState(
        pool,
        clock=clock,
        gateway_lease_ttl_s=6.0,
        telemetry_stale_after_s=5.0,
        decision_log_size=64,
    )
    clock.advance(6.0)
    return state


def _settle(state: PoolState, gateways: list[PausingGateway]) -> None:
    for _ in range(6):
        for gateway in gateways:
            assert gateway.session is not None
            gateway.apply_pending(state)
            gateway.admit()
            state.record_demand(gateway.session, gateway.applied_version, gateway.demand())


def _borrowing(
    pool: PoolConfig, decisions: int = 1
) -> tuple[ManualClock, PoolState, DecisionLoop, PausingGateway]:
    """B, backlogged, borrows what the slo policy lends of A's idle share in `decisions`
    decisions, every push applied and acknowledged."""
    clock = ManualClock()
    state = _state(clock, pool)
    loop = DecisionLoop(state, SloPolicy(), clock=clock)
    gateway = PausingGateway("gw", {"A": 48, "B": 48})
    gateway.connect(state)
    gateway.queued["B"] = 200
    for _ in range(decisions):
        _settle(state, [gateway])
        loop.decide_once()
    _settle(state, [gateway])
    return clock, state, loop, gateway


def _borrow_then_burst(pool: PoolConfig) -> tuple[PausingGateway, int]:
    """B borrows A's idle share; then A's burst of 30 reaches the control plane, the fast path
    decides, and every push is applied and acknowledged. Returns the gateway and what B ran
    before the burst."""
    _, state, loop, gateway = _borrowing(pool)
    borrowed = gateway.in_flight["B"]
    gateway.queued["A"] = 30
    assert gateway.session is not None
    state.record_demand(gateway.session, gateway.applied_version, gateway.demand())
    loop.decide_once(trigger="fast path")
    _settle(state, [gateway])
    return gateway, borrowed


def test_a_queued_lender_gets_its_share_back_in_one_round_trip() -> None:
    gateway, borrowed = _borrow_then_burst(POOL)
    assert borrowed > 48, "B borrowed A's idle share"
    # The push that carries A's share back tells the gateway how much of B's borrowed work to
    # pause: A runs its whole burst without waiting for B's requests to end.
    assert gateway.in_flight["A"] == 30
    assert gateway.paused_total == 30 - (96 - borrowed)
    assert gateway.in_flight["B"] >= 48, "B keeps its own share"


def test_a_borrower_that_did_not_opt_in_is_waited_for() -> None:
    pool = POOL.model_copy(
        update={"tenants": [TenantConfig(name="A", floor_slots=4), TenantConfig(name="B")]}
    )
    gateway, _ = _borrow_then_burst(pool)
    assert gateway.paused_total == 0
    assert gateway.in_flight["A"] < 30


def test_preemption_switched_off_pauses_nothing() -> None:
    gateway, _ = _borrow_then_burst(
        POOL.model_copy(update={"preemption": PreemptionConfig(enabled=False)})
    )
    assert gateway.paused_total == 0


def test_waste_over_the_cap_stops_pausing() -> None:
    clock = ManualClock()
    state = _state(clock)
    gateway = PausingGateway("gw", {"A": 48, "B": 48})
    gateway.connect(state)
    assert gateway.session is not None
    demand = gateway.demand()
    state.record_demand(gateway.session, 0, demand)
    # B runs 80 (its share is 48) at a gateway that grants it 10 while A waits.
    b = state.tenants.index("B")
    running = np.zeros((1, len(state.tenants)), dtype=np.int64)
    running[0, b] = 80
    granted = np.zeros_like(running)
    granted[0, b] = 10
    queued = np.zeros_like(running)
    queued[0, state.tenants.index("A")] = 1
    assert (state._pause_levels(running, granted, queued) != NO_PAUSE).any(), "under the cap"
    clock.advance(1.0)
    wasteful = [d for d in demand if d.tenant != "B"]
    wasteful.append(TenantDemand("B", output_tokens_total=1_000, waste_tokens_total=50))
    state.record_demand(gateway.session, 0, wasteful)
    assert state.waste_percent() == pytest.approx(5.0)
    assert state.waste_percent() > POOL.preemption.max_waste_percent
    # Over the cap, none of it is paused.
    assert (state._pause_levels(running, granted, queued) == NO_PAUSE).all()
    # Nothing is paused, so the policies see no preemptible tenant: a lender's reserve is not
    # lent to B while it could come back only as B's requests end.
    assert state.policy_pool.preemption.enabled is False
    assert state.pool.preemption.enabled is True, "the configuration itself is unchanged"


def test_a_reserve_is_not_lent_to_a_preemptible_tenant_while_waste_is_over_the_cap() -> None:
    pool = POOL.model_copy(
        update={
            "tenants": [
                TenantConfig(name="A", floor_slots=4, lendable_percent=50),
                TenantConfig(name="B", floor_slots=4, preemptible=True),
            ]
        }
    )
    # The policy lends its way down in steps.
    clock, state, loop, gateway = _borrowing(pool, decisions=2)
    assert state.allocation.tenant_limits["A"] < 24, "A idles: B (preemptible) borrows A's reserve"
    assert gateway.session is not None
    clock.advance(1.0)
    demand = [d for d in gateway.demand() if d.tenant != "B"]
    demand.append(TenantDemand("B", output_tokens_total=1_000, waste_tokens_total=50))
    state.record_demand(gateway.session, gateway.applied_version, demand)
    loop.decide_once()
    assert state.allocation.tenant_limits["A"] >= 24, "A's reserve (half its 48) is held back"


def test_budget_holds_while_work_pauses_and_resumes() -> None:
    paused = sum(_random_walk(seed) for seed in range(12))
    assert paused > 0, "the walks exercised pausing"


def _random_walk(seed: int) -> int:
    """Random interleavings of pushes, acks, arrivals, completions, reports and decisions;
    returns how many requests were paused."""
    rng = random.Random(seed)
    clock = ManualClock()
    state = _state(clock)
    loop = DecisionLoop(state, SloPolicy(), clock=clock)
    gateways = [PausingGateway(f"gw{i}", {"A": 16, "B": 16}) for i in range(3)]
    for gateway in gateways:
        gateway.connect(state)
    random_walk(
        rng,
        state,
        loop,
        gateways,
        steps=2_000,
        arrivals=20,
        completions_below=0.7,
        decision_gaps_s=(0.1, 2.0),
    )
    return sum(g.paused_total for g in gateways)
