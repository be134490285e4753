"""Conversions between the services' own figures and the wire API's well-known types.

Times inside the services are float seconds (wall-clock seconds since the Unix epoch from
`Clock.wall`); on the wire they are `google.protobuf.Timestamp`.
"""

from __future__ import annotations

import math

from google.protobuf.timestamp_pb2 import Timestamp

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
