"""The pure core of a lost replica (controlplane/core/replica_loss.py): the signal, the
hysteresis on a fake clock, and the division over the live members, checked on hand-made cases
and on seeded random groups against its contract."""

from __future__ import annotations

import random

import pytest
from pydantic import SecretStr

from controlplane.core.replica_loss import (
    ReplicaLossTracker,
    TenantBounds,
    describe,
    engine_down,
    live_bounds,
    live_division,
    with_bounds,
)
from slotshift.config import PoolConfig, TenantConfig, divide_group, parse_config


def _tenant(name: str, floor: int = 1, ceiling: int | None = None) -> TenantConfig:
    return TenantConfig(
        name=name, api_keys=[SecretStr(f"key-{name}")], floor_slots=floor, ceiling_slots=ceiling
    )


def _floors(division: dict[str, dict[str, TenantBounds]]) -> dict[str, dict[str, int]]:
    return {m: {t: b.floor_slots for t, b in ts.items()} for m, ts in division.items()}


def _ceilings(division: dict[str, dict[str, TenantBounds]]) -> dict[str, dict[str, int | None]]:
    return {m: {t: b.ceiling_slots for t, b in ts.items()} for m, ts in division.items()}


# The signal ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("reported", "scraped", "age_s", "down"),
    [
        pytest.param(False, True, None, False, id="never-reported"),
        pytest.param(True, True, 0.5, False, id="fresh-and-scraped"),
        pytest.param(True, False, 0.5, True, id="scrape-failed"),
        pytest.param(True, True, 3.5, True, id="silent"),
        pytest.param(True, True, 3.0, False, id="silent-limit-not-passed"),
    ],
)
def test_the_engine_is_down_on_a_failed_scrape_or_silence_never_without_a_report(
    reported: bool, scraped: bool, age_s: float | None, down: bool
) -> None:
    assert engine_down(reported=reported, scraped=scraped, age_s=age_s, silent_after_s=3.0) is down


# The hysteresis ------------------------------------------------------------------------------


def _run(tracker: ReplicaLossTracker, signal: list[tuple[float, bool]]) -> list[bool]:
    return [tracker.observe("r1", down, at_s) for at_s, down in signal]


@pytest.mark.parametrize(
    ("signal", "lost"),
    [
        pytest.param(
            [(0.0, True), (1.0, True), (1.9, True), (2.0, True), (2.5, True)],
            [False, False, False, True, True],
            id="lost-after-held-2s",
        ),
        pytest.param(
            [(0.0, True), (1.5, False), (2.0, True), (3.5, True), (4.0, True)],
            [False, False, False, False, True],
            id="one-up-observation-starts-the-wait-again",
        ),
        pytest.param(
            [(0.0, True), (2.0, True), (3.0, False), (7.9, False), (8.0, False)],
            [False, True, True, True, False],
            id="back-after-up-held-5s",
        ),
        pytest.param(
            [
                (0.0, True),
                (2.0, True),
                (3.0, False),
                (6.0, True),
                (7.0, False),
                (11.0, False),
                (12.0, False),
            ],
            [False, True, True, True, True, True, False],
            id="a-flap-while-lost-keeps-it-lost",
        ),
        pytest.param(
            [(t * 0.5, t % 2 == 0) for t in range(40)],
            [False] * 40,
            id="flapping-every-half-second-is-never-lost",
        ),
    ],
)
def test_a_replica_is_lost_once_down_held_and_back_once_up_held(
    signal: list[tuple[float, bool]], lost: list[bool]
) -> None:
    tracker = ReplicaLossTracker(lost_after_s=2.0, back_after_s=5.0)
    assert _run(tracker, signal) == lost
    assert tracker.lost == (frozenset({"r1"}) if lost[-1] else frozenset())


def test_the_tracker_says_how_long_the_signal_has_disagreed() -> None:
    tracker = ReplicaLossTracker(lost_after_s=2.0, back_after_s=5.0)
    tracker.observe("r1", True, 10.0)
    assert tracker.held_s("r1", 11.5) == 1.5
    tracker.observe("r1", False, 11.5)
    assert tracker.held_s("r1", 12.0) == 0.0
    assert tracker.held_s("unknown", 12.0) == 0.0


