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
from itertools import chain
from typing import Any, Protocol, TypeVar

import numpy as np
from google.protobuf.timestamp_pb2 import Timestamp
from numpy.typing import NDArray

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


def demand_columns_to_proto(demands: Sequence[TenantDemand]) -> common_pb2.TenantDemandColumns:
    """The wire's TenantDemandColumns of `demands`, field for field."""
    ttft = [d.ttft for d in demands]
    e2e = [d.e2e for d in demands]
    wait = [d.queue_wait for d in demands]
    return common_pb2.TenantDemandColumns(
        tenant=[d.tenant for d in demands],
        in_flight=[d.in_flight for d in demands],
        queued=[d.queued for d in demands],
        admitted_total=[d.admitted_total for d in demands],
        completed_total=[d.completed_total for d in demands],
        rejected_total=[d.rejected_total for d in demands],
        limit_slots=[d.limit_slots for d in demands],
        ttft_count=[w.count for w in ttft],
        ttft_p50_ms=[w.p50_ms for w in ttft],
        ttft_p90_ms=[w.p90_ms for w in ttft],
        ttft_p99_ms=[w.p99_ms for w in ttft],
        e2e_count=[w.count for w in e2e],
        e2e_p50_ms=[w.p50_ms for w in e2e],
        e2e_p90_ms=[w.p90_ms for w in e2e],
        e2e_p99_ms=[w.p99_ms for w in e2e],
        queue_wait_count=[w.count for w in wait],
        queue_wait_p50_ms=[w.p50_ms for w in wait],
        queue_wait_p90_ms=[w.p90_ms for w in wait],
        queue_wait_p99_ms=[w.p99_ms for w in wait],
        paused=[d.paused for d in demands],
        output_tokens_total=[d.output_tokens_total for d in demands],
        waste_tokens_total=[d.waste_tokens_total for d in demands],
        pauses_total=[d.pauses_total for d in demands],
    )


_WINDOWS = ("ttft", "e2e", "queue_wait")
_WINDOW_PARTS = ("count", "p50_ms", "p90_ms", "p99_ms")


def demand_messages_of(columns: common_pb2.TenantDemandColumns) -> list[common_pb2.TenantDemand]:
    """The columns as one TenantDemand message a tenant (for a peer that reads no columns: a
    hello goes before the control plane says it reads them); a column shorter than `tenant`
    leaves the later tenants' field unset."""
    plain = [
        field.name
        for field in columns.DESCRIPTOR.fields
        if field.name != "tenant" and not field.name.startswith(_WINDOWS)
    ]
    messages = []
    for i, tenant in enumerate(columns.tenant):
        message = common_pb2.TenantDemand(tenant=tenant)
        for name in plain:
            values = getattr(columns, name)
            if i < len(values):
                setattr(message, name, values[i])
        for window in _WINDOWS:
            summary = getattr(message, window)
            for part in _WINDOW_PARTS:
                values = getattr(columns, f"{window}_{part}")
                if i < len(values):
                    setattr(summary, part, values[i])
        messages.append(message)
    return messages


_Value = TypeVar("_Value", int, float)


class FiguresMessage(Protocol):
    """A gateway message that carries tenants' figures: a hello, a report or an ack."""

    @property
    def tenants(self) -> Sequence[common_pb2.TenantDemand]: ...

    @property
    def columns(self) -> common_pb2.TenantDemandColumns: ...


def demand_columns_from_proto(message: FiguresMessage) -> DemandColumns:
    """The figures a gateway message carries, as the control plane holds them
    (DemandColumns.checked: a negative count reads as 0): its `tenants`, then its `columns`; a
    tenant named twice counts once, with its later figures.

    On the control plane's hot path (every report and acknowledgement of every gateway): the
    columns are read a whole field at a time, about four times faster than the same figures
    as TenantDemand messages, whose fields are read one tenant at a time."""
    columns = message.columns
    names = list(columns.tenant)
    size = len(names)
    count_rows: NDArray[np.int64] = np.zeros((COUNTS, 0), dtype=np.int64)
    latency_rows: NDArray[np.float64] = np.zeros((LATENCIES, 0), dtype=np.float64)
    if size:
        counts = (
            columns.in_flight,
            columns.queued,
            columns.admitted_total,
            columns.completed_total,
            columns.rejected_total,
            columns.limit_slots,
            columns.output_tokens_total,
            columns.waste_tokens_total,
            columns.ttft_count,
            columns.e2e_count,
        )
        latencies = (
            columns.ttft_p50_ms,
            columns.ttft_p90_ms,
            columns.ttft_p99_ms,
            columns.e2e_p50_ms,
            columns.e2e_p90_ms,
            columns.e2e_p99_ms,
        )
        count_rows = _rows(counts, size, np.int64)
        latency_rows = _rows(latencies, size, np.float64)
    if message.tenants:
        # Figures sent as one TenantDemand message each (a gateway from before the columns).
        older = DemandColumns.of(message.tenants)
        names = list(older.tenants) + names
        count_rows = np.concatenate((older.counts, count_rows), axis=1)
        latency_rows = np.concatenate((older.latencies, latency_rows), axis=1)
    if len(set(names)) != len(names):
        last = {name: i for i, name in enumerate(names)}
        keep = sorted(last.values())
        names = [names[i] for i in keep]
        count_rows, latency_rows = count_rows[:, keep], latency_rows[:, keep]
    return DemandColumns.checked(tuple(names), count_rows, latency_rows)


_FEW_TENANTS = 64
"""Up to this many tenants a message's columns are read in one pass over their values; more
are converted a field at a time (NumPy reads a long field faster, but costs more per call)."""


def _rows(fields: Sequence[Sequence[_Value]], size: int, dtype: type[np.generic]) -> NDArray[Any]:
    """A peer's columns as one row each of `size` values (`_sized`). Most reports and
    acknowledgements name a few tenants: for them one pass over every value costs about half
    what a NumPy conversion per field does."""
    if size > _FEW_TENANTS:
        return np.array([_sized(field, size) for field in fields], dtype=dtype)
    values = chain.from_iterable(_sized(field, size) for field in fields)
    return np.fromiter(values, dtype=dtype, count=len(fields) * size).reshape(len(fields), size)


def _sized(field: Sequence[_Value], size: int) -> Sequence[_Value]:
    """A peer's column as `size` values: itself, or cut, or with zeros for the tenants it
    misses (an empty one: a figure the peer does not send)."""
    if len(field) == size:
        return field
    if not field:
        return [0] * size
    values = list(field)[:size]
    return values + [0] * (size - len(values))
