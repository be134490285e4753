"""The replica watch (controlplane/replica_watch.py) over real pool states and runtimes on a
manual clock: a member whose scrape fails (or whose telemetry goes silent) for lost_after_s is
lost, its group's floors move to the survivor through a decision naming it, and come back once
it has scraped again for back_after_s; a member never heard from is never lost. And a reload's
plan (controlplane/core/reload.py) keeps the live division."""

from __future__ import annotations

import contextlib

import pytest

from controlplane.core.reload import plan_pool
from controlplane.core.replica_loss import live_bounds, with_bounds
from controlplane.pool_state import PoolState, TelemetryRecord
from controlplane.replica_watch import ReplicaWatch
from controlplane.runtime import PoolRuntime
from slotshift.clock import ManualClock
from slotshift.config import ReplicaLossConfig, SlotshiftConfig, parse_config
from slotshift.keys import KeyDigester

SETTINGS = ReplicaLossConfig(lost_after_s=2.0, back_after_s=5.0, silent_after_s=3.0)


def _config(weight_b: float = 1.0) -> SlotshiftConfig:
    return parse_config(
        {
            "replica_groups": [
                {
                    "name": "g",
                    "tenants": [
                        {"name": "A", "api_keys": ["key-a"], "floor_slots": 8},
                        {"name": "B", "api_keys": ["key-b"], "floor_slots": 2, "weight": weight_b},
                    ],
                }
            ],
            "pools": [
                {
                    "name": name,
                    "replica_group": "g",
                    "models": ["m"],
                    "budget_slots": 16,
                    "policy": "static",
                }
                for name in ("g1", "g2")
            ],
            "tenant_keys": {"unkeyed_key_digests": True},
        }
    )


class Fleet:
    def __init__(self) -> None:
        self.clock = ManualClock()
        self.config = _config()
        self.runtimes = {
            pool.name: PoolRuntime(
                PoolState(
                    pool,
                    clock=self.clock,
                    gateway_lease_ttl_s=6.0,
                    telemetry_stale_after_s=5.0,
                    decision_log_size=16,
                ),
                clock=self.clock,
                reconcile_min_interval_s=0.0,
            )
            for pool in self.config.pools
        }
        self.watch = ReplicaWatch(
            lambda: self.config,
            self.runtimes,
            settings=SETTINGS,
            clock=self.clock,
            lock=contextlib.nullcontext,
            keeper=lambda: None,
        )

    def report(self, pool: str, *, scraped: bool) -> None:
        self.runtimes[pool].state.record_telemetry(
            TelemetryRecord(
                received_at_s=self.clock.monotonic(),
                agent_id="agent",
                kv_cache_usage_perc=0.0,
                num_requests_running=0,
                num_requests_waiting=0,
                gpu_available=False,
                gpu_emulated=False,
                gpu_utilization_pct=0.0,
                engine_scraped=scraped,
            )
        )

    def floors(self, pool: str) -> dict[str, int]:
        return {t.name: t.floor_slots for t in self.runtimes[pool].state.pool.tenants}

    def last_trigger(self, pool: str) -> str:
        return self.runtimes[pool].state.decisions.newest(1)[0].trigger

    async def step(
        self, seconds: float, *, g1_scraped: bool | None, g2_scraped: bool = True
    ) -> None:
        """Advance the clock, the agents report (g1's not when None), and the watch checks."""
        self.clock.advance(seconds)
        if g1_scraped is not None:
            self.report("g1", scraped=g1_scraped)
        self.report("g2", scraped=g2_scraped)
        await self.watch.check()


@pytest.fixture
def fleet() -> Fleet:
    return Fleet()