def test_a_negative_wait_is_refused() -> None:
    with pytest.raises(ValueError, match="at least 0"):
        ReplicaLossTracker(lost_after_s=-1.0, back_after_s=5.0)


# The division --------------------------------------------------------------------------------


def test_a_floor_of_8_on_two_replicas_is_4_and_4_and_8_on_the_survivor() -> None:
    tenants = [_tenant("A", floor=8), _tenant("B", floor=2)]
    budgets = {"r1": 32, "r2": 32}
    assert _floors(live_division(tenants, budgets, {"r1", "r2"})) == {
        "r1": {"A": 4, "B": 1},
        "r2": {"A": 4, "B": 1},
    }
    assert _floors(live_division(tenants, budgets, {"r2"})) == {
        "r1": {"A": 4, "B": 1},  # the lost replica keeps the whole group's division
        "r2": {"A": 8, "B": 2},
    }


def test_the_operations_docs_example_moves_floors_and_ceilings_to_the_survivor() -> None:
    tenants = [_tenant("team-a", floor=8), _tenant("team-b", ceiling=40)]
    budgets = {"llama-1": 64, "llama-2": 32}
    whole = live_division(tenants, budgets, {"llama-1", "llama-2"})
    assert _floors(whole) == {
        "llama-1": {"team-a": 5, "team-b": 1},
        "llama-2": {"team-a": 3, "team-b": 1},
    }
    assert _ceilings(whole)["llama-2"] == {"team-a": None, "team-b": 13}
    lost_1 = live_division(tenants, budgets, {"llama-2"})
    assert _floors(lost_1)["llama-2"] == {"team-a": 8, "team-b": 1}
    assert _ceilings(lost_1)["llama-2"] == {"team-a": None, "team-b": 40}
    assert lost_1["llama-1"] == whole["llama-1"]


@pytest.mark.parametrize(
    "live",
    [
        pytest.param({"r1", "r2", "r3"}, id="all-live"),
        pytest.param(set(), id="none-live"),
    ],
)
def test_with_every_member_live_or_none_each_holds_the_whole_groups_division(
    live: set[str],
) -> None:
    tenants = [_tenant("A", floor=6, ceiling=30), _tenant("B", floor=3)]
    budgets = {"r1": 16, "r2": 8, "r3": 8}
    whole = {
        name: {t.name: TenantBounds(t.floor_slots, t.ceiling_slots) for t in ts}
        for name, ts in divide_group(tenants, budgets).items()
    }
    assert live_division(tenants, budgets, live) == whole


def test_floors_that_would_pass_the_survivors_budget_fill_it_in_proportion_to_their_gain() -> None:
    # Floors 12 + 12 over 16 + 8: 8 + 8 on r1, 4 + 4 on r2; on r2 alone 12 + 12 > 8.
    tenants = [_tenant("A", floor=12), _tenant("B", floor=12)]
    budgets = {"r1": 16, "r2": 8}
    division = live_division(tenants, budgets, {"r2"})
    assert _floors(division)["r2"] == {"A": 4, "B": 4}  # no room: the whole division
    # Floors 6 + 2 over 8 + 8 (3 + 1 each); on r2 alone: 6 + 2 = 8 fits exactly.
    tenants = [_tenant("A", floor=6), _tenant("B", floor=2)]
    assert _floors(live_division(tenants, {"r1": 8, "r2": 8}, {"r2"}))["r2"] == {"A": 6, "B": 2}
    # Floors 9 + 3 + 1 over 10 + 5 + 5: r3 alone wants 9 + 3 + 1 > 5; room 5 - (2 + 1 + 1) = 1
    # goes to A, the largest gain (2 -> 9).
    tenants = [_tenant("A", floor=9), _tenant("B", floor=3), _tenant("C", floor=1)]
    budgets = {"r1": 10, "r2": 5, "r3": 5}
    whole = _floors(live_division(tenants, budgets, set(budgets)))["r3"]
    assert whole == {"A": 2, "B": 1, "C": 1}
    assert _floors(live_division(tenants, budgets, {"r3"}))["r3"] == {"A": 3, "B": 1, "C": 1}


