"""Each tenant's limit is split among gateways exactly, following where its demand is."""

from __future__ import annotations

import random

from controlplane.core.gateway_split import split_among_gateways, split_is_stale


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


def test_split_follows_demand_and_is_even_when_idle() -> None:
    demand = {"g1": {"A": (30, 10), "B": (0, 0)}, "g2": {"A": (0, 0), "B": (0, 0)}}
    parts = split_among_gateways({"A": 40, "B": 56}, demand)
    assert parts == {"g1": {"A": 40, "B": 28}, "g2": {"A": 0, "B": 28}}


def test_no_gateways_no_parts() -> None:
    assert split_among_gateways({"A": 4}, {}) == {}


def test_stale_when_one_gateway_queues_while_another_holds_unused_part() -> None:
    targets = {"g1": {"A": 0}, "g2": {"A": 10}}
    assert split_is_stale(targets, {"g1": {"A": (0, 3)}, "g2": {"A": (2, 0)}})
    assert not split_is_stale(targets, {"g1": {"A": (0, 3)}, "g2": {"A": (10, 5)}})
    assert not split_is_stale(targets, {"g1": {"A": (0, 0)}, "g2": {"A": (2, 0)}})