async def test_a_replica_whose_scrape_fails_gives_its_floors_to_the_survivor_and_gets_them_back(
    fleet: Fleet,
) -> None:
    await fleet.step(0.5, g1_scraped=True)
    assert fleet.floors("g1") == fleet.floors("g2") == {"A": 4, "B": 1}
    await fleet.step(0.5, g1_scraped=False)  # down from here
    await fleet.step(1.9, g1_scraped=False)
    assert fleet.watch.lost == frozenset()
    assert fleet.floors("g2") == {"A": 4, "B": 1}
    await fleet.step(0.1, g1_scraped=False)
    assert fleet.watch.lost == {"g1"}
    assert fleet.floors("g2") == {"A": 8, "B": 2}
    assert fleet.floors("g1") == {"A": 4, "B": 1}, "the lost member keeps its own division"
    state = fleet.runtimes["g2"].state
    assert state.config_version == 2
    trigger = fleet.last_trigger("g2")
    assert trigger.startswith("config v2: replica g1 lost: group g divided over g2:")
    assert "A floor 4 -> 8" in trigger and "B floor 1 -> 2" in trigger
    assert state.allocation.tenant_limits["A"] >= 8
    assert sum(state.allocation.tenant_limits.values()) == 16, "the budget stays the survivor's"
    assert fleet.runtimes["g1"].state.config_version == 1, "the lost member is not touched"

    # Back: the scrape works again, but one more failure restarts the wait.
    await fleet.step(1.0, g1_scraped=True)
    await fleet.step(4.0, g1_scraped=False)
    await fleet.step(1.0, g1_scraped=True)
    await fleet.step(4.9, g1_scraped=True)
    assert fleet.watch.lost == {"g1"}
    await fleet.step(0.1, g1_scraped=True)
    assert fleet.watch.lost == frozenset()
    assert fleet.floors("g2") == {"A": 4, "B": 1}
    assert fleet.runtimes["g2"].state.config_version == 3
    assert fleet.last_trigger("g2").startswith(
        "config v3: replica g1 back: group g divided over g1, g2:"
    )


async def test_a_replica_whose_telemetry_goes_silent_is_lost(fleet: Fleet) -> None:
    await fleet.step(0.5, g1_scraped=True)
    await fleet.step(3.0, g1_scraped=None)  # 3.0 s old: not silent yet
    await fleet.step(0.1, g1_scraped=None)  # silent from here
    await fleet.step(1.9, g1_scraped=None)
    assert fleet.watch.lost == frozenset()
    await fleet.step(0.1, g1_scraped=None)
    assert fleet.watch.lost == {"g1"}
    assert fleet.floors("g2") == {"A": 8, "B": 2}


async def test_a_replica_never_heard_from_is_never_lost(fleet: Fleet) -> None:
    for _ in range(20):
        await fleet.step(1.0, g1_scraped=None)
    assert fleet.watch.lost == frozenset()
    assert fleet.runtimes["g2"].state.config_version == 1


async def test_both_replicas_lost_keep_the_files_division(fleet: Fleet) -> None:
    await fleet.step(0.5, g1_scraped=True)
    for _ in range(5):
        await fleet.step(1.0, g1_scraped=False, g2_scraped=False)
    assert fleet.watch.lost == {"g1", "g2"}
    assert fleet.floors("g1") == fleet.floors("g2") == {"A": 4, "B": 1}
    assert fleet.runtimes["g2"].state.config_version == 1


def test_a_reload_while_a_replica_is_lost_keeps_the_live_division() -> None:
    before, after = _config(), _config(weight_b=2.0)
    lost = frozenset({"g1"})
    running = live_bounds(before, lost)
    digester = KeyDigester.unkeyed()
    pool = before.pool("g2")
    runs = with_bounds(pool, running["g2"])
    plan = plan_pool(
        running=runs,
        running_digests={},
        file_before=pool,
        file_after=after.pool("g2"),
        stored=[],
        digester=digester,
        bounds=live_bounds(after, lost)["g2"],
    )
    assert plan.action == "config"
    assert {t.name: (t.floor_slots, t.weight) for t in plan.pool.tenants} == {
        "A": (8, 1.0),
        "B": (2, 2.0),
    }
    # Without the live bounds the reload would take the file's division back.
    plain = plan_pool(
        running=runs,
        running_digests={},
        file_before=pool,
        file_after=after.pool("g2"),
        stored=[],
        digester=digester,
    )
    assert {t.name: t.floor_slots for t in plain.pool.tenants} == {"A": 4, "B": 1}
