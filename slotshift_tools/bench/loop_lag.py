"""How late the harness's event loop runs: a check that the client kept up with the load.

A client that falls behind stamps chunks late, which inflates TTFT and ITL; on a small machine
the harness shares the CPUs with the whole stack. The probe sleeps a fixed interval again and
again and records how much later than asked it woke.
"""

from __future__ import annotations

import asyncio

from slotshift.clock import Clock
from slotshift_tools.bench.stats import percentile


class LoopLagProbe:
    """Records the event loop's lateness while it runs."""

    def __init__(self, clock: Clock, interval_s: float = 0.05) -> None:
        self._clock = clock
        self._interval_s = interval_s
        self.lags_s: list[float] = []

    async def run(self) -> None:
        """Probe until cancelled."""
        while True:
            due_s = self._clock.monotonic() + self._interval_s
            await asyncio.sleep(self._interval_s)
            self.lags_s.append(max(0.0, self._clock.monotonic() - due_s))

    def summary(self) -> dict[str, float | None]:
        """p50, p99 and the largest lateness, in milliseconds (None before any probe)."""
        if not self.lags_s:
            return {"loop_lag_p50_ms": None, "loop_lag_p99_ms": None, "loop_lag_max_ms": None}
        return {
            "loop_lag_p50_ms": percentile(self.lags_s, 50) * 1000.0,
            "loop_lag_p99_ms": percentile(self.lags_s, 99) * 1000.0,
            "loop_lag_max_ms": max(self.lags_s) * 1000.0,
        }
