"""What a gateway enforces when it loses the control plane: the last allocation, or with
`on_controlplane_loss: fallback` never more than its static fallback split; what it reports of
each tenant."""

from __future__ import annotations

from admission_gateway.gateway_state import GatewayState, TenantLimit
from slotshift.clock import ManualClock
from slotshift.config import GatewayConfig, PoolConfig, TenantConfig
from slotshift.demand import LatencySummary, TenantDemand

POOL = PoolConfig(
    name="p",
    budget_slots=96,
    tenants=[TenantConfig(name="A", floor_slots=4), TenantConfig(name="B", floor_slots=4)],
)


def _state(mode: str) -> GatewayState:
    state = GatewayState(
        POOL,
        GatewayConfig(fallback_replicas=2, on_controlplane_loss=mode),
        ManualClock(),
    )
    assert state.apply_allocation(
        3,
        [
            TenantLimit("A", target_slots=2, limit_slots=2),
            TenantLimit("B", target_slots=46, limit_slots=46),
        ],
    )
    return state


def _limits(state: GatewayState) -> dict[str, int]:
    return {name: tenant.admission.limit_slots for name, tenant in state.tenants.items()}


def test_keep_enforces_the_last_allocation() -> None:
    state = _state("keep")
    assert not state.controlplane_lost()
    assert _limits(state) == {"A": 2, "B": 46}


def test_fallback_cuts_each_tenant_to_at_most_its_static_split() -> None:
    state = _state("fallback")
    assert state.controlplane_lost()
    # The fallback split is each nominal share (48) over two replicas: 24. A keeps its 2.
    assert _limits(state) == {"A": 2, "B": 24}
    assert state.applied_version == 3, "the version in force does not change"


async def test_a_tenants_demand_is_built_from_its_counts_windows_and_tokens_in_ms() -> None:
    clock = ManualClock()
    state = GatewayState(POOL, GatewayConfig(), clock)
    tenant = state.tenants["A"]
    slot = await tenant.admission.acquire()
    tenant.ttft.observe(0.125)
    tenant.e2e.observe(0.5)
    tenant.output_tokens_total = 40
    tenant.discarded_output_tokens_total = 3
    demand = {d.tenant: d for d in state.demand()}["A"]
    assert demand == TenantDemand(
        "A",
        in_flight=1,
        admitted_total=1,
        limit_slots=tenant.admission.limit_slots,
        ttft=LatencySummary(count=1, p50_ms=125.0, p90_ms=125.0, p99_ms=125.0),
        e2e=LatencySummary(count=1, p50_ms=500.0, p90_ms=500.0, p99_ms=500.0),
        queue_wait=LatencySummary(count=1),
        output_tokens_total=40,
        waste_tokens_total=3,
    )
    slot.release()


def test_a_delta_changes_the_tenants_it_names_and_a_whole_update_zeroes_the_rest() -> None:
    state = _state("keep")
    assert state.apply_allocation(
        4, [TenantLimit("B", target_slots=40, limit_slots=40)], delta=True
    )
    assert _limits(state) == {"A": 2, "B": 40}, "A keeps what it had"
    assert state.apply_allocation(5, [TenantLimit("B", target_slots=30, limit_slots=30)])
    assert _limits(state) == {"A": 0, "B": 30}, "a whole update that does not name A gives it 0"
    assert not state.apply_allocation(5, [], delta=True), "not newer: nothing changes"
