"""What the control plane does with the figures gateways send: the newest kept per gateway (in
stream order), a report's applied version taken as an acknowledgement, the pool-wide totals and
the demand's age shown where people look."""

from __future__ import annotations

import random
from dataclasses import dataclass, field
from typing import cast

import grpc
import pytest

from controlplane.core.config_change import remove_tenant
from controlplane.core.demand_policy import DemandPolicy
from controlplane.decision_loop import DecisionLoop
from controlplane.pool_state import PoolState
from controlplane.service import convert
from controlplane.service.query_service import AllocationQueryService
from slotshift.clock import ManualClock
from slotshift.demand import LatencySummary, TenantDemand
from slotshift.v1 import query_pb2
from tests.unit.controlplane.test_pool_state import (
    POOL,
    SimGateway,
    _state,
    assert_each_enforces_its_part,
    random_walk,
    settle,
)


def _queued_b(state: PoolState) -> int:
    return state.snapshot().tenants["B"].queued


def test_figures_are_taken_in_stream_order_whatever_their_stamps() -> None:
    clock = ManualClock()
    state = _state(clock)
    session = state.connect_gateway("gw", 0, [], observed_at_wall_s=clock.wall())
    now = clock.wall()
    assert state.record_demand(session, 0, [TenantDemand("B", queued=30)], observed_at_wall_s=now)
    # The gateway's clock stepped back: its figures are still the newest the stream brought.
    stepped = [TenantDemand("B", queued=5)]
    assert state.record_demand(session, 0, stepped, observed_at_wall_s=now - 10.0)
    assert _queued_b(state) == 5
    # A gateway that does not say when it observed is taken too.
    assert state.record_demand(session, 0, [TenantDemand("B", queued=7)])
    assert _queued_b(state) == 7


def test_an_ack_counts_its_version_and_brings_the_newest_figures() -> None:
    clock = ManualClock()
    state = _state(clock)
    gateway = SimGateway("gw", {"A": 48, "B": 48})
    gateway.connect(state)
    assert gateway.session is not None
    now = clock.wall()
    state.record_demand(gateway.session, 0, [TenantDemand("B", queued=30)], observed_at_wall_s=now)
    delivery = gateway.session.mailbox.take_nowait()
    assert delivery is not None
    version = delivery.allocation.version
    state.record_ack(
        gateway.session, version, [TenantDemand("B", queued=1)], observed_at_wall_s=now + 1.0
    )
    assert state.applied_versions() == {"gw": version}
    assert _queued_b(state) == 1


def _raise_waiting_for_a_lost_ack() -> tuple[PoolState, SimGateway, int]:
    """A decision moves slots from idle A to backlogged B at one gateway: B's raise waits until
    the gateway is known to enforce A's cut. The gateway applies it; its ack is lost."""
    clock = ManualClock()
    state = _state(clock)
    loop = DecisionLoop(state, DemandPolicy(), clock=clock)
    gateway = SimGateway("gw", {"A": 48, "B": 48})
    gateway.connect(state)
    gateway.apply_pending(state)
    assert gateway.session is not None
    gateway.queued["B"] = 200
    gateway.admit()
    state.record_demand(gateway.session, gateway.applied_version, gateway.demand())
    loop.decide_once()
    delivery = gateway.session.mailbox.take_nowait()
    assert delivery is not None
    limits = delivery.allocation.gateways["gw"]
    assert limits["A"].limit_slots < 48, "A is cut at once"
    assert limits["B"].limit_slots == 48 < limits["B"].target_slots, "B's raise waits"
    gateway.limits = {t: lim.limit_slots for t, lim in limits.items()}
    gateway.applied_version = delivery.allocation.version
    return state, gateway, delivery.allocation.version


def test_a_lost_ack_is_healed_by_the_next_report() -> None:
    state, gateway, version = _raise_waiting_for_a_lost_ack()
    assert gateway.session is not None
    assert state.applied_versions() == {"gw": version - 1}
    # The report says which version the gateway enforces: as good as the ack.
    state.record_demand(gateway.session, gateway.applied_version, gateway.demand())
    assert state.applied_versions() == {"gw": version}
    b = state.allocation.gateways["gw"]["B"]
    assert b.limit_slots == b.target_slots > 48, "B's raise is granted"


def test_an_ack_after_the_report_that_healed_it_still_measures_the_push() -> None:
    state, gateway, version = _raise_waiting_for_a_lost_ack()
    assert gateway.session is not None
    state.record_demand(gateway.session, gateway.applied_version, gateway.demand())
    # Not lost after all, only late: it is counted once more, harmlessly, and timed.
    latency = state.record_ack(gateway.session, version, gateway.demand())
    assert latency == pytest.approx(0.0)
    assert state.applied_versions()["gw"] >= version


