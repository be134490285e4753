"""The grid's syntax and each point's budget."""

from __future__ import annotations

import pytest

from slotshift_tools.scale.grid import DEFAULT_GRID, GridError, GridPoint, budget_for, parse_grid


def test_the_default_grid_is_the_issues_points() -> None:
    assert [p.label for p in parse_grid(DEFAULT_GRID)] == [
        "10x2",
        "30x4",
        "100x10",
        "1000x10",
        "1000x100",
        "10000x10",
    ]


def test_a_point_may_name_its_own_report_interval() -> None:
    assert parse_grid(" 10x2, 1000x10@1 ,100x10@0.5") == [
        GridPoint(10, 2),
        GridPoint(1000, 10, 1.0),
        GridPoint(100, 10, 0.5),
    ]


@pytest.mark.parametrize(
    "text",
    [
        pytest.param("", id="empty"),
        pytest.param("10", id="no-gateways"),
        pytest.param("10x0", id="zero-gateways"),
        pytest.param("0x2", id="zero-tenants"),
        pytest.param("10x2@0", id="zero-interval"),
        pytest.param("10x2@fast", id="interval-not-a-number"),
        pytest.param("10*2", id="wrong-separator"),
    ],
)
def test_a_malformed_grid_is_refused(text: str) -> None:
    with pytest.raises(GridError):
        parse_grid(text)


@pytest.mark.parametrize(
    ("tenants", "budget"),
    [
        pytest.param(10, 96, id="small-pool-gets-the-demo-budget"),
        pytest.param(48, 96, id="at-the-minimum"),
        pytest.param(1000, 2000, id="two-a-tenant"),
        pytest.param(10_000, 20_000, id="fleet"),
    ],
)
def test_the_budget_is_two_slots_a_tenant_and_at_least_96(tenants: int, budget: int) -> None:
    assert budget_for(tenants, per_tenant=2, minimum=96) == budget


def test_the_budget_always_fits_every_default_floor() -> None:
    assert budget_for(500, per_tenant=0, minimum=1) == 500
