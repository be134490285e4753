"""Conversions between the ground's shapes and the wire API's messages.

Times inside the services are float seconds (wall-clock seconds since the Unix epoch from
`Clock.wall`); on the wire they are `google.protobuf.Timestamp`. A tenant's demand and its latency
summaries (slotshift.demand) have the wire's fields and units (milliseconds), so converting them
copies fields; this module is the only place that does, in both directions.
"""

from __future__ import annotations

import math

from google.protobuf.timestamp_pb2 import Timestamp

from slotshift.demand import LatencySummary, TenantDemand
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


_NO_LATENCY = LatencySummary()
"""A window without samples: immutable, so every such window read from the wire shares it."""


def latency_from_proto(message: common_pb2.LatencySummary) -> LatencySummary:
    """The LatencySummary a wire message stands for; a negative count reads as 0 (unknown)."""
    count, p50_ms, p90_ms, p99_ms = message.count, message.p50_ms, message.p90_ms, message.p99_ms
    if count <= 0:
        # Most windows of a report are empty: sharing one object saves building them, which
        # is a measurable part of reading a report of 1,000 tenants.
        if p50_ms == 0.0 and p90_ms == 0.0 and p99_ms == 0.0:
            return _NO_LATENCY
        count = 0
    return LatencySummary(count, p50_ms, p90_ms, p99_ms)


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


def demand_from_proto(message: common_pb2.TenantDemand) -> TenantDemand:
    """The TenantDemand a wire message stands for. A peer's message is not trusted to keep the
    contract that counts are never negative: a negative count reads as 0."""
    # On the control plane's hot path (every tenant of every report and acknowledgement): each
    # field is read once, clamped inline and passed by position, which costs about half of
    # max() calls and keywords.
    in_flight, queued = message.in_flight, message.queued
    admitted, completed, rejected = (
        message.admitted_total,
        message.completed_total,
        message.rejected_total,
    )
    limit, paused, pauses = message.limit_slots, message.paused, message.pauses_total
    output, waste = message.output_tokens_total, message.waste_tokens_total
    return TenantDemand(
        message.tenant,
        in_flight if in_flight > 0 else 0,
        queued if queued > 0 else 0,
        admitted if admitted > 0 else 0,
        completed if completed > 0 else 0,
        rejected if rejected > 0 else 0,
        limit if limit > 0 else 0,
        latency_from_proto(message.ttft),
        latency_from_proto(message.e2e),
        latency_from_proto(message.queue_wait),
        paused if paused > 0 else 0,
        output if output > 0 else 0,
        waste if waste > 0 else 0,
        pauses if pauses > 0 else 0,
    )
