"""Conversions between the ground's shapes and the wire API's messages.

Times inside the services are float seconds (wall-clock seconds since the Unix epoch from
`Clock.wall`); on the wire they are `google.protobuf.Timestamp`. A tenant's demand and its latency
summaries (slotshift.demand) have the wire's fields and units (milliseconds), so converting them
copies fields; this module is the only place that does, in both directions (and into the
control plane's columns, slotshift/demand_columns.py).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from google.protobuf.timestamp_pb2 import Timestamp

from slotshift.demand import LatencySummary, TenantDemand
from slotshift.demand_columns import COUNTS, LATENCIES, DemandColumns
from slotshift.v1 import common_pb2

_NANOS_PER_S = 1_000_000_000


def to_timestamp(wall_s: float) -> Timestamp:
    """The Timestamp of `wall_s` (seconds since the epoch), to the nearest nanosecond that a
    double holds; nanos always in [0, 1e9), also before the epoch."""
    # Whole seconds apart from the fraction: epoch seconds times 1e9 is past a double's precision.
    seconds = math.floor(wall_s)
    nanos = round((wall_s - seconds) * 1e9)
    if nanos >= _NANOS_PER_S:
        seconds, nanos = seconds + 1, nanos - _NANOS_PER_S
    return Timestamp(seconds=seconds, nanos=nanos)


def from_timestamp(stamp: Timestamp) -> float:
    """The seconds since the epoch that `stamp` stands for (the inverse of to_timestamp())."""
    return stamp.seconds + stamp.nanos / 1e9


def latency_to_proto(summary: LatencySummary) -> common_pb2.LatencySummary:
    """The wire's LatencySummary of `summary` (the same fields, milliseconds both)."""
    return common_pb2.LatencySummary(
        count=summary.count, p50_ms=summary.p50_ms, p90_ms=summary.p90_ms, p99_ms=summary.p99_ms
    )


def demand_to_proto(demand: TenantDemand) -> common_pb2.TenantDemand:
    """The wire's TenantDemand of `demand`, field for field."""
    return common_pb2.TenantDemand(
        tenant=demand.tenant,
        in_flight=demand.in_flight,
        queued=demand.queued,
        admitted_total=demand.admitted_total,
        completed_total=demand.completed_total,
        rejected_total=demand.rejected_total,
        limit_slots=demand.limit_slots,
        ttft=latency_to_proto(demand.ttft),
        e2e=latency_to_proto(demand.e2e),
        queue_wait=latency_to_proto(demand.queue_wait),
        paused=demand.paused,
        output_tokens_total=demand.output_tokens_total,
        waste_tokens_total=demand.waste_tokens_total,
        pauses_total=demand.pauses_total,
    )


def demand_columns_from_proto(messages: Sequence[common_pb2.TenantDemand]) -> DemandColumns:
    """The columns of a report's tenants (DemandColumns.checked: a negative count reads as 0);
    a tenant named twice counts once, with its later figures. Each field is read once, into one
    list per kind, and the lists become arrays in one call each: on the control plane's hot path
    (every tenant of every report and acknowledgement) this is the whole cost of reading."""
    names: list[str] = []
    counts: list[tuple[int, ...]] = []
    latencies: list[tuple[float, ...]] = []
    for m in messages:
        ttft, e2e = m.ttft, m.e2e
        names.append(m.tenant)
        counts.append(
            (
                m.in_flight,
                m.queued,
                m.admitted_total,
                m.completed_total,
                m.rejected_total,
                m.limit_slots,
                m.output_tokens_total,
                m.waste_tokens_total,
                ttft.count,
                e2e.count,
            )
        )
        latencies.append(
            (ttft.p50_ms, ttft.p90_ms, ttft.p99_ms, e2e.p50_ms, e2e.p90_ms, e2e.p99_ms)
        )
    count_rows = np.array(counts, dtype=np.int64).reshape(len(names), COUNTS).T
    latency_rows = np.array(latencies, dtype=np.float64).reshape(len(names), LATENCIES).T
    if len(set(names)) != len(names):
        last = {name: i for i, name in enumerate(names)}
        keep = sorted(last.values())
        names = [names[i] for i in keep]
        count_rows, latency_rows = count_rows[:, keep], latency_rows[:, keep]
    return DemandColumns.checked(tuple(names), count_rows, latency_rows)
