"""The apportion contract, on 10,000 seeded random cases and a table of edge cases."""

from __future__ import annotations

import math
import random

import pytest

from slotshift.apportion import ApportionError, Claim, apportion, nominal_shares
from slotshift.config import PoolConfig, TenantConfig


def _random_case(rng: random.Random) -> tuple[int, list[Claim]]:
    claims = []
    for _ in range(rng.randint(1, 12)):
        lower = rng.choice([0, 0, 1, rng.randint(0, 20)])
        upper = lower + rng.choice([0, rng.randint(0, 10), rng.randint(0, 200)])
        target = rng.choice(
            [0.0, rng.uniform(0, 1), float(rng.randint(0, 500)), rng.expovariate(0.1)]
        )
        claims.append(Claim(lower, upper, target))
    total = rng.randint(sum(c.lower for c in claims), sum(c.upper for c in claims))
    return total, claims


def test_contract_holds_on_10000_seeded_random_cases() -> None:
    rng = random.Random(20261130)
    for case in range(10_000):
        total, claims = _random_case(rng)
        result = apportion(total, claims)
        assert sum(result) == total, (case, total, claims, result)
        for claim, share in zip(claims, result, strict=True):
            assert claim.lower <= share <= claim.upper, (case, claims, result)
        assert apportion(total, claims) == result, "not deterministic"
        _assert_proportional(total, claims, result)


def _assert_proportional(total: int, claims: list[Claim], result: list[int]) -> None:
    """Between its bounds, every positive claim gets within one slot of p * target for one p."""
    positive = [
        (c, r)
        for c, r in zip(claims, result, strict=True)
        if c.target > 0 and c.lower < r < c.upper
    ]
    if len(positive) < 2:
        return
    ratios = [r / c.target for c, r in positive]
    # Shares strictly between bounds were p*t rounded by less than one slot.
    p_low = max((r - 1) / c.target for c, r in positive)
    p_high = min((r + 1) / c.target for c, r in positive)
    assert p_low <= p_high + 1e-9, (total, claims, result, ratios)


@pytest.mark.parametrize(
    ("total", "claims", "expected"),
    [
        pytest.param(
            96, [Claim(4, 96, 0), Claim(4, 96, 130)], [4, 92], id="idle-tenant-keeps-floor"
        ),
        pytest.param(96, [Claim(4, 96, 0), Claim(4, 96, 0)], [48, 48], id="all-idle-split-evenly"),
        pytest.param(96, [Claim(0, 96, 1)], [96], id="one-claim-takes-all"),
        pytest.param(10, [Claim(5, 5, 3), Claim(5, 5, 0)], [5, 5], id="floors-sum-to-total"),
        pytest.param(0, [Claim(0, 5, 1), Claim(0, 5, 1)], [0, 0], id="nothing-to-split"),
        pytest.param(
            7, [Claim(0, 7, 1), Claim(0, 7, 1), Claim(0, 7, 1)], [3, 2, 2], id="ties-by-position"
        ),
        pytest.param(
            10,
            [Claim(0, 3, 1), Claim(0, 10, 0), Claim(0, 10, 0)],
            [3, 4, 3],
            id="saturated-positives-spill-to-zero-targets",
        ),
        pytest.param(
            96, [Claim(4, 20, 100), Claim(4, 96, 1)], [20, 76], id="ceiling-caps-large-target"
        ),
        pytest.param(
            96, [Claim(40, 96, 1), Claim(4, 96, 100)], [40, 56], id="floor-lifts-small-target"
        ),
        pytest.param(3, [], None, id="no-claims-nonzero-total"),
    ],
)
def test_edge_cases(total: int, claims: list[Claim], expected: list[int] | None) -> None:
    if expected is None:
        with pytest.raises(ApportionError):
            apportion(total, claims)
    else:
        assert apportion(total, claims) == expected


@pytest.mark.parametrize(
    ("total", "claims", "message"),
    [
        pytest.param(10, [Claim(6, 10, 1), Claim(6, 10, 1)], "outside", id="floors-above-total"),
        pytest.param(30, [Claim(0, 10, 1), Claim(0, 10, 1)], "outside", id="ceilings-below-total"),
        pytest.param(5, [Claim(3, 2, 1)], "lower <= upper", id="lower-above-upper"),
        pytest.param(5, [Claim(-1, 5, 1)], "lower <= upper", id="negative-bound"),
        pytest.param(5, [Claim(0, 5, -1.0)], "target", id="negative-target"),
        pytest.param(5, [Claim(0, 5, math.nan)], "target", id="nan-target"),
        pytest.param(-1, [Claim(0, 5, 1)], "negative", id="negative-total"),
    ],
)
def test_invalid_inputs_are_rejected_with_a_clear_error(
    total: int, claims: list[Claim], message: str
) -> None:
    with pytest.raises(ApportionError, match=message):
        apportion(total, claims)


def test_nominal_shares_follow_weights_within_bounds() -> None:
    pool = PoolConfig(
        name="p",
        budget_slots=96,
        tenants=[
            TenantConfig(name="A", weight=1, floor_slots=4),
            TenantConfig(name="B", weight=2, floor_slots=4),
            TenantConfig(name="C", weight=1, floor_slots=4, ceiling_slots=10),
        ],
    )
    assert nominal_shares(pool) == {"A": 29, "B": 57, "C": 10}
