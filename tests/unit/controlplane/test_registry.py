"""controlplane/registry.py: sessions, leases and the bounds of what each gateway may hold."""

from __future__ import annotations

import numpy as np
import pytest

from controlplane.registry import GatewayRegistry, TenantDirectory
from slotshift.clock import ManualClock
from slotshift.demand import TenantDemand
from slotshift.demand_columns import DemandColumns

DIRECTORY = TenantDirectory(pool="p", config_version=1, tenants={})


def _registry(clock: ManualClock) -> GatewayRegistry:
    return GatewayRegistry(clock=clock, lease_ttl_s=10.0)


def test_a_reconnection_replaces_the_session_and_keeps_what_the_old_one_may_still_apply() -> None:
    registry = _registry(ManualClock())
    first, previous = registry.connect("gw", 2, 0, DIRECTORY)
    assert previous is None
    first.send(3, np.array([4, 1], dtype=np.int64), now_s=0.0)
    first.send(5, np.array([2, 6], dtype=np.int64), now_s=0.0)
    second, previous = registry.connect("gw", 2, 3, DIRECTORY)
    assert previous is first
    assert first.session.mailbox.closed, "the old stream ends"
    assert registry.live(first.session) is None, "its events are ignored"
    assert registry.live(second.session) is second
    assert sorted(second.sent) == [5], "version 3 is applied; 5 may still be"
    assert second.bounds().tolist() == [2, 6]
    assert registry.part_versions() == {"gw": 5}, "the newest version sent to the gateway"
    assert registry.applied_versions() == {"gw": 3}


def test_bounds_are_the_most_of_in_flight_acknowledged_and_pending() -> None:
    registry = _registry(ManualClock())
    record, _ = registry.connect("gw", 3, 0, DIRECTORY)
    record.in_flight[:] = [5, 0, 1]
    record.acked[:] = [2, 3, 1]
    record.send(1, np.array([1, 1, 4], dtype=np.int64), now_s=0.0)
    assert record.bounds().tolist() == [5, 3, 4]
    assert record.enforcing(1), "what its limits let it hold fell (3 -> 1)"
    assert record.bounds().tolist() == [5, 1, 4], "acknowledged: the sent limits are in force"
    assert not record.enforcing(1), "said again: nothing fell"
    record.send(2, np.array([1, 1, 4], dtype=np.int64), now_s=0.0)
    assert not record.enforcing(2), "the same limits again: nothing fell"


def test_taking_figures_says_whether_requests_moved_or_started_to_queue() -> None:
    registry = _registry(ManualClock())
    record, _ = registry.connect("gw", 2, 0, DIRECTORY)
    index = {"A": 0, "B": 1}
    taken = record.take_figures(DemandColumns.of([TenantDemand("A", in_flight=2)]), None, index)
    assert taken.moved and not taken.started
    taken = record.take_figures(
        DemandColumns.of([TenantDemand("A", in_flight=2, admitted_total=9)]), None, index
    )
    assert not taken.moved, "a counter alone moves nothing placement reads"
    taken = record.take_figures(
        DemandColumns.of([TenantDemand("B", queued=1)]), None, index, delta=True
    )
    assert taken.moved and taken.started
    taken = record.take_figures(
        DemandColumns.of([TenantDemand("B", queued=1)]), None, index, delta=True
    )
    assert not taken.moved and not taken.started
    taken = record.take_figures(DemandColumns.of([TenantDemand("B", queued=1)]), None, index)
    assert taken.moved, "a whole report without A: A's requests are gone"


@pytest.mark.parametrize("delta", [False, True], ids=["whole", "delta"])
def test_figures_of_a_tenant_the_pool_does_not_know_are_dropped(delta: bool) -> None:
    registry = _registry(ManualClock())
    record, _ = registry.connect("gw", 2, 0, DIRECTORY)
    figures = DemandColumns.of(
        [
            TenantDemand("B", in_flight=3, queued=1),
            TenantDemand("gone", in_flight=7),
            TenantDemand("A", in_flight=2),
        ]
    )
    taken = record.take_figures(figures, None, {"A": 0, "B": 1}, delta=delta)
    assert record.in_flight.tolist() == [2, 3]
    assert record.queued.tolist() == [0, 1]
    assert record.held.tolist() == [True, True]
    assert taken.moved and taken.started
    assert dict(zip(taken.columns.tolist(), taken.change[0].tolist(), strict=True)) == {0: 2, 1: 3}


def test_a_disconnected_gateway_counts_until_its_lease_runs_out() -> None:
    clock = ManualClock()
    registry = _registry(clock)
    a, _ = registry.connect("a", 1, 0, DIRECTORY)
    registry.connect("b", 1, 0, DIRECTORY)
    assert registry.ids == ("a", "b") and registry.connected == 2
    assert registry.disconnect(a.session) is a
    assert registry.disconnect(a.session) is None, "once"
    assert registry.connected == 1 and len(registry) == 2
    clock.advance(9.9)
    assert registry.expire() == []
    clock.advance(0.1)
    assert registry.expire() == [a]
    assert list(registry.ids) == ["b"]
