"""A point's generated config and how its gateways are dealt to processes."""

from __future__ import annotations

import pytest

from slotshift.apportion import nominal_shares
from slotshift.config import ConfigError
from slotshift_tools.scale.point import (
    POLICY,
    POOL,
    PointSettings,
    assign_gateways,
    controlplane_config_data,
    effective_config,
    tenant_names,
)


def settings(
    tenants: int = 30, gateways: int = 4, overrides: tuple[str, ...] = ()
) -> PointSettings:
    return PointSettings(
        tenants=tenants,
        gateways=gateways,
        budget_slots=96,
        report_interval_s=0.25,
        dynamics="fluctuating",
        duration_s=20.0,
        warmup_s=5.0,
        seed=1,
        generator_processes=2,
        overrides=overrides,
    )


def test_tenant_names_sort_in_the_pools_order() -> None:
    names = tenant_names(1000)
    assert names[:2] == ["t000", "t001"]
    assert names == sorted(names)
    assert len(set(names)) == 1000


def test_the_generated_config_is_one_slo_pool_with_shipped_defaults() -> None:
    config = effective_config(settings(), controlplane_config_data(settings(), 5001, 5002))
    assert [pool.name for pool in config.pools] == [POOL]
    pool = config.pool(POOL)
    assert pool.policy == POLICY
    assert pool.budget_slots == 96
    assert len(pool.tenants) == 30
    assert pool.decision_period_s == 2.0, "the shipped default"
    assert sum(nominal_shares(pool).values()) == 96
    assert config.controlplane.grpc_port == 5001
    assert config.controlplane.metrics_port == 5002


def test_command_line_overrides_reach_the_config() -> None:
    point = settings(overrides=("pools.0.decision_period_s=1",))
    config = effective_config(point, controlplane_config_data(point, 5001, 5002))
    assert config.pool(POOL).decision_period_s == 1.0


def test_a_bad_override_is_a_config_error() -> None:
    point = settings(overrides=("pools.0.budget_slots=0",))
    with pytest.raises(ConfigError):
        effective_config(point, controlplane_config_data(point, 5001, 5002))


@pytest.mark.parametrize(
    ("gateways", "processes", "expected"),
    [
        pytest.param(2, 1, [(0, 1)], id="one-process"),
        pytest.param(5, 2, [(0, 2, 4), (1, 3)], id="round-robin"),
        pytest.param(2, 8, [(0,), (1,)], id="no-empty-process"),
    ],
)
def test_gateways_are_dealt_round_robin(
    gateways: int, processes: int, expected: list[tuple[int, ...]]
) -> None:
    assert assign_gateways(gateways, processes) == expected
