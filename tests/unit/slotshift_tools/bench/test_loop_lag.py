"""The event-loop lag probe."""

from __future__ import annotations

import asyncio
import contextlib

import pytest

from slotshift.clock import ManualClock
from slotshift_tools.bench.loop_lag import LoopLagProbe
from tests.support import wait_until


async def test_time_lost_while_the_probe_sleeps_shows_as_lag() -> None:
    clock = ManualClock()
    probe = LoopLagProbe(clock, interval_s=0.001)
    assert probe.summary()["loop_lag_max_ms"] is None
    task = asyncio.create_task(probe.run())
    await wait_until(lambda: len(probe.lags_s) >= 1, message="a first probe")
    # The probe is asleep now, its wake-up due 1 ms after the clock's reading: a stalled loop
    # looks like the clock jumping past it.
    probes = len(probe.lags_s)
    clock.advance(0.5)
    await wait_until(lambda: len(probe.lags_s) > probes, message="the next probe")
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    summary = probe.summary()
    assert summary["loop_lag_max_ms"] == pytest.approx(499.0)
    assert probe.lags_s[0] == 0.0
