"""Config changes of the admin API: valid ones build the new pool config, invalid ones name the
field at fault, and the running config is never touched; a removed tenant's slots come back
only as its gateways drain."""

from __future__ import annotations

import pytest

from controlplane.core.config_change import (
    ConfigChangeError,
    UnknownTenantError,
    add_tenant,
    check_fleet_keys,
    check_new_keys,
    config_key_digests,
    remove_tenant,
    set_policy,
    update_tenant,
)
from controlplane.core.demand_policy import DemandPolicy
from controlplane.decision_loop import DecisionLoop
from controlplane.pool_state import PoolState
from slotshift.clock import ManualClock
from slotshift.config import PoolConfig, TenantConfig
from slotshift.demand import TenantDemand
from slotshift.keys import KeyDigester

DIGESTER = KeyDigester.keyed("test-key-digest-secret-of-32-bytes")
"""The deployment's digester in these tests (keyed, as shipped configs are)."""


POOL = PoolConfig(
    name="p",
    budget_slots=20,
    tenants=[
        TenantConfig(name="A", floor_slots=4, api_keys=["key-a"]),
        TenantConfig(name="B", floor_slots=4, api_keys=["key-b"]),
    ],
)


def test_add_tenant_builds_a_valid_pool_without_keys() -> None:
    pool = add_tenant(POOL, "C", {"floor_slots": 2, "weight": 2.0, "ttft_slo_ms": 500.0})
    tenant = pool.tenants[-1]
    assert (tenant.name, tenant.floor_slots, tenant.weight, tenant.ttft_slo_ms) == (
        "C",
        2,
        2.0,
        500.0,
    )
    assert tenant.api_keys == []
    # The existing tenants keep their keys and settings; the original is untouched.
    assert pool.tenants[0].api_keys[0].get_secret_value() == "key-a"
    assert [t.name for t in POOL.tenants] == ["A", "B"]


@pytest.mark.parametrize(
    ("change", "field"),
    [
        (lambda: add_tenant(POOL, "C", {"floor_slots": 13}), "tenant.floor_slots"),
        (lambda: add_tenant(POOL, "C", {"floor_slots": -1}), "tenant.floor_slots"),
        (lambda: add_tenant(POOL, "C", {"weight": 0.0}), "tenant.weight"),
        (lambda: add_tenant(POOL, "A", {}), "tenant.name"),
        (lambda: add_tenant(POOL, "bad name!", {}), "tenant.name"),
        (lambda: add_tenant(POOL, "C", {"api_keys": ["x"]}), "tenant.api_keys"),
        (lambda: update_tenant(POOL, "A", {"floor_slots": 17}), "tenant.floor_slots"),
        (lambda: update_tenant(POOL, "A", {"ceiling_slots": 3}), "tenant.ceiling_slots"),
        (lambda: update_tenant(POOL, "A", {"lendable_percent": 101.0}), "tenant.lendable_percent"),
        (lambda: update_tenant(POOL, "A", {"e2e_slo_ms": -5.0}), "tenant.e2e_slo_ms"),
        (lambda: update_tenant(POOL, "A", {}, ["weight"]), "clear"),
        (lambda: set_policy(POOL, "fastest"), "policy"),
    ],
)
def test_an_invalid_change_names_its_field(change: object, field: str) -> None:
    with pytest.raises(ConfigChangeError) as raised:
        change()  # type: ignore[operator]
    assert raised.value.field == field
    assert str(raised.value).startswith(f"{field}: ")


def test_the_last_tenant_cannot_be_removed() -> None:
    pool = remove_tenant(POOL, "B")
    with pytest.raises(ConfigChangeError, match=r"^tenant: 'A' is the last tenant"):
        remove_tenant(pool, "A")


def test_an_unknown_tenant_is_not_found() -> None:
    with pytest.raises(UnknownTenantError, match="no tenant 'Z'"):
        update_tenant(POOL, "Z", {"weight": 2.0})
    with pytest.raises(UnknownTenantError):
        remove_tenant(POOL, "Z")


def test_update_changes_only_what_it_names_and_clears() -> None:
    pool = update_tenant(POOL, "A", {"ceiling_slots": 10, "e2e_slo_ms": 900.0})
    assert (pool.tenants[0].ceiling_slots, pool.tenants[0].e2e_slo_ms) == (10, 900.0)
    assert pool.tenants[0].floor_slots == 4
    cleared = update_tenant(pool, "A", {"weight": 3.0}, ["ceiling_slots"])
    assert (cleared.tenants[0].ceiling_slots, cleared.tenants[0].weight) == (None, 3.0)
    assert cleared.tenants[0].e2e_slo_ms == 900.0


