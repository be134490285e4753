"""Wall-clock seconds to and from the wire's Timestamp."""

from __future__ import annotations

import pytest

from slotshift.wire import from_timestamp, to_timestamp


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
