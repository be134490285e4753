"""Each tenant's limit is split among gateways exactly, following where its demand is."""

from __future__ import annotations

import random

from controlplane.core.gateway_split import idle_beside, rebalance, split_among_gateways


def test_parts_sum_to_each_limit_on_random_cases() -> None:
    rng = random.Random(3)
    for _ in range(2_000):
        limits = {f"t{i}": rng.randint(0, 100) for i in range(rng.randint(1, 4))}
        demand = {
            f"g{g}": {t: (rng.randint(0, 50), rng.choice([0, rng.randint(0, 50)])) for t in limits}
            for g in range(rng.randint(1, 5))
        }
        parts = split_among_gateways(limits, demand)
        for tenant, limit in limits.items():
            assert sum(parts[g][tenant] for g in parts) == limit
            assert all(parts[g][tenant] >= 0 for g in parts)
        assert sum(sum(p.values()) for p in parts.values()) == sum(limits.values())


def test_each_gateway_gets_its_demand_and_an_even_part_of_the_headroom() -> None:
    demand = {"g1": {"A": (5, 0), "B": (0, 0)}, "g2": {"A": (1, 0), "B": (0, 0)}}
    parts = split_among_gateways({"A": 12, "B": 56}, demand)
    # A: 6 slots of headroom, 3 each; B: idle everywhere, split evenly.
    assert parts == {"g1": {"A": 8, "B": 28}, "g2": {"A": 4, "B": 28}}


def test_a_gateway_with_no_demand_still_gets_headroom() -> None:
    # A burst's first request may reach either gateway: neither may have to wait for a re-split.
    demand = {"g1": {"A": (2, 0)}, "g2": {"A": (0, 0)}, "g3": {"A": (0, 0)}}
    parts = split_among_gateways({"A": 11}, demand)
    assert parts == {"g1": {"A": 5}, "g2": {"A": 3}, "g3": {"A": 3}}


def test_demand_beyond_the_limit_is_split_in_proportion() -> None:
    demand = {"g1": {"A": (30, 10)}, "g2": {"A": (10, 0)}, "g3": {"A": (0, 0)}}
    assert split_among_gateways({"A": 25}, demand) == {
        "g1": {"A": 20},
        "g2": {"A": 5},
        "g3": {"A": 0},
    }


def test_no_gateways_no_parts() -> None:
    assert split_among_gateways({"A": 4}, {}) == {}


def test_idle_beside_a_gateway_that_used_its_part_up_or_has_a_request_waiting() -> None:
    targets = {"g1": {"A": 3, "B": 1}, "g2": {"A": 10, "B": 1}}

    def idle(demand: dict[str, dict[str, tuple[int, int]]]) -> tuple[set[str], set[str]]:
        return (
            idle_beside(targets, demand, waiting_only=False),
            idle_beside(targets, demand, waiting_only=True),
        )

    # g1 has one of A's requests queued beyond its part; g2 does not use all of its part.
    assert idle({"g1": {"A": (3, 1)}, "g2": {"A": (2, 0)}}) == ({"A"}, {"A"})
    # g1 has just used its part up: its next request would wait, nobody waits yet.
    assert idle({"g1": {"A": (3, 0)}, "g2": {"A": (2, 0)}}) == ({"A"}, set())
    # Both use their parts in full: nothing to move.
    assert idle({"g1": {"A": (3, 3)}, "g2": {"A": (10, 5)}}) == (set(), set())
    # Both have room left.
    assert idle({"g1": {"A": (2, 0)}, "g2": {"A": (2, 0)}}) == (set(), set())
    # Only the tenant concerned is named.
    demand = {"g1": {"A": (3, 1), "B": (1, 1)}, "g2": {"A": (2, 0), "B": (1, 0)}}
    assert idle(demand) == ({"A"}, {"A"})


def test_a_fresh_split_leaves_no_request_waiting_beside_an_idle_part() -> None:
    rng = random.Random(5)
    for _ in range(500):
        demand = {
            f"g{g}": {"A": (rng.randint(0, 20), rng.randint(0, 5))}
            for g in range(rng.randint(1, 4))
        }
        wanted = sum(
            sum(figures) for by_tenant in demand.values() for figures in by_tenant.values()
        )
        limit = rng.randint(0, wanted + 30)
        parts = split_among_gateways({"A": limit}, demand)
        assert idle_beside(parts, demand, waiting_only=True) == set(), (limit, demand)
        if limit >= wanted + len(demand):
            assert idle_beside(parts, demand, waiting_only=False) == set(), (limit, demand)


def test_rebalance_moves_one_slot_from_the_most_idle_to_the_most_waiting() -> None:
    parts = {"g1": {"A": 1}, "g2": {"A": 4}, "g3": {"A": 3}}
    demand = {"g1": {"A": (1, 2)}, "g2": {"A": (1, 0)}, "g3": {"A": (2, 0)}}
    assert rebalance(demand, parts, {"A"}) == {"g1": {"A": 3}, "g2": {"A": 2}, "g3": {"A": 3}}
    assert rebalance(demand, parts, set()) == parts, "tenants not named keep their parts"