def test_new_keys_must_be_present_and_unique() -> None:
    digests = config_key_digests(POOL, DIGESTER)
    assert check_new_keys("C", ["key-c", "key-c"], digests, DIGESTER) == (DIGESTER.digest("key-c"),)
    for keys, message in (
        ([], "at least one key"),
        ([""], "non-empty"),
        (["with space"], "without whitespace"),
        (["key-a"], "another tenant"),
    ):
        with pytest.raises(ConfigChangeError, match=message) as raised:
            check_new_keys("C", keys, digests, DIGESTER)
        assert raised.value.field == "tenant.api_keys"


def _state(clock: ManualClock) -> PoolState:
    state = PoolState(
        POOL,
        clock=clock,
        gateway_lease_ttl_s=6.0,
        telemetry_stale_after_s=5.0,
        decision_log_size=16,
        key_digester=DIGESTER,
    )
    clock.advance(6.0)  # past the start-up hold
    return state


def test_replace_config_bumps_the_version_and_pushes_directory_then_allocation() -> None:
    clock = ManualClock()
    state = _state(clock)
    session = state.connect_gateway("gw", 0, {})
    assert session.directory is not None
    assert session.directory.tenants == config_key_digests(POOL, DIGESTER)
    session.directory = None
    session.mailbox.take_nowait()
    digests = {**state.key_digests, "C": (DIGESTER.digest("key-c"),)}
    version = state.replace_config(add_tenant(POOL, "C", {"floor_slots": 2}), digests)
    assert version == state.config_version == 2
    assert session.directory is not None
    assert session.directory.config_version == 2
    assert session.directory.tenants["C"] == (DIGESTER.digest("key-c"),)
    delivery = session.mailbox.take_nowait()
    assert delivery is not None
    assert set(delivery.allocation.gateways["gw"]) == {"A", "B", "C"}
    assert sum(delivery.allocation.tenant_limits.values()) == 20


def test_a_removed_tenants_slots_return_only_as_it_drains() -> None:
    clock = ManualClock()
    state = _state(clock)
    loop = DecisionLoop(state, DemandPolicy(), clock=clock)
    demand = [TenantDemand("A", in_flight=10, limit_slots=10), TenantDemand("B", limit_slots=10)]
    session = state.connect_gateway("gw", 0, demand)
    state.record_demand(session, 0, demand)
    version = state.replace_config(remove_tenant(POOL, "A"), state.key_digests)
    record = loop.decide_once(trigger=f"config v{version}: removed tenant A")
    assert record.trigger == "config v2: removed tenant A"
    assert dict(record.outputs) == {"B": 20}
    limits = state.allocation.gateways["gw"]
    # A may admit nothing more, and B gets only what A does not hold.
    assert limits["A"].limit_slots == 0
    assert limits["B"].target_slots == 20
    assert limits["B"].limit_slots == 10
    assert state.known_tenants() == {"A", "B"}
    # A acknowledges its 0 and drains: B gets the rest, and A is forgotten.
    drained = [TenantDemand("A", in_flight=0, limit_slots=0), TenantDemand("B", limit_slots=10)]
    state.record_ack(session, state.allocation.version, drained)
    assert state.allocation.gateways["gw"]["B"].limit_slots == 20
    state.record_demand(session, state.allocation.version, drained)
    assert state.known_tenants() == {"B"}
    assert "A" not in state.allocation.gateways["gw"]


def test_a_removed_last_tenant_leaves_the_policys_view_while_it_drains() -> None:
    """The last tenant's column stays where it was while it drains (the pool's tenants, then
    the draining ones): the policy must stop seeing it all the same."""
    clock = ManualClock()
    state = _state(clock)
    loop = DecisionLoop(state, DemandPolicy(), clock=clock)
    demand = [TenantDemand("A", limit_slots=10), TenantDemand("B", in_flight=10, limit_slots=10)]
    session = state.connect_gateway("gw", 0, demand)
    state.record_demand(session, 0, demand)
    version = state.replace_config(remove_tenant(POOL, "B"), state.key_digests)
    assert state.tenants == ("A", "B"), "B drains in its own column"
    assert set(state.snapshot().tenants) == {"A"}
    record = loop.decide_once(trigger=f"config v{version}: removed tenant B")
    assert dict(record.outputs) == {"A": 20}
    assert state.allocation.gateways["gw"]["B"].limit_slots == 0


def test_a_tenant_is_one_set_of_keys_across_the_pools() -> None:
    fleet = {"A": [DIGESTER.digest("key-a")], "B": [DIGESTER.digest("key-b")]}
    check_fleet_keys("A", [DIGESTER.digest("key-a")], fleet)  # A joins a second pool, same key
    check_fleet_keys("C", [DIGESTER.digest("key-c")], fleet)  # a new tenant, a new key
    with pytest.raises(ConfigChangeError, match="holds other keys in another pool"):
        check_fleet_keys("A", [DIGESTER.digest("key-a2")], fleet)
    with pytest.raises(ConfigChangeError, match="already identifies another tenant"):
        check_fleet_keys("C", [DIGESTER.digest("key-b")], fleet)
