"""A point's generated config and how its gateways are dealt to processes."""

from __future__ import annotations

import math

import pytest

from slotshift.apportion import nominal_shares
from slotshift.config import ConfigError
from slotshift.v1 import query_pb2
from slotshift.wire import to_timestamp
from slotshift_tools.scale.point import (
    POLICY,
    POOL,
    DecisionReader,
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


class FakeDecisionLog:
    """GetDecisions over a bounded log; `between` runs after each call (the loop deciding on)."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.ids: list[int] = []
        self.between: list[int] = []
        """How many decisions to add after each call, in order."""
        self.calls: list[int] = []
        self.enforced: dict[int, float] = {}
        """id -> when it was enforced; a decision not named here is enforced as it is made."""

    def decide(self, count: int) -> None:
        start = self.ids[-1] + 1 if self.ids else 1
        self.ids = (self.ids + list(range(start, start + count)))[-self.capacity :]

    async def GetDecisions(
        self, request: query_pb2.GetDecisionsRequest, **call_options: float
    ) -> query_pb2.GetDecisionsResponse:
        self.calls.append(request.limit)
        newest_first = list(reversed(self.ids))[: request.limit]
        reply = query_pb2.GetDecisionsResponse(
            decisions=[
                query_pb2.Decision(
                    id=i,
                    decided_at=to_timestamp(float(i)),
                    outcome=query_pb2.DECISION_OUTCOME_PUBLISHED,
                    trigger="period",
                    version=i,
                    duration_ms=1.0,
                    enforced_at=None
                    if math.isnan(at := self.enforced.get(i, float(i)))
                    else to_timestamp(at),
                )
                for i in newest_first
            ]
        )
        if self.between:
            self.decide(self.between.pop(0))
        return reply


async def test_the_reader_reads_each_decision_once_though_more_come_while_it_reads() -> None:
    log = FakeDecisionLog(capacity=512)
    reader = DecisionReader(log, POOL)  # type: ignore[arg-type]
    log.decide(3)
    await reader.read_new()
    assert sorted(reader.decisions) == [1, 2, 3]
    # Ten more; five more decided between the probe and the read, five during the read (its
    # answer does not reach back to decision 4: it asks again).
    log.decide(10)
    log.between = [5, 5]
    await reader.read_new()
    assert sorted(reader.decisions) == list(range(1, 24))
    assert reader.lost == 0
    log.decide(5)
    await reader.read_new()
    assert sorted(reader.decisions) == list(range(1, 29))
    assert reader.lost == 0


async def test_decisions_that_left_the_log_unread_are_counted() -> None:
    log = FakeDecisionLog(capacity=8)
    reader = DecisionReader(log, POOL)  # type: ignore[arg-type]
    log.decide(2)
    await reader.read_new()
    log.decide(20)  # 3..22; the log keeps 15..22
    await reader.read_new()
    assert reader.lost == 12
    assert sorted(reader.decisions) == [1, 2, *range(15, 23)]


async def test_nothing_new_costs_one_small_read() -> None:
    log = FakeDecisionLog(capacity=8)
    reader = DecisionReader(log, POOL)  # type: ignore[arg-type]
    await reader.read_new()
    log.decide(1)
    await reader.read_new()
    log.calls.clear()
    await reader.read_new()
    assert log.calls == [1]


async def test_a_decision_read_before_it_was_enforced_is_read_again() -> None:
    log = FakeDecisionLog(capacity=64)
    reader = DecisionReader(log, POOL)  # type: ignore[arg-type]
    log.enforced[2] = math.nan
    log.decide(3)
    await reader.read_new()
    assert reader.decisions[2].enforced_at_wall_s is None
    log.enforced[2] = 2.5
    log.decide(1)
    await reader.read_new()
    assert reader.decisions[2].enforced_at_wall_s == 2.5
    log.calls.clear()
    await reader.read_new()
    assert log.calls == [1], "nothing new and nothing pending: one small read"
