"""The ground's shapes to and from the wire: wall-clock seconds and Timestamp, a tenant's
demand and its latency summaries."""

from __future__ import annotations

import dataclasses

import pytest

from slotshift.demand import LatencySummary, TenantDemand
from slotshift.demand_columns import (
    COUNTS,
    IN_FLIGHT,
    LATENCIES,
    QUEUED,
    TTFT_P50,
    DemandColumns,
)
from slotshift.v1 import common_pb2, gateway_pb2
from slotshift.wire import (
    demand_columns_from_proto,
    demand_columns_to_proto,
    demand_messages_of,
    demand_to_proto,
    from_timestamp,
    to_timestamp,
)


@pytest.mark.parametrize(
    ("wall_s", "seconds", "nanos"),
    [
        pytest.param(1_700_000_000.25, 1_700_000_000, 250_000_000, id="a quarter second"),
        pytest.param(1_700_000_000.0, 1_700_000_000, 0, id="whole seconds"),
        pytest.param(-1.5, -2, 500_000_000, id="before the epoch: nanos stay positive"),
        pytest.param(1.9999999999, 2, 0, id="nanos rounding up to a whole second carry over"),
    ],
)
def test_to_timestamp(wall_s: float, seconds: int, nanos: int) -> None:
    stamp = to_timestamp(wall_s)
    assert (stamp.seconds, stamp.nanos) == (seconds, nanos)


def test_from_timestamp_inverts_to_timestamp_to_the_microsecond() -> None:
    wall_s = 1_700_000_123.456789
    assert from_timestamp(to_timestamp(wall_s)) == pytest.approx(wall_s, abs=1e-6)


def test_a_tenant_demand_has_the_wire_messages_fields_by_name() -> None:
    """One concept, one name: the ground's shapes and the wire's messages have the same fields."""
    for shape, message in (
        (TenantDemand, common_pb2.TenantDemand),
        (LatencySummary, common_pb2.LatencySummary),
    ):
        assert {f.name for f in dataclasses.fields(shape)} == set(message.DESCRIPTOR.fields_by_name)


DEMANDS = [
    TenantDemand(
        "A",
        in_flight=3,
        queued=2,
        admitted_total=40,
        completed_total=37,
        rejected_total=1,
        limit_slots=5,
        ttft=LatencySummary(count=9, p50_ms=120.0, p90_ms=300.0, p99_ms=410.5),
        e2e=LatencySummary(count=8, p50_ms=900.0, p90_ms=1500.0, p99_ms=2100.0),
        queue_wait=LatencySummary(count=40, p50_ms=0.0, p90_ms=12.0, p99_ms=80.0),
        paused=1,
        output_tokens_total=1_000,
        waste_tokens_total=25,
        pauses_total=4,
    ),
    TenantDemand("B", queued=7),
]


def test_the_columns_message_has_every_field_of_a_tenants_demand() -> None:
    """One concept, one name: each TenantDemand field is a column, a latency window four."""
    expected = set()
    for field in dataclasses.fields(TenantDemand):
        if field.type in ("LatencySummary", LatencySummary):
            expected |= {f"{field.name}_count"} | {
                f"{field.name}_{p}_ms" for p in ("p50", "p90", "p99")
            }
        else:
            expected.add(field.name)
    assert expected == set(common_pb2.TenantDemandColumns.DESCRIPTOR.fields_by_name)


@pytest.mark.parametrize("form", ["columns", "messages"])
def test_tenants_demand_crosses_the_wire_into_the_control_planes_columns(form: str) -> None:
    """What a gateway sends, as columns or (a gateway from before them) as one message a tenant,
    is what the control plane holds, for every field it reads (the queue-wait window and the
    pause counters stay at the gateway)."""
    if form == "columns":
        message = gateway_pb2.DemandReport(columns=demand_columns_to_proto(DEMANDS))
    else:
        message = gateway_pb2.DemandReport(tenants=[demand_to_proto(d) for d in DEMANDS])
    read = demand_columns_from_proto(message)
    expected = DemandColumns.of(DEMANDS)
    assert read.tenants == ("A", "B")
    assert read.counts.tolist() == expected.counts.tolist()
    assert read.latencies.tolist() == expected.latencies.tolist()
    assert read.counts[:, 0].tolist() == [3, 2, 40, 37, 1, 5, 1_000, 25, 9, 8]
    assert read.latencies[:, 0].tolist() == [120.0, 300.0, 410.5, 900.0, 1500.0, 2100.0]
    assert demand_columns_from_proto(gateway_pb2.DemandReport()).counts.shape == (COUNTS, 0)


def test_negative_counts_from_a_peer_read_as_zero() -> None:
    columns = common_pb2.TenantDemandColumns(
        tenant=["A"],
        in_flight=[-1],
        queued=[-2],
        admitted_total=[-3],
        limit_slots=[-4],
        waste_tokens_total=[-6],
        ttft_count=[-1],
        ttft_p50_ms=[5.0],
        ttft_p90_ms=[6.0],
        ttft_p99_ms=[7.0],
    )
    read = demand_columns_from_proto(gateway_pb2.DemandReport(columns=columns))
    assert read.counts.tolist() == [[0]] * COUNTS
    assert read.latencies.tolist() == [[0.0]] * LATENCIES, "a window without samples"


def test_a_peers_short_column_reads_as_zero_and_a_long_one_is_cut() -> None:
    columns = common_pb2.TenantDemandColumns(
        tenant=["A", "B"], in_flight=[4], queued=[1, 2, 3], ttft_count=[1, 1], ttft_p50_ms=[9.0]
    )
    read = demand_columns_from_proto(gateway_pb2.DemandReport(columns=columns))
    assert read.counts[IN_FLIGHT].tolist() == [4, 0]
    assert read.counts[QUEUED].tolist() == [1, 2]
    assert read.latencies[TTFT_P50].tolist() == [9.0, 0.0]


def test_a_tenant_named_twice_counts_once_with_its_later_figures() -> None:
    message = gateway_pb2.DemandReport(
        tenants=[
            common_pb2.TenantDemand(tenant="A", in_flight=1),
            common_pb2.TenantDemand(tenant="B", in_flight=2),
            common_pb2.TenantDemand(tenant="A", in_flight=3),
        ],
        columns=common_pb2.TenantDemandColumns(tenant=["B"], in_flight=[5]),
    )
    read = demand_columns_from_proto(message)
    assert read.tenants == ("A", "B")
    assert read.counts[IN_FLIGHT].tolist() == [3, 5]


def test_columns_turn_back_into_one_message_a_tenant_field_for_field() -> None:
    """For a peer that reads no columns (a hello goes before the control plane says it does)."""
    columns = demand_columns_to_proto(DEMANDS)
    assert demand_messages_of(columns) == [demand_to_proto(d) for d in DEMANDS]