def test_seeded_random_groups_keep_the_contract() -> None:
    rng = random.Random(16)
    for case in range(2000):
        members = [f"r{i}" for i in range(rng.randint(2, 4))]
        budgets = {m: rng.randint(1, 40) for m in members}
        tenants = []
        for index in range(rng.randint(1, 5)):
            floor = rng.choice([0, 1, rng.randint(0, 30)])
            ceiling = rng.choice([None, rng.randint(floor, 80)])
            tenants.append(_tenant(f"t{index}", floor=floor, ceiling=ceiling))
        whole = divide_group(tenants, budgets)
        try:
            pools = {
                m: PoolConfig(name=m, budget_slots=budgets[m], tenants=whole[m]) for m in members
            }
        except ValueError:
            continue  # the file would be refused: nothing to keep
        live = {m for m in members if rng.random() < 0.6}
        division = live_division(tenants, budgets, live)
        every = live_division(tenants, budgets, set(members))
        for member in members:
            pool = with_bounds(pools[member], division[member])  # a valid pool, or it raises
            bounds = division[member]
            assert sum(b.floor_slots for b in bounds.values()) <= budgets[member], case
            for name, bound in bounds.items():
                base = every[member][name]
                assert bound.floor_slots >= base.floor_slots, case
                if base.ceiling_slots is None:
                    assert bound.ceiling_slots is None, case
                else:
                    assert bound.ceiling_slots is not None, case
                    assert bound.ceiling_slots >= max(base.ceiling_slots, bound.floor_slots), case
            if member not in live or not live or live == set(members):
                assert bounds == every[member], case
            assert pool.budget_slots == budgets[member]
        if live and live != set(members):
            # The lost members' floors reach the survivors, as far as their budgets let them.
            for t in tenants:
                held = sum(division[m][t.name].floor_slots for m in live)
                room = all(
                    sum(b.floor_slots for b in division[m].values()) < budgets[m] for m in live
                )
                if room:
                    assert held >= t.floor_slots, case


def test_with_bounds_changes_only_the_bounds_and_returns_the_pool_when_it_holds_them() -> None:
    pool = PoolConfig(
        name="r2", budget_slots=16, policy="slo", tenants=[_tenant("A", 2), _tenant("B", 1, 8)]
    )
    same = {"A": TenantBounds(2, None), "B": TenantBounds(1, 8)}
    assert with_bounds(pool, same) is pool
    grown = with_bounds(pool, {"A": TenantBounds(4, None), "B": TenantBounds(2, 16)})
    assert [(t.floor_slots, t.ceiling_slots) for t in grown.tenants] == [(4, None), (2, 16)]
    assert grown.policy == "slo"
    assert [t.api_keys for t in grown.tenants] == [t.api_keys for t in pool.tenants]
    assert describe(pool, grown) == ["A floor 2 -> 4", "B floor 1 -> 2, ceiling 8 -> 16"]
    with pytest.raises(ValueError, match="floor_slots"):
        with_bounds(pool, {"A": TenantBounds(15, None), "B": TenantBounds(2, None)})


def test_live_bounds_divides_each_group_of_a_config_and_leaves_other_pools_out() -> None:
    config = parse_config(
        {
            "replica_groups": [
                {"name": "g", "tenants": [{"name": "A", "api_keys": ["k-a"], "floor_slots": 8}]}
            ],
            "pools": [
                {"name": "g1", "replica_group": "g", "models": ["m"], "budget_slots": 16},
                {"name": "g2", "replica_group": "g", "models": ["m"], "budget_slots": 16},
                {
                    "name": "solo",
                    "budget_slots": 4,
                    "tenants": [{"name": "B", "api_keys": ["k-b"]}],
                },
            ],
            "tenant_keys": {"unkeyed_key_digests": True},
        }
    )
    assert _floors(live_bounds(config, frozenset())) == {"g1": {"A": 4}, "g2": {"A": 4}}
    assert _floors(live_bounds(config, frozenset({"g1"}))) == {"g1": {"A": 4}, "g2": {"A": 8}}
    assert _floors(live_bounds(config, frozenset({"solo"}))) == {"g1": {"A": 4}, "g2": {"A": 4}}