@dataclass
class LossyGateway(SimGateway):
    """A SimGateway whose acknowledgements are lost now and then; its reports still go."""

    rng: random.Random = field(default_factory=random.Random)

    def apply_pending(self, state: PoolState) -> bool:
        assert self.session is not None
        delivery = self.session.mailbox.take_nowait()
        if delivery is None or delivery.allocation.version <= self.applied_version:
            return False
        allocation = delivery.allocation
        self.limits = {
            t: lim.limit_slots for t, lim in allocation.gateways[self.gateway_id].items()
        }
        self.applied_version = allocation.version
        if self.rng.random() < 0.5:
            state.record_ack(self.session, allocation.version, self.demand())
        return True


@pytest.mark.parametrize("seed", range(8))
def test_budget_holds_and_limits_converge_when_acks_are_lost(seed: int) -> None:
    rng = random.Random(seed)
    clock = ManualClock()
    state = _state(clock)
    loop = DecisionLoop(state, DemandPolicy(), clock=clock)
    gateways = [LossyGateway(f"gw{i}", {"A": 16, "B": 16}, rng=rng) for i in range(3)]
    for gateway in gateways:
        gateway.connect(state)
    random_walk(rng, state, loop, gateways, steps=2_000, arrivals=30)
    # Reports alone (every ack may be lost) bring every gateway to its target.
    settle(state, gateways, rounds=6)
    allocation = state.allocation
    for limits in allocation.gateways.values():
        for lim in limits.values():
            assert lim.limit_slots == lim.target_slots
    # Every gateway is known to enforce the last version sent to it (gateways whose part did
    # not change keep an older one), and enforces exactly its part.
    assert state.applied_versions() == {g.gateway_id: g.applied_version for g in gateways}
    assert_each_enforces_its_part(state, gateways)


def _two_reporting_gateways(clock: ManualClock) -> PoolState:
    state = _state(clock)
    now = clock.wall()
    for gateway_id, observed, admitted in (("gw1", now - 5.0, 10), ("gw2", now - 2.0, 7)):
        session = state.connect_gateway(gateway_id, 0, [])
        state.record_demand(
            session,
            0,
            [
                TenantDemand(
                    "B",
                    queued=3,
                    admitted_total=admitted,
                    completed_total=admitted - 1,
                    rejected_total=2,
                )
            ],
            observed_at_wall_s=observed,
        )
    return state


def test_the_snapshot_sums_the_totals_and_ages_the_demand_by_its_oldest_figures() -> None:
    clock = ManualClock()
    state = _two_reporting_gateways(clock)
    b = state.snapshot().tenants["B"]
    assert (b.queued, b.admitted_total, b.completed_total, b.rejected_total) == (6, 17, 15, 4)
    assert b.demand_age_s == pytest.approx(5.0)
    # A tenant no gateway reported with a time: its age is unknown.
    assert state.snapshot().tenants["A"].demand_age_s is None


def test_a_decision_shows_the_age_of_the_demand_it_saw() -> None:
    clock = ManualClock()
    state = _two_reporting_gateways(clock)
    clock.advance(1.0)
    record = DecisionLoop(state, DemandPolicy(), clock=clock).decide_once()
    inputs = {i.tenant: i for i in convert.decision_to_proto(POOL, record).inputs}
    assert inputs["B"].demand_age_s == pytest.approx(6.0)
    assert inputs["A"].demand_age_s == -1.0, "negative: unknown"


async def test_list_tenants_shows_the_pool_wide_totals() -> None:
    clock = ManualClock()
    state = _two_reporting_gateways(clock)
    service = AllocationQueryService({"p": state})
    context = cast("grpc.aio.ServicerContext[object, object]", None)  # unused: no pool to find
    response = await service.ListTenants(query_pb2.ListTenantsRequest(), context)
    b = next(t for t in response.tenants if t.allocation.tenant == "B")
    assert (b.in_flight, b.queued) == (0, 6)
    assert (b.admitted_total, b.completed_total, b.rejected_total) == (17, 15, 4)


def test_a_delta_report_changes_only_the_tenants_it_names() -> None:
    clock = ManualClock()
    state = _state(clock)
    whole = [
        TenantDemand("A", in_flight=3, queued=1, output_tokens_total=100, waste_tokens_total=1),
        TenantDemand("B", in_flight=5, queued=2, output_tokens_total=200, waste_tokens_total=2),
    ]
    session = state.connect_gateway("gw", 0, whole)
    state.record_demand(session, 0, [TenantDemand("B", in_flight=1, queued=9)], delta=True)
    tenants = state.snapshot().tenants
    assert (tenants["A"].in_flight, tenants["A"].queued) == (3, 1), "A stands as last sent"
    assert (tenants["B"].in_flight, tenants["B"].queued) == (1, 9)
    # A whole report replaces everything: a tenant it does not name has no figures.
    state.record_demand(session, 0, [TenantDemand("B", in_flight=2)])
    tenants = state.snapshot().tenants
    assert (tenants["A"].in_flight, tenants["B"].in_flight) == (0, 2)


def test_delta_figures_keep_the_pools_token_counters_exact() -> None:
    clock = ManualClock()
    state = _state(clock)
    session = state.connect_gateway("gw", 0, [])
    figures = {
        "A": TenantDemand("A", output_tokens_total=1_000, waste_tokens_total=0),
        "B": TenantDemand("B", output_tokens_total=1_000, waste_tokens_total=0),
    }
    state.record_demand(session, 0, list(figures.values()))
    clock.advance(1.0)
    # B's counters move and A's do not: a delta names B only; the window sees 1,000 more
    # output tokens of which 50 are waste.
    figures["B"] = TenantDemand("B", output_tokens_total=2_000, waste_tokens_total=50)
    state.record_demand(session, 0, [figures["B"]], delta=True)
    assert state.waste_percent() == pytest.approx(5.0)


def _loads_from_scratch(state: PoolState) -> dict[str, tuple[int, int, int, int, int, int]]:
    """What the snapshot must say, summed afresh from every gateway's held figures."""
    result = {}
    for tenant in state.pool.tenants:
        held = [
            r.demand(state.tenants)[tenant.name]
            for r in state.gateways
            if tenant.name in r.demand(state.tenants)
        ]
        ttft = [d.ttft for d in held if d.ttft.count > 0]
        result[tenant.name] = (
            sum(d.in_flight for d in held),
            sum(d.queued for d in held),
            sum(d.admitted_total for d in held),
            sum(d.ttft.count for d in held if d.ttft.count > 0),
            int(max((lat.p99_ms for lat in ttft), default=0.0)),
            round(sum(lat.p50_ms * lat.count for lat in ttft)),
        )
    return result


@pytest.mark.parametrize("seed", range(6))
def test_the_snapshots_sums_equal_a_sum_from_scratch(seed: int) -> None:
    rng = random.Random(seed)
    clock = ManualClock()
    state = _state(clock)
    sessions = {g: state.connect_gateway(g, 0, []) for g in ("gw1", "gw2", "gw3")}
    for _ in range(400):
        gateway = rng.choice(sorted(sessions))
        figures = [
            TenantDemand(
                t,
                in_flight=rng.randint(0, 9),
                queued=rng.randint(0, 9),
                admitted_total=rng.randint(0, 99),
                ttft=LatencySummary(
                    rng.randint(0, 3),
                    float(rng.randint(1, 9) * 10),
                    0.0,
                    float(rng.randint(1, 9) * 100),
                ),
            )
            for t in ("A", "B")
            if rng.random() < 0.7
        ]
        action = rng.random()
        if action < 0.45:
            state.record_demand(sessions[gateway], 0, figures, delta=True)
        elif action < 0.8:
            state.record_demand(sessions[gateway], 0, figures)
        elif action < 0.9:
            state.disconnect_gateway(sessions[gateway])
            clock.advance(10.0)
            state.expire_leases()
            sessions[gateway] = state.connect_gateway(gateway, 0, figures)
        else:
            sessions[gateway] = state.connect_gateway(gateway, 0, figures)  # a reconnect
        got = {
            name: (
                load.in_flight,
                load.queued,
                load.admitted_total,
                load.ttft.count,
                int(load.ttft.p99_ms),
                round(load.ttft.p50_ms * load.ttft.count),
            )
            for name, load in state.snapshot().tenants.items()
        }
        assert got == _loads_from_scratch(state)


def test_a_gateway_holding_only_a_removed_tenants_figures_ages_no_other_tenant() -> None:
    clock = ManualClock()
    state = _state(clock)
    session = state.connect_gateway("gw", 0, [TenantDemand("A", in_flight=5, limit_slots=5)])
    state.replace_config(remove_tenant(POOL, "A"), state.key_digests)
    # A drains: the gateway still names it, and no other tenant.
    state.record_demand(
        session, 0, [TenantDemand("A", in_flight=5)], observed_at_wall_s=clock.wall() - 3.0
    )
    assert state.known_tenants() == {"A", "B"}
    assert state.snapshot().tenants["B"].demand_age_s is None, "nobody reported B"
